#!/usr/bin/env bash
# Builds the vmshim node guest, the machine `make test-cgroupv2` runs
# containerd and the shim in: Debian bookworm booting systemd on the unified
# cgroup hierarchy, with dbus, QEMU, qemu-img, prlimit, iproute2 and
# qemu-guest-agent, from Debian packages:
#
#   node.sh OUTDIR
#
# OUTDIR receives disk-node.qcow2, a BIOS-bootable compressed qcow2 disk laid
# out as cloud.sh lays out the cloud guest's (syslinux and the Debian kernel
# with a busybox initramfs on partition 1, the ext4 root filesystem labelled
# vmshim-root on partition 2), and stamp-node. Kernel command line:
# console=ttyS0 root=LABEL=vmshim-root ro quiet systemd.show_status=error
# systemd.unified_cgroup_hierarchy=1.
#
# It is made with cloud.sh's functions: debootstrap (variant minbase) from
# the mirror apt uses, the tree kept as a tarball in the cache
# (node-rootfs-bookworm-KEY.tar.zst) and configured afresh on every build
# (node-rootfs.sh), the same kernel, modules and initramfs. containerd, ctr,
# the shim and the test VM image are not in it: the runner shares them at
# run time. A second run with the same scripts (node*.sh, cloud*.sh, lib.sh)
# and package versions does nothing. A failed download from the mirror is
# tried once more.
#
# Environment: VMSHIM_DEB_CACHE (where .debs and the rootfs tarball are
# kept; default OUTDIR/../debs), VMSHIM_DEBIAN_MIRROR (default: the mirror of
# apt's sources).
set -Eeuo pipefail

# shellcheck source=cloud.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cloud.sh"
# shellcheck source=cloud-rootfs.sh
. "$HERE/cloud-rootfs.sh"
# shellcheck source=node-rootfs.sh
. "$HERE/node-rootfs.sh"

LOG_PREFIX=node-guest
STAMP_FILES=("$HERE"/node.sh "$HERE"/node-*.sh "$HERE"/cloud.sh "$HERE"/cloud-*.sh)
ROOTFS_NAME=node-rootfs
DISK_SIZE_MIB=4096 # virtual size: room for containerd's images and the VMs' overlays
CMDLINE="console=ttyS0 root=LABEL=$ROOT_LABEL ro quiet systemd.show_status=error systemd.unified_cgroup_hierarchy=1"

# PACKAGES are installed on top of minbase with their dependencies and
# without their recommendations (debootstrap installs none): systemd as
# init, dbus (the shim's systemd cgroup driver talks to systemd over it),
# what the shim runs (qemu-system-x86, qemu-utils for qemu-img, util-linux
# for prlimit), iproute2, and qemu-guest-agent, through which the runner
# drives the node. e2fsprogs checks the root filesystem at boot; procps
# gives ps for post-mortems.
PACKAGES=(
	systemd-sysv udev kmod dbus e2fsprogs procps
	qemu-system-x86 qemu-utils util-linux iproute2
	qemu-guest-agent
)

# node_stamp ARGS... hashes what the disk depends on: the scripts and ARGS
# (the kernel package and the rootfs key).
node_stamp() {
	{
		cat "${STAMP_FILES[@]}" "$HERE/lib.sh"
		echo "$@"
	} | sha256sum | cut -d' ' -f1
}

# node_rootfs CACHE KEY prints the rootfs tarball (cached_rootfs), trying
# once more, from an empty tree, if the first attempt failed.
node_rootfs() {
	local tarball
	if tarball=$(cached_rootfs "$1" "$2"); then
		echo "$tarball"
		return
	fi
	log "debootstrap failed; trying once more"
	rm -rf "$WORK/bootstrap"
	cached_rootfs "$1" "$2"
}

node_main() {
	[ $# -eq 1 ] || die "usage: node.sh OUTDIR"
	local start=$SECONDS out cache kpkg key kname kversion kver deb tarball stamp rootfs
	mkdir -p "$1"
	out=$(cd "$1" && pwd)
	need_tools apt-get apt-cache dpkg-deb debootstrap unshare busybox cpio gzip zstd tar readelf \
		depmod mkfs.ext4 mkfs.fat mcopy syslinux sfdisk qemu-img sha256sum flock
	[ "$(id -u)" -eq 0 ] || die "debootstrap needs root"
	exec 9>"$out/.node.lock"
	flock 9
	cache=${VMSHIM_DEB_CACHE:-$(dirname "$out")/debs}
	mkdir -p "$cache"
	kpkg=$(kernel_package) || kpkg=$(kernel_package)
	key=$(rootfs_key)
	stamp=$(node_stamp "$kpkg" "$key")
	if [ "$(cat "$out/stamp-node" 2>/dev/null)" = "$stamp" ] && [ -f "$out/disk-node.qcow2" ]; then
		log "up to date: $out/disk-node.qcow2 ($((SECONDS - start)) s)"
		return 0
	fi
	log "building the node guest into $out ($kpkg)"
	rm -rf "$out/stamp-node" "$out"/.work-node.*
	WORK=$(mktemp -d "$out/.work-node.XXXX")
	trap 'rm -rf "$WORK"' EXIT

	tarball=$(node_rootfs "$cache" "$key")
	read -r kname kversion <<<"$kpkg"
	deb=$(fetch_deb "$kname" "$kversion" "$cache") || deb=$(fetch_deb "$kname" "$kversion" "$cache")
	dpkg-deb -x "$deb" "$WORK/kpkg"
	kver=${kname#linux-image-}
	[ -d "$WORK/kpkg/lib/modules/$kver" ] || die "$deb has no lib/modules/$kver"
	depmod -b "$WORK/kpkg" "$kver"

	rootfs=$WORK/rootfs
	mkdir "$rootfs"
	zstd -dcq "$tarball" | tar --numeric-owner --xattrs --xattrs-include='*' -C "$rootfs" -x
	configure_node "$rootfs"
	install_modules "$WORK/kpkg/lib/modules/$kver" "$rootfs" "$kver"

	build_initrd "$WORK/kpkg/lib/modules/$kver" "$WORK/initrd.img"
	build_disk "$WORK/kpkg/boot/vmlinuz-$kver" "$WORK/initrd.img" "$rootfs" "$WORK/disk-node.qcow2"
	rm -rf "$rootfs" "$WORK/kpkg"
	mv -f "$WORK/disk-node.qcow2" "$out/"
	echo "$stamp" >"$out/stamp-node"
	log "built $out/disk-node.qcow2 in $((SECONDS - start)) s"
}

node_main "$@"
