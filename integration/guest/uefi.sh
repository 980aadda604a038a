#!/usr/bin/env bash
# Builds the vmshim test guests that need UEFI firmware or a CD-ROM, from
# Debian packages, around the kernel and initramfs build.sh makes:
#
#   uefi.sh OUTDIR
#
# OUTDIR (build.sh's, which this script runs first) receives:
#   disk-uefi.qcow2           GPT disk, no BIOS boot code (protective MBR
#                             only): one EFI system partition (FAT16, label
#                             VMSHIM) at 1 MiB with a standalone GRUB built
#                             with grub-mkimage as /EFI/BOOT/BOOTX64.EFI
#   disk-uefi-secure.qcow2    the same ESP with Debian's signed boot chain:
#                             shim (signed by Microsoft) as BOOTX64.EFI, GRUB
#                             signed by Debian as /EFI/BOOT/grubx64.efi
#   disk-uefi-unsigned.qcow2  shim as BOOTX64.EFI and the unsigned standalone
#                             GRUB as grubx64.efi: Secure Boot refuses it
#   disk-uefi{,-secure,-unsigned}.tar  their OCI archives (vmshim-pack --disk),
#                             images localhost/vmshim-test/disk:uefi,
#                             :uefi-secure and :uefi-unsigned
#   cdrom-wait.iso            ISO 9660, El Torito no-emulation boot with
#                             isolinux (BIOS), booting the same kernel and
#                             initramfs with console=ttyS0 vmshim.mode=wait
#   stamp-uefi                what a second run compares to do nothing
# Every ESP holds vmlinuz (build.sh's, the Debian kernel, signed by Debian),
# initrd.img (build.sh's initrd-wait.img) and grub.cfg in /EFI/BOOT and in
# /EFI/debian (the prefix built into Debian's signed GRUB), which boots them
# on the serial console with the BIOS disks' command line, console=ttyS0
# vmshim.bootdisk.
#
# GRUB's modules, shim and the signed GRUB come from grub-efi-amd64-bin,
# shim-signed and grub-efi-amd64-signed, fetched with apt-get download into
# the .deb cache and unpacked, never installed. grub-mkimage (grub-common),
# xorriso, isolinux and syslinux-common are host packages
# (integration/setup/deps.sh). No loop devices, no mounts. A second run with
# the same scripts (this one, lib.sh, init.sh), build.sh stamp, vmshim-pack
# sources and package versions does nothing.
#
# Environment: VMSHIM_PACK (vmshim-pack binary; default: built from the repo),
# VMSHIM_DEB_CACHE (where .debs are kept; default OUTDIR/../debs).
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
LOG_PREFIX=uefi-guest # what log lines start with
STAMP_FILES=("$HERE/uefi.sh" "$HERE/init.sh") # hashed into the stamp with lib.sh
REFS=localhost/vmshim-test
ESP_LABEL=VMSHIM # init.sh's count_boots finds the boot disk by it
ESP_START_MIB=1  # sector 2048: LBA 0-33 is the GPT, sector 100 stays free for count_boots
ESP_SIZE_MIB=32  # the bzImage (~8 MiB), the initramfs, shim and GRUB
DISK_SIZE_MIB=34 # the ESP and, in the last MiB, the backup GPT
DISK_GUID=5f0a2e31-7a1c-4d2b-9e6f-766d7368696d # fixed, so builds are alike
ESP_GUID=5f0a2e31-7a1c-4d2b-9e6f-766d73686901
ESP_TYPE=C12A7328-F81F-11D2-BA4B-00A0C93EC93B # EFI System
DISK_CMDLINE="console=ttyS0 vmshim.bootdisk"  # as build.sh's disks
ISO_CMDLINE="console=ttyS0 vmshim.mode=wait"
# Unpacked, never installed: what goes onto the ESPs.
DEB_PKGS=(grub-efi-amd64-bin grub-efi-amd64-signed shim-signed)
# Installed on the host: the tools and the files the images are made with.
HOST_PKGS=(grub-common xorriso isolinux syslinux-common dosfstools mtools fdisk qemu-utils)
GRUB_DIR=usr/lib/grub/x86_64-efi # GRUB's modules, in grub-efi-amd64-bin
SHIM=usr/lib/shim/shimx64.efi.signed
SIGNED_GRUB=usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed
ISOLINUX_BIN=/usr/lib/ISOLINUX/isolinux.bin
LDLINUX_C32=/usr/lib/syslinux/modules/bios/ldlinux.c32
# The modules the unsigned GRUB carries: what reads the ESP, normal mode
# (which reads grub.cfg) and the commands grub.cfg uses.
GRUB_MODULES="normal echo part_gpt fat serial terminal linux boot"
WORK= # scratch directory inside OUTDIR, removed on exit

