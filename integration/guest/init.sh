#!/bin/sh
# /init of the vmshim test guest: busybox sh as PID 1 in an initramfs.
#
# Markers on the console (ttyS0), one per line:
#   VMSHIM-DISKS <disk>...         the block devices, each name:sectors[:ro]
#                                  (512-byte sectors; ro when read-only), sorted
#                                  by name, ram*, loop* and zram* left out; "-"
#                                  when there are none (before BOOTED)
#   VMSHIM-CMDLINE <cmdline>       the kernel command line, /proc/cmdline (before
#                                  BOOTED)
#   VMSHIM-EFI secureboot=<1|0|unknown>
#                                  on an EFI boot only (none on a BIOS boot):
#                                  the SecureBoot EFI variable, unknown when it
#                                  is missing (before BOOTED)
#   VMSHIM-TPM version=<2|1.2|unknown> pcr7=<hex|none>
#                                  only when the kernel sees a TPM (nothing
#                                  without one): its major version and PCR 7
#                                  of the SHA-256 bank in lowercase hex, none
#                                  without that bank (before BOOTED)
#   VMSHIM-DISK-BOOTS <n>          on a disk boot, how many boots the boot disk
#                                  saw before this one (before BOOTED)
#   VMSHIM-AGENT-STARTED           qemu-ga runs on the virtio-serial port
#                                  org.qemu.guest_agent.0 (only in guests that
#                                  carry /usr/sbin/qemu-ga; before BOOTED)
#   VMSHIM-GUEST-BOOTED            userspace is up and the handlers below are armed
#   VMSHIM-GUEST-UPTIME <seconds>  first field of /proc/uptime at that moment
#   VMSHIM-ECHO: <line>            answer to each line read from the console
#   VMSHIM-GUEST-ACPI-POWERDOWN    the ACPI power button was pressed; powering off
#   VMSHIM-GUEST-POWEROFF          powering off on its own (mode poweroff, or a
#                                  "poweroff" line on the console)
#   VMSHIM-GUEST-PANIC             crashing the kernel on purpose (mode panic):
#                                  the pvpanic device then tells QEMU
#   VMSHIM-ROUTES if=IF <routes>   the routes a lease left (mode router-only,
#                                  printed by udhcpc.sh after VMSHIM-LEASE)
# and, with a virtio NIC (udhcpc and udhcpc6 run on every eth* interface;
# udhcpc's event script /etc/udhcpc/default.script prints VMSHIM-LEASE and
# VMSHIM-RENEW, udhcpc6's /etc/udhcpc6/default.script VMSHIM-LEASE6 and
# VMSHIM-RENEW6, each whenever its lease comes or is renewed):
#   VMSHIM-LEASE if=IF ip=IP mask=LEN router=GW mtu=MTU dns=A,B search=D,E hostname=H routes=R
#   VMSHIM-RENEW if=IF ip=IP
#   VMSHIM-LEASE6 if=IF ip=ADDR dns=A,B search=D,E
#                                  a DHCPv6 lease: ADDR/128 is on IF and past
#                                  duplicate address detection (- for an
#                                  empty field; addresses as RFC 5952 writes
#                                  them); independent of VMSHIM-LEASE, before
#                                  or after it
#   VMSHIM-RENEW6 if=IF ip=ADDR    the DHCPv6 lease was renewed
#   VMSHIM-LINK-UP if=IF           IF lost its carrier and has it again: udhcpc
#                                  gives its lease up and asks for one afresh
#                                  (a VMSHIM-LEASE follows), udhcpc6 starts
#                                  again (and a VMSHIM-LEASE6)
#   VMSHIM-HTTP-READY              httpd serves VMSHIM-HTTP-OK <hostname> <ip> on :8080
#   VMSHIM-GATEWAY-OK <gw>         the first lease's gateway answers ping
#   VMSHIM-GATEWAY-FAIL <gw>       ... or does not (- when the lease has none)
#   VMSHIM-PEER-OK <body>          http://PEER:8080/ answered (vmshim.test.peer=PEER)
#   VMSHIM-PEER-FAIL <peer>        ... or did not within 60 tries
#
# Lines starting VMSHIM-GUEST-WARNING: say what did not work (a module, the
# power button, reading the TPM's PCR 7, httpd, the agent's port, qemu-ga
# itself, or a DHCPv6 address the interface could not have or that failed
# duplicate address detection).
#
# The mode comes from /etc/vmshim-mode (baked into the initramfs), overridden
# by vmshim.mode=wait|poweroff|panic|router-only on the kernel command line.
# Mode router-only is mode wait with a DHCP client that, like busybox's usual
# default.script and several appliance OSes, neither asks for nor applies
# the classless static routes (option 121): only the router option (3).
export PATH=/bin

