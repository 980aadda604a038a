#!/bin/sh
# /init of the vmshim test guest: busybox sh as PID 1 in an initramfs.
#
# Markers on the console (ttyS0), one per line:
#   VMSHIM-GUEST-BOOTED            userspace is up and the handlers below are armed
#   VMSHIM-GUEST-UPTIME <seconds>  first field of /proc/uptime at that moment
#   VMSHIM-ECHO: <line>            answer to each line read from the console
#   VMSHIM-GUEST-ACPI-POWERDOWN    the ACPI power button was pressed; powering off
#   VMSHIM-GUEST-POWEROFF          powering off on its own (mode poweroff, or a
#                                  "poweroff" line on the console)
#
# The mode comes from /etc/vmshim-mode (baked into the initramfs), overridden
# by vmshim.mode=wait|poweroff on the kernel command line.
export PATH=/bin

mount -t devtmpfs devtmpfs /dev
mount -t proc proc /proc
mount -t sysfs sysfs /sys
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
# first (the ACPI button driver and evdev, unless built in).
load_modules() {
	[ -f /lib/modules/order ] || return 0
	while read -r m; do
		insmod "/lib/modules/$m" || echo "VMSHIM-GUEST-WARNING: insmod $m failed"
	done </lib/modules/order
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

mode=$(cat /etc/vmshim-mode 2>/dev/null || echo wait)
for arg in $(cat /proc/cmdline); do
	case $arg in
	vmshim.mode=*) mode=${arg#vmshim.mode=} ;;
	esac
done

load_modules
arm_power_button
# No local echo: the console shows only what the guest writes.
stty -echo </dev/console 2>/dev/null
echo_console &

echo VMSHIM-GUEST-BOOTED
read -r up _ </proc/uptime
echo "VMSHIM-GUEST-UPTIME $up"

if [ "$mode" = poweroff ]; then
	echo VMSHIM-GUEST-POWEROFF
	power_off
fi

# PID 1 must never exit.
while :; do
	sleep 3600
done
