#!/usr/bin/env bash
# Builds the vmshim cloud test guest, Debian bookworm with systemd and
# cloud-init, from Debian packages:
#
#   cloud.sh OUTDIR
#
# OUTDIR receives disk-cloud.qcow2 (a BIOS-bootable compressed qcow2 disk:
# MBR, partition 1 FAT16 with syslinux, the Debian kernel and a busybox
# initramfs (cloud-initramfs.sh); partition 2 ext4, label vmshim-root, the
# root filesystem) and disk-cloud.tar (its OCI archive made with vmshim-pack,
# image localhost/vmshim-test/debian:cloud).
#
# The root filesystem is made with debootstrap (variant minbase) from the
# Debian mirror apt uses, as root, in a private mount namespace; the result is
# kept as a tarball in the cache and configured afresh on every build
# (cloud-rootfs.sh), without chroot. The kernel is the package build.sh uses
# (the one linux-image-amd64 depends on): its vmlinuz boots the disk and the
# modules a virtual machine can use go into /lib/modules. No loop devices, no
# mounts of images. A second run with the same scripts (cloud*.sh, lib.sh),
# vmshim-pack sources and package versions does nothing.
#
# Environment: VMSHIM_PACK (vmshim-pack binary; default: built from the repo),
# VMSHIM_DEB_CACHE (where .debs and the rootfs tarball are kept; default
# OUTDIR/../debs), VMSHIM_DEBIAN_MIRROR (default: the mirror of apt's sources).
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
LOG_PREFIX=cloud-guest # what log lines start with
STAMP_FILES=("$HERE"/cloud.sh "$HERE"/cloud-*.sh) # hashed into the stamp with lib.sh
REF=localhost/vmshim-test/debian:cloud
SUITE=bookworm
ROOT_LABEL=vmshim-root
BOOT_START_MIB=1  # partition 1 (FAT16, syslinux, kernel, initramfs)
BOOT_SIZE_MIB=48  # the bzImage (~8 MiB), the initramfs (~2 MiB) and room for a newer kernel
DISK_SIZE_MIB=2048 # virtual size; partition 2 (ext4 root) takes the rest
CMDLINE="console=ttyS0 root=LABEL=$ROOT_LABEL ro quiet systemd.show_status=error"
WORK= # scratch directory inside OUTDIR, removed on exit
ROOTFS_NAME=cloud-rootfs # name of the cached rootfs tarballs and their lock

# PACKAGES are installed on top of minbase (with their dependencies, not
# their recommendations). cloud-init on bookworm renders its network
# configuration for ifupdown, and its isc-dhcp-client takes the DHCP options
# vmshim's responder sends: routes (option 121, through Debian's rfc3442 hook),
# MTU, DNS servers and search list. dbus lets logind act on the ACPI power
# button. util-linux's mount mounts 9p shares itself. python3-cffi-backend
# provides the virtual package python3-cryptography needs, which debootstrap
# does not resolve. tpm2-tools is for the vTPM tests: they drive the guest's
# TPM through /dev/tpmrm0 (its libtss2-esys depends on the device TCTI and
# on tpm-udev, which gives the device nodes to group tss).
PACKAGES=(
	systemd-sysv udev kmod dbus
	cloud-init python3-cffi-backend cloud-guest-utils e2fsprogs
	openssh-server sudo
	qemu-guest-agent
	iproute2 ifupdown isc-dhcp-client netbase
	tpm2-tools
)

# shellcheck source=lib.sh
. "$HERE/lib.sh"