# shellcheck source=lib.sh
. "$HERE/lib.sh"

# candidate_versions NAME... prints "NAME VERSION", one a line, of apt's
# candidate for each package, refreshing the apt lists once if they lack
# one.
candidate_versions() {
	local info n
	info=$(apt-cache show --no-all-versions "$@" 2>/dev/null) || info=
	n=$(grep -c '^Package:' <<<"$info") || n=0
	if [ "$n" -ne $# ]; then
		log "apt lists lack some of $*; running apt-get update"
		apt-get update -qq >&2
		info=$(apt-cache show --no-all-versions "$@") || die "apt knows not all of: $*"
	fi
	awk '/^Package:/ { name = $2 } /^Version:/ { print name, $2 }' <<<"$info"
}

# host_versions prints "NAME VERSION" of each installed HOST_PKGS package.
host_versions() {
	dpkg-query -W -f '${Package} ${Version}\n' "${HOST_PKGS[@]}" ||
		die "not all of ${HOST_PKGS[*]} are installed (run integration/setup/deps.sh)"
}

# pe_signed FILE succeeds if the PE image FILE carries an Authenticode
# signature: a certificate table (data directory 4 of the PE32+ optional
# header, which starts 24 bytes after the "PE\0\0" at e_lfanew) of non-zero
# size.
pe_signed() {
	local f=$1 pe opt
	pe=$(od -An -tu4 -j60 -N4 "$f" | tr -d ' ')
	[ "$(od -An -tx1 -j "$pe" -N4 "$f" | tr -d ' ')" = 50450000 ] || return 1
	opt=$((pe + 24))
	[ "$(od -An -tx1 -j "$opt" -N2 "$f" | tr -d ' ')" = 0b02 ] || return 1 # PE32+
	[ "$(od -An -tu4 -j $((opt + 112 + 4 * 8 + 4)) -N4 "$f" | tr -d ' ')" -gt 0 ]
}

# write_grub_cfg OUT writes the GRUB configuration every ESP carries: GRUB
# on the serial console (output there only: the firmware's console is often
# the same UART, and would double every line), no menu, the kernel and
# initramfs from the device GRUB was loaded from (its root: the ESP).
# Without a display GRUB says "no suitable video mode found" and "Booting
# in blind mode" before the kernel starts: harmless.
write_grub_cfg() {
	cat >"$1" <<-EOF
		serial --unit=0 --speed=115200
		terminal_input serial console
		terminal_output serial
		echo "vmshim: GRUB booting /vmlinuz from \$root"
		linux /vmlinuz $DISK_CMDLINE
		initrd /initrd.img
		boot
	EOF
}

# build_grub MODDIR OUT builds the unsigned GRUB for x86_64 EFI with
# grub-mkimage: one binary holding GRUB_MODULES from MODDIR, its prefix
# /EFI/BOOT on the device it is loaded from, so it reads
# /EFI/BOOT/grub.cfg from the ESP.
build_grub() {
	local moddir=$1 out=$2
	# shellcheck disable=SC2086 # one argument per module
	grub-mkimage -O x86_64-efi -d "$moddir" -p /EFI/BOOT -o "$out" $GRUB_MODULES
}

# build_uefi_disk OUT BOOTX64 [GRUBX64] builds a GPT qcow2 disk without loop
# devices: an ESP image made and filled with mtools (BOOTX64 as the
# removable-media loader /EFI/BOOT/BOOTX64.EFI, GRUBX64, if given, beside it
# as grubx64.efi for shim to load), put at ESP_START_MIB behind a protective
# MBR (no boot code) and the GPT.
build_uefi_disk() {
	local out=$1 bootx64=$2 grubx64=${3:-} esp raw d
	esp=$WORK/esp.img
	raw=$WORK/disk.raw
	rm -f "$esp" "$raw"
	# -h: hidden sectors = the partition's start LBA; -i: a fixed volume id.
	mkfs.fat -C -F 16 -n "$ESP_LABEL" -i 766d7368 -h $((ESP_START_MIB * 2048)) \
		"$esp" $((ESP_SIZE_MIB * 1024)) >/dev/null
	export MTOOLS_SKIP_CHECK=1
	mmd -i "$esp" ::/EFI ::/EFI/BOOT ::/EFI/debian
	mcopy -i "$esp" "$bootx64" ::/EFI/BOOT/BOOTX64.EFI
	[ -z "$grubx64" ] || mcopy -i "$esp" "$grubx64" ::/EFI/BOOT/grubx64.efi
	for d in BOOT debian; do
		mcopy -i "$esp" "$WORK/grub.cfg" "::/EFI/$d/grub.cfg"
	done
	mcopy -i "$esp" "$WORK/vmlinuz" ::/vmlinuz
	mcopy -i "$esp" "$WORK/initrd-wait.img" ::/initrd.img

	truncate -s "${DISK_SIZE_MIB}M" "$raw"
	sfdisk --quiet --label gpt "$raw" <<-EOF
		label-id: $DISK_GUID
		start=$((ESP_START_MIB * 2048)), size=$((ESP_SIZE_MIB * 2048)), type=$ESP_TYPE, uuid=$ESP_GUID, name="EFI system partition"
	EOF
	dd if="$esp" of="$raw" bs=1M seek="$ESP_START_MIB" conv=notrunc status=none
	qemu-img convert -f raw -O qcow2 "$raw" "$out"
	rm -f "$esp" "$raw"
}

# build_iso OUT builds a BIOS-bootable ISO 9660 image: isolinux as the El
# Torito no-emulation boot image (with its boot info table), booting the
# kernel and the wait initramfs on the serial console.
build_iso() {
	local out=$1 tree=$WORK/iso
	mkdir -p "$tree/isolinux"
	cp "$ISOLINUX_BIN" "$LDLINUX_C32" "$tree/isolinux/"
	cat >"$tree/isolinux/isolinux.cfg" <<-EOF
		SERIAL 0 115200
		DEFAULT linux
		PROMPT 0
		TIMEOUT 0
		LABEL linux
		  KERNEL /vmlinuz
		  INITRD /initrd.img
		  APPEND $ISO_CMDLINE
	EOF
	cp "$WORK/vmlinuz" "$tree/vmlinuz"
	cp "$WORK/initrd-wait.img" "$tree/initrd.img"
	# SOURCE_DATE_EPOCH: fixed dates and volume ids, so builds are alike.
	SOURCE_DATE_EPOCH=1700000000 xorriso -as mkisofs -quiet -o "$out" -V VMSHIM_CD -R -J \
		-b isolinux/isolinux.bin -c isolinux/boot.cat \
		-no-emul-boot -boot-load-size 4 -boot-info-table "$tree" 2>&1 |
		{ grep -v -e '^xorriso : NOTE' -e '^xorriso [0-9.]* : RockRidge' -e '^$' >&2 || true; }
	[ -s "$out" ] || die "xorriso made no $out"
	rm -rf "$tree"
}

main() {
	[ $# -eq 1 ] || die "usage: uefi.sh OUTDIR"
	local out cache debs host stamp name ver deb pack flavour f
	mkdir -p "$1"
	out=$(cd "$1" && pwd)
	need_tools apt-get apt-cache dpkg-deb dpkg-query grub-mkimage xorriso mkfs.fat mmd mcopy \
		sfdisk qemu-img od sha256sum flock
	for f in "$ISOLINUX_BIN" "$LDLINUX_C32"; do
		[ -f "$f" ] || die "$f not found (packages isolinux, syslinux-common)"
	done
	# The kernel and initramfs the disks boot (nothing to do when built).
	"$HERE/build.sh" "$out"
	# Concurrent builds of one OUTDIR take turns; the later ones then find
	# the stamp and return.
	exec 8>"$out/.uefi.lock"
	flock 8
	cache=${VMSHIM_DEB_CACHE:-$(dirname "$out")/debs}
	debs=$(candidate_versions "${DEB_PKGS[@]}")
	host=$(host_versions)
	WORK=$(mktemp -d "$out/.work-uefi.XXXX")
	trap 'rm -rf "$WORK"' EXIT
	# build.sh's outputs, read under its lock so a concurrent rebuild
	# cannot mix two builds; its stamp covers init.sh and the kernel.
	exec 9>"$out/.lock"
	flock 9
	[ -f "$out/stamp" ] || die "no $out/stamp: build.sh did not finish"
	cp "$out/stamp" "$WORK/build-stamp"
	cp "$out/vmlinuz" "$out/initrd-wait.img" "$WORK/"
	exec 9>&-
	stamp=$(stamp_of "$(cat "$WORK/build-stamp")" "$debs" "$host")
	if [ "$(cat "$out/stamp-uefi" 2>/dev/null)" = "$stamp" ]; then
		return 0
	fi
	log "building the UEFI and CD-ROM guests into $out"
	rm -f "$out/stamp-uefi"
	# Secure Boot checks the kernel through shim: it must be Debian's signed
	# one.
	pe_signed "$WORK/vmlinuz" || die "$out/vmlinuz carries no Authenticode signature"

	mkdir "$WORK/debs"
	while read -r name ver; do
		deb=$(fetch_deb "$name" "$ver" "$cache")
		dpkg-deb -x "$deb" "$WORK/debs"
	done <<<"$debs"
	for f in "$SHIM" "$SIGNED_GRUB" "$GRUB_DIR/linux.mod"; do
		[ -f "$WORK/debs/$f" ] || die "none of ${DEB_PKGS[*]} has /$f"
	done
	pe_signed "$WORK/debs/$SHIM" || die "/$SHIM carries no signature"
	pe_signed "$WORK/debs/$SIGNED_GRUB" || die "/$SIGNED_GRUB carries no signature"

	write_grub_cfg "$WORK/grub.cfg"
	build_grub "$WORK/debs/$GRUB_DIR" "$WORK/grubx64.efi"
	build_uefi_disk "$WORK/disk-uefi.qcow2" "$WORK/grubx64.efi"
	build_uefi_disk "$WORK/disk-uefi-secure.qcow2" "$WORK/debs/$SHIM" "$WORK/debs/$SIGNED_GRUB"
	build_uefi_disk "$WORK/disk-uefi-unsigned.qcow2" "$WORK/debs/$SHIM" "$WORK/grubx64.efi"
	build_iso "$WORK/cdrom-wait.iso"

	pack=$(pack_tool)
	for flavour in uefi uefi-secure uefi-unsigned; do
		"$pack" --disk "$WORK/disk-$flavour.qcow2" --ref "$REFS/disk:$flavour" -o "$WORK/disk-$flavour.tar"
	done
	for f in disk-uefi{,-secure,-unsigned}.{qcow2,tar} cdrom-wait.iso; do
		mv -f "$WORK/$f" "$out/$f"
	done
	echo "$stamp" >"$out/stamp-uefi"
	log "done"
}

main "$@"
