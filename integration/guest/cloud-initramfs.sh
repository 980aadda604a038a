#!/bin/sh
# /init of the cloud test guest's initramfs: busybox sh as PID 1. It loads
# the disk and filesystem drivers, finds the root filesystem, mounts it
# read-only (systemd checks it and remounts it read-write) and hands over to
# its /sbin/init.
#
# Kernel command line: root=LABEL=L, root=UUID=U or root=/dev/X (default
# LABEL=vmshim-root), rootwait=SECONDS (default 30), init=PATH (default
# /sbin/init). Failures print a line starting VMSHIM-INITRAMFS-ERROR: and drop
# to a shell on the console.
export PATH=/bin

mount -t devtmpfs devtmpfs /dev
mount -t proc proc /proc
mount -t sysfs sysfs /sys

fail() {
	echo "VMSHIM-INITRAMFS-ERROR: $*"
	exec sh </dev/console >/dev/console 2>&1
}

root=LABEL=vmshim-root
rootwait=30
init=/sbin/init
read -r cmdline </proc/cmdline
# shellcheck disable=SC2086 # one word per argument
for arg in $cmdline; do
	case $arg in
	root=*) root=${arg#root=} ;;
	rootwait=*) rootwait=${arg#rootwait=} ;;
	init=*) init=${arg#init=} ;;
	esac
done

# Modules are listed dependencies first; a module the kernel has built in
# is not in the list.
while read -r m; do
	insmod "/lib/modules/$m" 2>/dev/null || echo "VMSHIM-INITRAMFS-WARNING: insmod $m failed"
done </lib/modules/order

# The disk appears once its driver has probed it.
dev=
i=0
while :; do
	case $root in
	LABEL=* | UUID=*) dev=$(findfs "$root" 2>/dev/null) ;;
	*) [ -b "$root" ] && dev=$root ;;
	esac
	[ -n "$dev" ] && break
	[ "$i" -ge $((rootwait * 10)) ] && fail "no root filesystem $root after ${rootwait}s"
	i=$((i + 1))
	usleep 100000
done

mkdir -p /newroot
mount -t ext4 -o ro "$dev" /newroot || fail "cannot mount $dev ($root) on /newroot"
[ -x "/newroot$init" ] || [ -L "/newroot$init" ] || fail "$dev has no $init"
for d in dev proc sys; do
	mount --move "/$d" "/newroot/$d" || fail "cannot move /$d to the root filesystem"
done
exec switch_root /newroot "$init"
