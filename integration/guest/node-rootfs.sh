# shellcheck shell=bash
# Sourced by node.sh: configures the debootstrapped root filesystem of the
# node guest, without chroot. Uses die (lib.sh), mask (cloud-rootfs.sh) and
# cloud.sh's ROOT_LABEL.

# NODE_HOSTNAME is the node's host name.
NODE_HOSTNAME=vmshim-node

# NODE_MODULES are loaded at boot: containerd's overlayfs snapshotter and
# the 9p share the runner mounts.
NODE_MODULES=(overlay 9p 9pnet_virtio)

# configure_node ROOTFS makes the debootstrapped tree a node: systemd on the
# unified cgroup hierarchy (the kernel command line says so too), a root
# filesystem found by label, a fresh machine ID on every boot of the image,
# no KVM, a volatile journal, a locked root account, and no periodic jobs that cost
# minutes of emulated CPU. containerd, the shim and their configuration come
# at run time.
configure_node() {
	local r=$1 p
	for p in usr/bin/qemu-system-x86_64 usr/bin/qemu-img usr/bin/prlimit usr/sbin/qemu-ga \
		usr/bin/systemctl usr/bin/dbus-daemon sbin/ip; do
		[ -x "$r/$p" ] || die "$r has no /$p"
	done

	cat >"$r/etc/fstab" <<-EOF
		LABEL=$ROOT_LABEL / ext4 errors=remount-ro 0 1
	EOF
	: >"$r/etc/machine-id"
	rm -f "$r/var/lib/dbus/machine-id" "$r/etc/resolv.conf"
	echo "$NODE_HOSTNAME" >"$r/etc/hostname"
	printf '127.0.0.1 localhost\n127.0.1.1 %s\n::1 localhost ip6-localhost ip6-loopback\n' "$NODE_HOSTNAME" >"$r/etc/hosts"
	sed -i 's/^root:[^:]*:/root:*:/' "$r/etc/shadow"
	echo 'LANG=C.UTF-8' >"$r/etc/default/locale"

	printf '%s\n' "${NODE_MODULES[@]}" >"$r/etc/modules-load.d/vmshim-node.conf"
	# No /dev/kvm: the node's QEMU uses TCG, as on the hosts the node runs
	# on, whatever the shim's KVM speed probe would make of the SVM that
	# TCG emulates for the node. (Masking SVM in the node's CPU model
	# instead, -cpu max,svm=off, breaks glibc in QEMU 7.2's TCG.)
	printf 'blacklist kvm_amd\nblacklist kvm_intel\n' >"$r/etc/modprobe.d/vmshim-node.conf"
	mkdir -p "$r/etc/systemd/journald.conf.d"
	printf '[Journal]\nStorage=volatile\nRuntimeMaxUse=32M\n' >"$r/etc/systemd/journald.conf.d/vmshim-node.conf"

	mask "$r" apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer \
		e2scrub_reap.service fstrim.timer man-db.timer systemd-firstboot.service
	rm -f "$r/etc/systemd/system/getty.target.wants/getty@tty1.service"
	rm -rf "$r"/var/log/*.log "$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old
}