mount -t devtmpfs devtmpfs /dev
mount -t proc proc /proc
mount -t sysfs sysfs /sys
# Ptys, for util-linux's script (terminal execs) where the guest has it.
mkdir -p /dev/pts
mount -t devpts -o ptmxmode=0666 devpts /dev/pts
# Keep later kernel messages (module loading, ...) off the console so they
# cannot split a marker line. Boot messages before this point are kept.
echo 1 >/proc/sys/kernel/printk

# flush_console waits until everything written to the console has left the
# UART: busybox stty sets the (unchanged) mode with TCSADRAIN.
flush_console() {
	stty -echo </dev/console 2>/dev/null
}

power_off() {
	flush_console
	sync
	poweroff -f
}

# load_modules inserts the modules listed in /lib/modules/order, dependencies
# first (the ACPI button driver, evdev, the pvpanic driver, the virtio NIC
# driver, the virtio-blk, virtio-scsi and NVMe disk drivers, the AHCI, IDE
# and CD-ROM drivers and the e1000, e1000e and RTL8139 NIC drivers, unless
# built in).
load_modules() {
	[ -f /lib/modules/order ] || return 0
	while read -r m; do
		insmod "/lib/modules/$m" || echo "VMSHIM-GUEST-WARNING: insmod $m failed"
	done </lib/modules/order
}

# storage_devices prints the sysfs paths of the PCI devices the disk drivers
# drive: virtio-blk and virtio-scsi (vendor 0x1af4, transitional and modern
# device ids) and NVMe controllers (class 0x010802). AHCI and IDE
# controllers are not waited for: libata probes their ports before insmod
# returns (the kernel waits for a module's async work), so their disks are
# there already, and q35's own AHCI controller, usually empty, would cost
# every boot the whole wait.
storage_devices() {
	for d in /sys/bus/pci/devices/*; do
		[ -e "$d/class" ] || continue
		read -r vendor <"$d/vendor"
		read -r device <"$d/device"
		read -r class <"$d/class"
		case $vendor:$device:$class in
		0x1af4:0x1001:* | 0x1af4:0x1042:* | 0x1af4:0x1004:* | 0x1af4:0x1048:* | *:*:0x010802)
			readlink -f "$d"
			;;
		esac
	done
}

# wait_disks waits, 3 s at most, until each storage device has a block
# device under it: SCSI and NVMe find their disks asynchronously, after
# insmod returns. Without such a device it returns at once.
wait_disks() {
	devices=$(storage_devices)
	[ -n "$devices" ] || return 0
	for _ in $(seq 30); do
		missing=
		for dev in $devices; do
			found=
			for b in /sys/block/*; do
				case $(readlink -f "$b") in
				"$dev"/*)
					found=1
					break
					;;
				esac
			done
			[ -n "$found" ] || missing=$dev
		done
		[ -n "$missing" ] || return 0
		sleep 0.1
	done
}

# report_disks prints VMSHIM-DISKS: every block device but ram*, loop* and
# zram* as name:sectors, with :ro when read-only, sorted ("-" for none).
report_disks() {
	disks=
	for b in /sys/block/*; do
		[ -f "$b/size" ] || continue
		name=${b##*/}
		case $name in ram* | loop* | zram*) continue ;; esac
		disk=$name:$(cat "$b/size")
		[ "$(cat "$b/ro" 2>/dev/null)" != 1 ] || disk=$disk:ro
		disks="$disks $disk"
	done
	echo "VMSHIM-DISKS${disks:- -}"
}

