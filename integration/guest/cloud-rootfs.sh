# shellcheck shell=bash
# Sourced by cloud.sh: configures the debootstrapped root filesystem of the
# cloud test guest, without chroot, and installs the kernel's modules in it.
# Uses log and die (lib.sh) and cloud.sh's ROOT_LABEL and WORK.

# MODULES_EXCLUDE matches, in modules.dep's paths, the module trees a QEMU
# virtual machine has no use for: sound, GPUs, media, wireless, physical
# NICs, USB, HBAs and other hardware. A kept module that needs one of them
# brings it along.
MODULES_EXCLUDE='^kernel/(sound|lib/test_|drivers/(gpu|media|infiniband|net/(wireless|ethernet|usb|can|wwan|ieee802154|hamradio|arcnet|wan|fddi|plip|slip)|staging|iio|isdn|bluetooth|mtd|thunderbolt|mmc|hwmon|video|usb|hid|scsi/[^/]+/|target|comedi|platform|spi|i2c|gnss|ntb|fpga|leds|power|rtc|nfc|memstick|pcmcia|ssb|bcma|w1|extcon|mfd|regulator|pinctrl|gpio|dma|edac|atm|fsi|mcb|parport|firewire|counter|misc/mei|input/(touchscreen|joystick|tablet))/|net/(bluetooth|mac80211|wireless|nfc|rds|can|ieee802154|mac802154|atm|6lowpan)/)'

# install_modules MODDIR ROOTFS KVER copies the modules of MODDIR (a kernel
# module tree with a modules.dep) not matched by MODULES_EXCLUDE, with
# everything they depend on, into ROOTFS's /lib/modules/KVER and runs depmod
# there, so udev and the kernel's module requests (9p, vfat for the
# cloud-init seed, netfilter, ...) find them.
install_modules() {
	local moddir=$1 rootfs=$2 kver=$3 dest f
	[ -L "$rootfs/lib" ] && [ "$(readlink "$rootfs/lib")" != usr/lib ] &&
		die "$rootfs/lib links to $(readlink "$rootfs/lib"), not usr/lib"
	dest=$rootfs/lib/modules/$kver
	mkdir -p "$dest"
	awk -F: -v ex="$MODULES_EXCLUDE" '
		NR == FNR { if ($1 !~ ex) keep[$1] = 1; next }
		$1 in keep { print $1; n = split($2, d, " "); for (i = 1; i <= n; i++) print d[i] }
	' "$moddir/modules.dep" "$moddir/modules.dep" | LC_ALL=C sort -u >"$WORK/modules.list"
	(cd "$moddir" && tar -c -T "$WORK/modules.list") | tar -x -C "$dest"
	for f in modules.order modules.builtin modules.builtin.modinfo; do
		[ -f "$moddir/$f" ] && cp "$moddir/$f" "$dest/"
	done
	depmod -b "$rootfs" "$kver"
	log "installed $(wc -l <"$WORK/modules.list") of $(wc -l <"$moddir/modules.dep") modules ($(du -sm "$dest" | cut -f1) MiB)"
}