# debian_mirror prints the URI of the first enabled "deb" source for SUITE in
# apt's sources (deb822 .sources files or one-line .list files).
debian_mirror() {
	local m
	if [ -n "${VMSHIM_DEBIAN_MIRROR:-}" ]; then
		echo "$VMSHIM_DEBIAN_MIRROR"
		return
	fi
	m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v suite="$SUITE" '
		BEGIN { RS = ""; FS = "\n" }
		{
			types = ""; suites = ""; uris = ""; enabled = "yes"
			for (i = 1; i <= NF; i++) {
				if ($i ~ /^#/) continue
				split($i, kv, ":")
				key = tolower(kv[1]); val = substr($i, length(kv[1]) + 2)
				gsub(/^[ \t]+|[ \t]+$/, "", val)
				if (key == "types") types = " " val " "
				else if (key == "suites") suites = " " val " "
				else if (key == "uris") uris = val
				else if (key == "enabled") enabled = tolower(val)
			}
			if (enabled != "no" && types ~ / deb / && suites ~ (" " suite " ")) {
				split(uris, u, " "); print u[1]; exit
			}
		}')
	if [ -z "$m" ]; then
		m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk -v suite="$SUITE" '
			$1 == "deb" {
				i = 2
				if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
				if ($(i + 1) == suite) { print $i; exit }
			}')
	fi
	[ -n "$m" ] || die "no deb source for $SUITE in apt's sources; set VMSHIM_DEBIAN_MIRROR"
	echo "$m"
}

# rootfs_key hashes what the debootstrapped tree depends on: the suite, the
# package list with apt's candidate versions and the bootstrap code.
rootfs_key() {
	local versions
	versions=$(apt-cache show --no-all-versions "${PACKAGES[@]}" |
		awk '/^Package:/ { name = $2 } /^Version:/ { print name, $2 }' | LC_ALL=C sort -u) ||
		die "apt-cache show ${PACKAGES[*]} failed (run apt-get update)"
	[ "$(wc -l <<<"$versions")" -eq ${#PACKAGES[@]} ] ||
		die "apt knows only some of ${PACKAGES[*]}: $(echo "$versions" | tr '\n' ' ')"
	{
		echo "$SUITE ${PACKAGES[*]}"
		echo "$versions"
		declare -f bootstrap_rootfs
	} | sha256sum | cut -c1-16
}

# bootstrap_rootfs TARBALL runs debootstrap into the work dir and packs the
# result, without apt's caches and lists, into TARBALL (zstd'd tar).
bootstrap_rootfs() {
	local tarball=$1 root=$WORK/bootstrap mirror include bad
	mirror=$(debian_mirror)
	include=$(IFS=,; echo "${PACKAGES[*]}")
	log "debootstrap $SUITE from $mirror (a few minutes)"
	# A private mount namespace: the /proc and /sys debootstrap mounts in
	# the target go away with it, even if debootstrap fails.
	if ! unshare --mount --propagation private \
		debootstrap --variant=minbase --include="$include" "$SUITE" "$root" "$mirror" \
		>"$WORK/debootstrap.out" 2>&1; then
		tail -n 20 "$WORK/debootstrap.out" >&2
		[ -f "$root/debootstrap/debootstrap.log" ] && tail -n 30 "$root/debootstrap/debootstrap.log" >&2
		die "debootstrap failed"
	fi
	bad=$(awk '/^Package:/ { p = $2 } /^Status:/ && $0 != "Status: install ok installed" { print p }' \
		"$root/var/lib/dpkg/status")
	[ -z "$bad" ] || die "packages not installed cleanly: $bad"
	rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
		"$root"/var/log/bootstrap.log
	tar --numeric-owner --xattrs --xattrs-include='*' -C "$root" -c . | zstd -q -T0 -6 >"$tarball.tmp.$$"
	mv -f "$tarball.tmp.$$" "$tarball"
	rm -rf "$root"
}

# cached_rootfs CACHE KEY prints the rootfs tarball for KEY (rootfs_key),
# bootstrapping it if absent, and removes tarballs of other keys. Builds
# into other OUTDIRs sharing CACHE take turns (the lock is held until this
# function's subshell exits).
cached_rootfs() {
	local cache=$1 key=$2 tarball f
	tarball=$cache/$ROOTFS_NAME-$SUITE-$key.tar.zst
	exec 8>"$cache/.$ROOTFS_NAME.lock"
	flock 8
	if [ ! -f "$tarball" ]; then
		bootstrap_rootfs "$tarball"
	fi
	for f in "$cache/$ROOTFS_NAME"-*.tar.zst "$cache/$ROOTFS_NAME"-*.tar.zst.tmp.*; do
		[ "$f" = "$tarball" ] || rm -f "$f"
	done
	echo "$tarball"
}

# build_initrd MODDIR OUT builds the gzip'd newc initramfs: static busybox,
# cloud-initramfs.sh as /init and the modules that reach an ext4 root on
# virtio-blk, virtio-scsi, NVMe or AHCI, dependencies first. MODDIR is the
# kernel's module tree with a modules.dep (depmod run on it).
build_initrd() {
	local moddir=$1 out=$2 root m dep
	local -A seen=()
	root=$WORK/initrd
	mkdir -p "$root"/{bin,dev,proc,sys,newroot,lib/modules}
	install_busybox "$root"
	install -m 0755 "$HERE/cloud-initramfs.sh" "$root/init"
	: >"$root/lib/modules/order"
	# ext4 and jbd2 look up crc32c through the crypto API at mount time;
	# the generic one loads on any CPU.
	for m in virtio_pci virtio_blk virtio_scsi sd_mod nvme ahci crc32c_generic crct10dif_generic ext4; do
		m=$(awk -v m="$m" -F: '{ n = $1; sub(/.*\//, "", n); sub(/\.ko.*/, "", n); gsub(/-/, "_", n) }
			n == m { print $1; exit }' "$moddir/modules.dep")
		[ -n "$m" ] || continue # built in
		# modules.dep lists all of a module's dependencies, the deepest last.
		for dep in $(awk -F: -v m="$m" '$1 == m { print $2 }' "$moddir/modules.dep" | tr ' ' '\n' | tac) "$m"; do
			[ -z "${seen[$dep]:-}" ] || continue
			seen[$dep]=1
			cp "$moddir/$dep" "$root/lib/modules/"
			basename "$dep" >>"$root/lib/modules/order"
		done
	done
	pack_initrd "$root" "$out"
}

# build_disk VMLINUZ INITRD ROOTFS OUT builds the BIOS-bootable disk without
# loop devices or mounts: a FAT16 partition image filled with mtools and made
# bootable with syslinux, an ext4 image populated from ROOTFS with mkfs.ext4
# -d, both put behind syslinux's MBR; then a compressed qcow2.
build_disk() {
	local kernel=$1 initrd=$2 rootfs=$3 out=$4 boot=$WORK/boot.img ext=$WORK/root.img raw=$WORK/disk.raw
	local root_start=$((BOOT_START_MIB + BOOT_SIZE_MIB))
	local root_size=$((DISK_SIZE_MIB - root_start))
	boot_partition "$boot" VMSHIMBOOT "$BOOT_START_MIB" "$BOOT_SIZE_MIB" "$kernel" "$initrd" "$CMDLINE"
	# Inode tables and journal written now (zeros, which the qcow2 does not
	# store), so the guest's ext4lazyinit never writes them into the overlay.
	truncate -s "${root_size}M" "$ext"
	mkfs.ext4 -q -F -L "$ROOT_LABEL" -d "$rootfs" -E lazy_itable_init=0,lazy_journal_init=0,root_owner=0:0 \
		"$ext" "${root_size}M"

	truncate -s "${DISK_SIZE_MIB}M" "$raw"
	sfdisk --quiet --label dos "$raw" <<-EOF
		start=$((BOOT_START_MIB * 2048)), size=$((BOOT_SIZE_MIB * 2048)), type=6, bootable
		start=$((root_start * 2048)), type=83
	EOF
	dd if="$(syslinux_mbr)" of="$raw" bs=440 count=1 conv=notrunc status=none
	dd if="$boot" of="$raw" bs=1M seek="$BOOT_START_MIB" conv=notrunc,sparse status=none
	dd if="$ext" of="$raw" bs=1M seek="$root_start" conv=notrunc,sparse status=none
	rm -f "$boot" "$ext"
	qemu-img convert -c -f raw -O qcow2 "$raw" "$out"
	rm -f "$raw"
}

main() {
	[ $# -eq 1 ] || die "usage: cloud.sh OUTDIR"
	local out cache kpkg key kname kversion kver deb tarball stamp rootfs pack
	mkdir -p "$1"
	out=$(cd "$1" && pwd)
	need_tools apt-get apt-cache dpkg-deb debootstrap unshare busybox cpio gzip zstd tar readelf \
		depmod mkfs.ext4 mkfs.fat mcopy syslinux sfdisk qemu-img sha256sum flock
	[ "$(id -u)" -eq 0 ] || die "debootstrap needs root"
	# Concurrent builds of one OUTDIR take turns; the later ones then find
	# the stamp and return.
	exec 9>"$out/.cloud.lock"
	flock 9
	cache=${VMSHIM_DEB_CACHE:-$(dirname "$out")/debs}
	mkdir -p "$cache"
	kpkg=$(kernel_package)
	key=$(rootfs_key)
	stamp=$(stamp_of "$kpkg" "$key")
	if [ "$(cat "$out/stamp-cloud" 2>/dev/null)" = "$stamp" ]; then
		return 0
	fi
	log "building the cloud guest into $out ($kpkg)"
	# Holding the lock, any work dir left here is from a build that was
	# killed.
	rm -rf "$out/stamp-cloud" "$out"/.work-cloud.*
	WORK=$(mktemp -d "$out/.work-cloud.XXXX")
	trap 'rm -rf "$WORK"' EXIT

	tarball=$(cached_rootfs "$cache" "$key")
	read -r kname kversion <<<"$kpkg"
	deb=$(fetch_deb "$kname" "$kversion" "$cache")
	dpkg-deb -x "$deb" "$WORK/kpkg"
	kver=${kname#linux-image-}
	[ -d "$WORK/kpkg/lib/modules/$kver" ] || die "$deb has no lib/modules/$kver"
	depmod -b "$WORK/kpkg" "$kver"

	rootfs=$WORK/rootfs
	mkdir "$rootfs"
	zstd -dcq "$tarball" | tar --numeric-owner --xattrs --xattrs-include='*' -C "$rootfs" -x
	# shellcheck source=cloud-rootfs.sh
	. "$HERE/cloud-rootfs.sh"
	configure_rootfs "$rootfs"
	install_modules "$WORK/kpkg/lib/modules/$kver" "$rootfs" "$kver"

	build_initrd "$WORK/kpkg/lib/modules/$kver" "$WORK/initrd.img"
	build_disk "$WORK/kpkg/boot/vmlinuz-$kver" "$WORK/initrd.img" "$rootfs" "$WORK/disk-cloud.qcow2"
	rm -rf "$rootfs" "$WORK/kpkg"
	pack=$(pack_tool)
	"$pack" --disk "$WORK/disk-cloud.qcow2" --ref "$REF" -o "$WORK/disk-cloud.tar"
	mv -f "$WORK/disk-cloud.qcow2" "$WORK/disk-cloud.tar" "$out/"
	echo "$stamp" >"$out/stamp-cloud"
	log "done"
}

# Run, unless sourced (node.sh builds on these functions).
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	main "$@"
fi