# report_efi prints VMSHIM-EFI on an EFI boot (/sys/firmware/efi exists),
# nothing on a BIOS boot: it loads efivarfs (from its own module list, as
# it refuses to load without EFI), mounts it and reads the SecureBoot
# variable of the EFI global variable GUID: 4 bytes of attributes, then
# the value, 1 when the firmware enforces Secure Boot.
report_efi() {
	[ -d /sys/firmware/efi ] || return 0
	if [ -f /lib/modules/efi-order ]; then
		while read -r m; do
			insmod "/lib/modules/$m" || echo "VMSHIM-GUEST-WARNING: insmod $m failed"
		done </lib/modules/efi-order
	fi
	efivars=/sys/firmware/efi/efivars
	mount -t efivarfs efivarfs "$efivars" 2>/dev/null ||
		echo "VMSHIM-GUEST-WARNING: cannot mount efivarfs on $efivars"
	# efivarfs files cannot seek: read the whole variable (5 bytes).
	# shellcheck disable=SC2046 # one word per byte
	set -- $(od -An -tu1 "$efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c" 2>/dev/null)
	echo "VMSHIM-EFI secureboot=${5:-unknown}"
}

# report_tpm prints VMSHIM-TPM when the kernel sees a TPM (the Debian
# kernel has the TPM core, tpm_crb and tpm_tis built in), nothing without
# one, so a guest without a TPM prints what it always did. PCR 7 holds the
# firmware's Secure Boot measurements (the policy and the keys it
# verified with), so it tells an EFI boot with Secure Boot on from one
# with it off. The kernel prints the PCR in uppercase hex; it is
# lowercased here, as sha256sum and most tools print hashes. The kernel
# reads the PCR from the TPM once per open of the file and serves the
# whole line (65 bytes) from that, whatever size the reads are.
report_tpm() {
	tpm=/sys/class/tpm/tpm0
	[ -e "$tpm" ] || return 0
	case $(cat "$tpm/tpm_version_major" 2>/dev/null) in
	2) version=2 ;;
	1) version=1.2 ;;
	*) version=unknown ;;
	esac
	pcr7=none
	if [ -e "$tpm/pcr-sha256/7" ]; then
		if read -r pcr7 <"$tpm/pcr-sha256/7" && [ -n "$pcr7" ]; then
			pcr7=$(echo "$pcr7" | tr A-F a-f)
		else
			echo "VMSHIM-GUEST-WARNING: cannot read $tpm/pcr-sha256/7"
			pcr7=none
		fi
	fi
	echo "VMSHIM-TPM version=$version pcr7=$pcr7"
}

# count_boots prints VMSHIM-DISK-BOOTS: how many boots the boot disk saw
# before this one, as its sector 100 (in the gap before the partition at
# 1 MiB; on a GPT disk, past the partition entries in LBA 2-33) counts
# them, and counts this one. Only disk boots count (the disk's boot line
# says vmshim.bootdisk): a disk kept on a volume counts on, an overlay
# made anew each boot starts from 0.
count_boots() {
	grep -q vmshim.bootdisk /proc/cmdline || return 0
	part=$(findfs LABEL=VMSHIM 2>/dev/null) || {
		echo "VMSHIM-GUEST-WARNING: no partition labelled VMSHIM to count boots on"
		return 0
	}
	disk=${part%1}
	n=$(dd if="$disk" bs=512 skip=100 count=1 2>/dev/null | tr -dc 0-9 | head -c 9)
	echo "VMSHIM-DISK-BOOTS ${n:-0}"
	# fsync, not sync: only an fsync of the device flushes its write
	# cache, which holds QEMU's qcow2 metadata of the write.
	printf '%-511s\n' "$((${n:-0} + 1))" | dd of="$disk" bs=512 seek=100 count=1 conv=notrunc,fsync 2>/dev/null
}