# mask ROOTFS UNIT... masks systemd units (a link to /dev/null in /etc).
mask() {
	local rootfs=$1 u
	shift
	for u in "$@"; do
		rm -f "$rootfs"/etc/systemd/system/*.wants/"$u"
		ln -sfn /dev/null "$rootfs/etc/systemd/system/$u"
	done
}

# configure_rootfs ROOTFS makes the debootstrapped tree a cloud image:
# NoCloud seeds, cloud-init's output and final message on the console, a
# fresh identity on first boot, a locked root account, no periodic jobs
# that cost minutes of emulated CPU, and no documentation.
configure_rootfs() {
	local r=$1 d
	[ -d "$r/etc/cloud/cloud.cfg.d" ] || die "$r has no cloud-init"

	cat >"$r/etc/cloud/cloud.cfg.d/90_vmshim.cfg" <<-'EOF'
		# vmshim attaches a NoCloud seed (a disk labelled cidata); with none,
		# the guest boots on with defaults.
		datasource_list: [NoCloud, None]
		# What cloud-init and the commands it runs print goes to the console
		# (ttyS0, the pod's log) as it is, and to the journal and a log file.
		output: {all: '| tee -a /var/log/cloud-init-output.log /dev/console'}
		final_message: "VMSHIM-CLOUD-INIT-DONE cloud-init $version, datasource $datasource, up $uptime seconds"
		# The hostname from the meta-data resolves locally.
		manage_etc_hosts: true
		# No GRUB here: the disk boots with syslinux.
		grub_dpkg: {enabled: false}
		# Host keys every OpenSSH client of the last ten years takes. No RSA:
		# generating a 3072-bit key takes 15-20 s of emulated CPU; no DSA,
		# which OpenSSH 9 refuses anyway.
		ssh_genkeytypes: [ed25519, ecdsa]
	EOF
	# The services' own output goes to the journal only: the console gets
	# it through tee above, without the journal's "[uptime] unit[pid]:"
	# prefix, so lines printed by user commands start lines on the console.
	for d in cloud-init-local cloud-init cloud-config cloud-final; do
		mkdir -p "$r/etc/systemd/system/$d.service.d"
		printf '[Service]\nStandardOutput=journal\n' >"$r/etc/systemd/system/$d.service.d/vmshim-console.conf"
	done
	# C.UTF-8 is built into glibc: cloud-init's locale module then has no
	# locale to generate (en_US.UTF-8 takes many seconds under TCG).
	echo 'LANG=C.UTF-8' >"$r/etc/default/locale"

	cat >"$r/etc/fstab" <<-EOF
		LABEL=$ROOT_LABEL / ext4 errors=remount-ro 0 1
	EOF
	# First boot: systemd makes a machine ID, cloud-init sets the hostname
	# and makes SSH host keys, dhclient writes resolv.conf.
	: >"$r/etc/machine-id"
	rm -f "$r/var/lib/dbus/machine-id" "$r"/etc/ssh/ssh_host_*_key "$r"/etc/ssh/ssh_host_*_key.pub \
		"$r/etc/resolv.conf"
	echo localhost >"$r/etc/hostname"
	sed -i 's/^root:[^:]*:/root:*:/' "$r/etc/shadow"

	# Periodic jobs that would cost minutes of emulated CPU, and the
	# interactive first-boot questions, which nobody answers.
	mask "$r" apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer \
		e2scrub_reap.service fstrim.timer man-db.timer systemd-firstboot.service
	# No virtual terminal: the console is ttyS0, where systemd starts a
	# serial getty by itself. Its prompt has no newline, so the next line
	# on the console follows it; it comes before cloud-final starts
	# (multi-user.target orders them), so what user commands print is not
	# joined to it.
	rm -f "$r/etc/systemd/system/getty.target.wants/getty@tty1.service"

	# No documentation, now or from packages installed later (as Debian's
	# and Ubuntu's minimal images); copyright files stay.
	mkdir -p "$r/etc/dpkg/dpkg.cfg.d"
	cat >"$r/etc/dpkg/dpkg.cfg.d/01-vmshim-nodoc" <<-'EOF'
		path-exclude=/usr/share/doc/*
		path-include=/usr/share/doc/*/copyright
		path-exclude=/usr/share/man/*
		path-exclude=/usr/share/info/*
		path-exclude=/usr/share/locale/*
		path-include=/usr/share/locale/locale.alias
		path-exclude=/usr/share/lintian/*
	EOF
	find "$r/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
	find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete
	for d in man info lintian; do
		rm -rf "${r:?}/usr/share/$d"/*
	done
	find "$r/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
	rm -rf "$r"/var/log/*.log "$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old
}