# arm_power_button starts one reader per "Power Button" input device. Each
# blocks until the device reports an event (QEMU system_powerdown), then
# powers the guest off. The device is opened here, before BOOTED is printed,
# so no press after BOOTED can be missed.
arm_power_button() {
	armed=0
	for dev in /sys/class/input/input*; do
		[ "$(cat "$dev/name" 2>/dev/null)" = "Power Button" ] || continue
		for ev in "$dev"/event*; do
			[ -f "$ev/dev" ] || continue
			node=/dev/input/${ev##*/}
			if [ ! -c "$node" ]; then
				mkdir -p /dev/input
				IFS=: read -r major minor <"$ev/dev"
				mknod "$node" c "$major" "$minor"
			fi
			exec 3<"$node"
			# One struct input_event is 24 bytes on x86-64.
			{
				dd bs=24 count=1 of=/dev/null 2>/dev/null
				echo VMSHIM-GUEST-ACPI-POWERDOWN
				power_off
			} <&3 &
			exec 3<&-
			armed=$((armed + 1))
		done
	done
	[ "$armed" -gt 0 ] || echo "VMSHIM-GUEST-WARNING: no power button input device"
}

# start_agent starts qemu-ga on the virtio-serial port named
# org.qemu.guest_agent.0, linked as /dev/virtio-ports/org.qemu.guest_agent.0
# as udev would, and prints VMSHIM-AGENT-STARTED once qemu-ga holds the
# port open (its libraries loaded, ready for the host's commands). The
# host names the port in a control message after virtio_console binds, so
# the port is waited for (5 s at most) if a virtio-serial device is bound.
# Guest-exec'd commands inherit PATH=/bin.
start_agent() {
	agent_port=org.qemu.guest_agent.0
	port=
	if ls -d /sys/bus/virtio/drivers/virtio_console/virtio* >/dev/null 2>&1; then
		for _ in $(seq 50); do
			for p in /sys/class/virtio-ports/vport*; do
				if [ "$(cat "$p/name" 2>/dev/null)" = "$agent_port" ]; then
					port=${p##*/}
					break 2
				fi
			done
			sleep 0.1
		done
	fi
	if [ -z "$port" ]; then
		echo "VMSHIM-GUEST-WARNING: no virtio-serial port $agent_port; qemu-ga not started"
		return
	fi
	if [ ! -c "/dev/$port" ]; then
		IFS=: read -r major minor <"/sys/class/virtio-ports/$port/dev"
		mknod "/dev/$port" c "$major" "$minor"
	fi
	mkdir -p /dev/virtio-ports /run/qemu-ga
	ln -sf "../$port" "/dev/virtio-ports/$agent_port"
	# stderr is kept in /run/qemu-ga/stderr, to explain an early exit.
	/usr/sbin/qemu-ga -m virtio-serial -p "/dev/virtio-ports/$agent_port" -t /run/qemu-ga \
		</dev/null >/dev/null 2>/run/qemu-ga/stderr &
	agent_pid=$!
	for _ in $(seq 100); do
		for fd in /proc/"$agent_pid"/fd/*; do
			if [ "$(readlink "$fd" 2>/dev/null)" = "/dev/$port" ]; then
				echo VMSHIM-AGENT-STARTED
				return
			fi
		done
		if ! kill -0 "$agent_pid" 2>/dev/null; then
			echo "VMSHIM-GUEST-WARNING: qemu-ga exited: $(head -c 200 /run/qemu-ga/stderr | tr '\n' ' ')"
			return
		fi
		sleep 0.05
	done
	echo "VMSHIM-GUEST-WARNING: qemu-ga did not open /dev/$port in 5 s"
}

# echo_console answers every console line; "poweroff" powers off.
echo_console() {
	while :; do
		while IFS= read -r line; do
			echo "VMSHIM-ECHO: $line"
			if [ "$line" = poweroff ]; then
				echo VMSHIM-GUEST-POWEROFF
				power_off
			fi
		done </dev/console
		sleep 1 # end of input (^D): read again
	done
}

# dhcp_on_uevent runs (from uevent, and once for each NIC already there)
# with a kernel uevent's environment. For a new eth* interface it brings the
# link up and starts udhcpc, once per interface: 20 discovers 1 s apart, then
# more every 3 s in the background until a lease comes; it stays to renew.
# Once the link has carrier, a watcher checks every second whether it lost
# and regained it since (carrier_changes): the guest may be on another
# network then (a resumed guest in a new pod, whose link the shim takes
# down and up), so, as systemd-networkd and NetworkManager do, udhcpc
# lets its lease go (SIGUSR2) and asks afresh (SIGUSR1), udhcpc6 is ended
# (SIGTERM) for the loop below to start it again (its script then takes
# the old address away and gives the new lease's), and the watcher prints
# VMSHIM-LINK-UP.
# udhcpc asks for option 121 unless VMSHIM_DHCP is router-only; udhcpc.sh
# then ignores it too.
#
# Then, in the background, udhcpc6 (DHCPv6, stateful: IA_NA, with the DNS
# servers and search list) on the same interface: 5 solicits 1 s apart, then
# after a 10 s pause 5 more, and so on for ever until a lease comes; it stays
# to renew. An IPv4-only link costs 5 small packets every 15 s, and neither
# client waits for the other. udhcpc6 sends from the interface's link-local
# address and exits without one, which the kernel only adds once the link
# has carrier: it is started once there is one (checked every 0.5 s, then
# every 5 s after 10 s), and again, the same way, should it exit, for as
# long as the interface exists. The kernel handles the router
# advertisements (on-link prefix, default route) itself.
dhcp_on_uevent='
case $ACTION/$SUBSYSTEM/$INTERFACE in
add/net/eth*)
	mkdir "/run/vmshim/udhcpc.$INTERFACE" 2>/dev/null || exit 0
	ip link set dev "$INTERFACE" up
	routes="-O staticroutes"
	[ "$VMSHIM_DHCP" != router-only ] || routes=
	udhcpc -i "$INTERFACE" -s /etc/udhcpc/default.script -t 20 -T 1 -A 3 -b \
		-p "/run/vmshim/udhcpc.$INTERFACE/pid" $routes -O mtu -O search >/dev/null 2>&1 </dev/null &
	(
		sys=/sys/class/net/$INTERFACE
		until [ "$(cat "$sys/carrier" 2>/dev/null)" = 1 ]; do
			[ -e "$sys" ] || exit 0
			sleep 0.5
		done
		seen=$(cat "$sys/carrier_changes")
		while now=$(cat "$sys/carrier_changes" 2>/dev/null); do
			if [ "$now" != "$seen" ] && [ "$(cat "$sys/carrier")" = 1 ]; then
				seen=$now
				echo "VMSHIM-LINK-UP if=$INTERFACE" >/dev/console
				pid=$(cat "/run/vmshim/udhcpc.$INTERFACE/pid")
				kill -USR2 "$pid" && kill -USR1 "$pid"
				pid=$(cat "/run/vmshim/udhcpc.$INTERFACE/pid6" 2>/dev/null) && kill "$pid"
			fi
			sleep 1
		done
	) >/dev/null 2>&1 </dev/null &
	[ -x /bin/udhcpc6 ] || exit 0
	(
		tries=0
		while [ -e "/sys/class/net/$INTERFACE" ]; do
			if ip -6 addr show dev "$INTERFACE" scope link | grep -q inet6; then
				udhcpc6 -i "$INTERFACE" -s /etc/udhcpc6/default.script -f -t 5 -T 1 -A 10 \
					-p "/run/vmshim/udhcpc.$INTERFACE/pid6" -O dns -O search
				tries=0
			fi
			tries=$((tries + 1))
			if [ $tries -le 20 ]; then sleep 0.5; else sleep 5; fi
		done
	) >/dev/null 2>&1 </dev/null &
	;;
esac'

# serve_http starts httpd on port 8080 with a page naming the guest, and
# prints VMSHIM-HTTP-READY once it listens.
serve_http() {
	mkdir -p /www
	echo "VMSHIM-HTTP-OK $1 $2" >/www/index.html
	httpd -f -p 8080 -h /www >/dev/null 2>&1 </dev/null &
	for _ in $(seq 100); do
		if netstat -ltn 2>/dev/null | grep -q ':8080 '; then
			echo VMSHIM-HTTP-READY
			return
		fi
		sleep 0.1
	done
	echo "VMSHIM-GUEST-WARNING: httpd does not listen on port 8080"
}

# check_gateway pings the gateway, up to five times.
check_gateway() {
	if [ "$1" != - ]; then
		for _ in 1 2 3 4 5; do
			if ping -c 1 -W 3 "$1" >/dev/null 2>&1; then
				echo "VMSHIM-GATEWAY-OK $1"
				return
			fi
			sleep 1
		done
	fi
	echo "VMSHIM-GATEWAY-FAIL $1"
}

# check_peer fetches http://PEER:8080/ up to 60 times, 1 s apart, and prints
# the body on one line. Debian's busybox wget lacks -T (it crashes on it
# before 1.36.1-5), so timeout bounds each try to 3 s.
check_peer() {
	for _ in $(seq 60); do
		body=$(timeout 3 wget -q -O - "http://$1:8080/" 2>/dev/null | tr '\r\n' '  ' | sed 's/ *$//')
		if [ -n "$body" ]; then
			echo "VMSHIM-PEER-OK $body"
			return
		fi
		sleep 1
	done
	echo "VMSHIM-PEER-FAIL $1"
}

# network starts DHCP on every NIC, now and as NICs appear (uevent blocks
# until the kernel reports a device, so an idle guest stays idle), waits for
# the first lease (udhcpc.sh writes "IF IP GATEWAY HOSTNAME" to the fifo,
# which fd 3 keeps open so nothing written is lost), then runs the checks.
network() {
	mkdir -p /run/vmshim
	mkfifo /run/vmshim/leases
	exec 3<>/run/vmshim/leases
	uevent sh -c "$dhcp_on_uevent" >/dev/null 2>&1 </dev/null 3<&- &
	for dev in /sys/class/net/eth*; do
		[ -e "$dev" ] || continue
		ACTION=add SUBSYSTEM=net INTERFACE=${dev##*/} sh -c "$dhcp_on_uevent" 3<&-
	done
	read -r _ ip gw host <&3
	exec 3<&-
	serve_http "$host" "$ip"
	check_gateway "$gw"
	[ -z "$peer" ] || check_peer "$peer"
}

mode=$(cat /etc/vmshim-mode 2>/dev/null || echo wait)
peer=
for arg in $(cat /proc/cmdline); do
	case $arg in
	vmshim.mode=*) mode=${arg#vmshim.mode=} ;;
	vmshim.test.peer=*) peer=${arg#vmshim.test.peer=} ;;
	esac
done

# udhcpc and its script inherit the choice of DHCP options.
[ "$mode" != router-only ] || export VMSHIM_DHCP=router-only

load_modules
wait_disks
report_disks
echo "VMSHIM-CMDLINE $(cat /proc/cmdline)"
report_efi
report_tpm
count_boots
arm_power_button
[ ! -x /usr/sbin/qemu-ga ] || start_agent
# No local echo: the console shows only what the guest writes.
stty -echo </dev/console 2>/dev/null
echo_console &

echo VMSHIM-GUEST-BOOTED
read -r up _ </proc/uptime
echo "VMSHIM-GUEST-UPTIME $up"

# Only markers reach the console: the shell's own messages (a killed
# child, ...) go to /dev/null.
network 2>/dev/null &

if [ "$mode" = poweroff ]; then
	echo VMSHIM-GUEST-POWEROFF
	power_off
fi

# A crash through sysrq (the trigger file works whatever kernel.sysrq
# allows): the kernel panics and the pvpanic driver reports it to QEMU.
if [ "$mode" = panic ]; then
	echo VMSHIM-GUEST-PANIC
	flush_console
	echo c >/proc/sysrq-trigger
fi

# PID 1 must never exit.
while :; do
	sleep 3600
done
