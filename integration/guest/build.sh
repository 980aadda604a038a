#!/usr/bin/env bash
# Builds the vmshim test guests from Debian packages:
#
#   build.sh OUTDIR
#
# OUTDIR receives vmlinuz (the Debian bzImage), vmlinux (its uncompressed ELF,
# for fast QEMU -kernel boots through the PVH entry),
# initrd-{wait,poweroff,agent}.img (busybox initramfs running init.sh, with
# udhcpc.sh as the DHCP client's script, udhcpc6 (built by udhcpc6-build.sh
# from Debian's busybox source) with udhcpc6.sh as its script, the pvpanic
# module, the virtio NIC
# modules and the virtio-blk, virtio-scsi and NVMe disk modules; the agent
# flavour boots like wait and also carries qemu-ga and util-linux's script, which
# terminal execs run under), disk-{wait,poweroff,agent}.qcow2
# (BIOS-bootable disks: MBR, FAT16, syslinux) and six OCI archives made with
# vmshim-pack: {disk,kernel}-{wait,poweroff,agent}.tar.
#
# The kernel is the linux-image-*-amd64 package that linux-image-amd64 depends
# on; qemu-ga comes from the qemu-guest-agent package and the shared objects
# it needs from the packages it depends on (recursively); script comes from
# bsdutils and needs only libc, one of those. All are fetched
# with apt-get download into a cache and unpacked, never installed. No loop
# devices, no mounts, no network beyond apt and the busybox source tarball
# from the Debian mirror. A second run with the same scripts (this one,
# lib.sh, init.sh, udhcpc.sh, udhcpc6.sh, udhcpc6-build.sh), vmshim-pack
# sources and package versions does nothing.
#
# Environment: VMSHIM_PACK (vmshim-pack binary; default: built from the repo),
# VMSHIM_DEB_CACHE (where .debs, the busybox source and the udhcpc6 built
# from it are kept; default OUTDIR/../debs), VMSHIM_DEBIAN_MIRROR (where
# udhcpc6-build.sh downloads the busybox source; default: the mirror apt
# downloads busybox-static from).
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
LOG_PREFIX=guest # what log lines start with
STAMP_FILES=("$HERE/build.sh" "$HERE/init.sh" "$HERE/udhcpc.sh" "$HERE/udhcpc6.sh" "$HERE/udhcpc6-build.sh") # hashed into the stamp with lib.sh
REFS=localhost/vmshim-test
PART_START_MIB=1 # the FAT partition starts at 1 MiB
PART_SIZE_MIB=32 # room for the bzImage (~8 MiB) and an initramfs
WORK=            # scratch directory inside OUTDIR, removed on exit
AGENT_PKG=qemu-guest-agent
AGENT_BIN=usr/sbin/qemu-ga # inside the package, and inside the agent initramfs
SCRIPT_PKG=bsdutils        # util-linux's script, which terminal execs run under
SCRIPT_BIN=usr/bin/script  # inside the package, and inside the agent initramfs
# Where the agent's shared objects are looked up in the unpacked packages
# (and put in the initramfs): the dynamic loader's default search path.
AGENT_LIBDIRS="lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu lib64"

# shellcheck source=lib.sh
. "$HERE/lib.sh"

# agent_packages prints "NAME VERSION", one a line, for qemu-guest-agent and
# every package it depends on, recursively (Depends only: Pre-Depends,
# Recommends and the like bring nothing qemu-ga loads), and for bsdutils
# (script; its only library, libc, is among qemu-ga's). Virtual packages
# ("<name>") are skipped; the packages providing them are listed in their
# own right. Versions are apt's candidates.
agent_packages() {
	local names
	names=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
		--no-breaks --no-replaces --no-enhances --no-pre-depends "$AGENT_PKG" 2>/dev/null |
		sed -n 's/^\([^ <][^ ]*\)$/\1/p' | sed 's/:.*//' | LC_ALL=C sort -u) || names=
	grep -qx "$AGENT_PKG" <<<"$names" ||
		die "apt knows no $AGENT_PKG package (apt-cache depends $AGENT_PKG failed)"
	names=$(printf '%s\n%s\n' "$names" "$SCRIPT_PKG" | LC_ALL=C sort -u)
	# shellcheck disable=SC2086 # one argument per package name
	apt-cache show --no-all-versions $names |
		awk '/^Package:/ { name = $2 } /^Version:/ { print name, $2 }' | LC_ALL=C sort -u
}

# le32 FILE OFFSET prints the little-endian u32 at OFFSET; u8 one byte;
# hex4 the first four bytes at OFFSET in hex.
le32() { od -An -tu4 -j "$(($2))" -N4 "$1" | tr -d ' '; }
u8() { od -An -tu1 -j "$(($2))" -N1 "$1" | tr -d ' '; }
hex4() { od -An -tx1 -j "$(($2))" -N4 "$1" | tr -d ' '; }

# extract_vmlinux turns a bzImage into the ELF vmlinux it carries. The x86
# boot header gives setup_sects (0x1f1), payload_offset (0x248, from the end
# of the setup code) and payload_length (0x24c). The payload is the
# compressed vmlinux followed by its uncompressed size as a le32.
extract_vmlinux() {
	local bz=$1 out=$2 setup off len size
	[ "$(hex4 "$bz" 0x202)" = 48647253 ] || die "$bz is not a bzImage (no HdrS)"
	setup=$(u8 "$bz" 0x1f1)
	[ "$setup" -eq 0 ] && setup=4
	off=$(((setup + 1) * 512 + $(le32 "$bz" 0x248)))
	len=$(le32 "$bz" 0x24c)
	size=$(le32 "$bz" $((off + len - 4)))
	local -a dec
	case $(hex4 "$bz" "$off") in
	fd377a58) dec=(xz -dc) ;;
	1f8b*) dec=(gzip -dc) ;;
	28b52ffd) dec=(zstd -dcq) ;;
	*) die "$bz: unsupported kernel compression (payload starts $(hex4 "$bz" "$off"))" ;;
	esac
	dd if="$bz" bs=1M iflag=skip_bytes,count_bytes skip="$off" count=$((len - 4)) status=none |
		"${dec[@]}" >"$out"
	[ "$(stat -c %s "$out")" -eq "$size" ] || die "$out: got $(stat -c %s "$out") bytes, the bzImage says $size"
	[ "$(hex4 "$out" 0)" = 7f454c46 ] || die "$out is not an ELF file"
	# XEN_ELFNOTE_PHYS32_ENTRY (0x12) is the PVH entry QEMU -kernel uses.
	grep -Eq '^[[:space:]]*Xen[[:space:]]+0x[0-9a-f]+[[:space:]].*\(0x00000012\)' <<<"$(readelf -n "$out")" ||
		die "$out has no Xen PVH entry note; QEMU would not boot it directly"
}

# module_file KTREE NAME prints the path of module NAME (- and _ are the
# same in module names), or nothing if the kernel has it built in.
module_file() {
	local tree=$1 name=${2//-/_}
	find "$tree/kernel" -type f \( -name "$name.ko*" -o -name "${name//_/-}.ko*" \) -print -quit
}

# add_module KTREE NAME DEST ORDERFILE copies module NAME and, first, every
# module it depends on into DEST (decompressed, since busybox insmod cannot
# read .ko.xz/.zst) and appends each file name to ORDERFILE once.
add_module() {
	local tree=$1 name=$2 dest=$3 order=$4 file base dep
	file=$(module_file "$tree" "$name")
	if [ -z "$file" ]; then
		grep -q "/${name//-/_}.ko" "$tree/modules.builtin" 2>/dev/null ||
			log "module $name not found; assuming it is built in"
		return 0
	fi
	base=$(basename "$file")
	base=${base%.xz}
	base=${base%.zst}
	base=${base%.gz}
	grep -qx "$base" "$order" 2>/dev/null && return 0
	for dep in $(modinfo -F depends "$file" | tr ',' ' '); do
		add_module "$tree" "$dep" "$dest" "$order"
	done
	case $file in
	*.xz) xz -dc "$file" >"$dest/$base" ;;
	*.zst) zstd -dcq "$file" >"$dest/$base" ;;
	*.gz) gzip -dc "$file" >"$dest/$base" ;;
	*) cp "$file" "$dest/$base" ;;
	esac
	echo "$base" >>"$order"
}

# resolve_in ROOT PATH prints PATH (absolute, inside ROOT) with its symlinks
# followed inside ROOT, so an absolute link in an unpacked package (libc6's
# /lib64/ld-linux-x86-64.so.2) never leads to the host's file.
resolve_in() {
	local root=$1 path=$2 target
	for _ in $(seq 40); do
		[ -L "$root$path" ] || { echo "$path"; return; }
		target=$(readlink "$root$path")
		case $target in
		/*) path=$target ;;
		*) path=$(dirname "$path")/$target ;;
		esac
	done
	die "$path: too many levels of symbolic links under $root"
}

# elf_needed FILE prints the shared objects FILE's dynamic section names
# (DT_NEEDED), one a line.
elf_needed() {
	readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p'
}

# elf_interp FILE prints FILE's ELF interpreter (PT_INTERP), or nothing.
elf_interp() {
	readelf -l "$1" | sed -n 's/.*\[Requesting program interpreter: \(.*\)\]$/\1/p'
}

# install_elf STAGE ROOT BIN copies the program BIN (a path without its
# leading /) from STAGE (the unpacked packages) into the initramfs tree ROOT
# at the same path, with its ELF interpreter at the same absolute path and
# exactly the shared objects it needs: its NEEDED entries, recursively, each
# found in one of AGENT_LIBDIRS of STAGE and put under the same directory in
# ROOT (no ld.so.cache: the loader searches those directories by default).
install_elf() {
	local stage=$1 root=$2 bin=$3 interp lib dir file found
	local -a queue
	local -A seen=()
	[ -f "$stage/$bin" ] || die "none of the unpacked packages has /$bin"
	install -D -m 0755 "$stage/$bin" "$root/$bin"
	interp=$(elf_interp "$stage/$bin")
	[ -n "$interp" ] || die "/$bin has no ELF interpreter"
	file=$stage$(resolve_in "$stage" "$interp")
	[ -f "$file" ] || die "ELF interpreter $interp of /$bin is in none of the unpacked packages"
	install -D -m 0755 "$file" "$root$interp"
	# The interpreter is the loader itself: libc's NEEDED entry for it is
	# satisfied without a second copy.
	seen[${interp##*/}]=1
	queue=("$stage/$bin")
	while [ ${#queue[@]} -gt 0 ]; do
		file=${queue[0]}
		queue=("${queue[@]:1}")
		for lib in $(elf_needed "$file"); do
			[ -z "${seen[$lib]:-}" ] || continue
			seen[$lib]=1
			found=/nonexistent
			for dir in $AGENT_LIBDIRS; do
				if [ -e "$stage/$dir/$lib" ]; then
					found=$stage$(resolve_in "$stage" "/$dir/$lib")
					break
				fi
			done
			[ -f "$found" ] ||
				die "${file#"$stage"} needs $lib, which is in none of $AGENT_LIBDIRS of the unpacked packages"
			install -D -m 0644 "$found" "$root/$dir/$lib"
			queue+=("$found")
		done
	done
}

# build_initrd KTREE FLAVOUR OUT [AGENTSTAGE] builds the gzip'd newc
# initramfs for FLAVOUR: wait, poweroff, or agent (mode wait, plus qemu-ga
# and script from the unpacked packages in AGENTSTAGE and the virtio-serial
# driver). $WORK/udhcpc6 is the static udhcpc6 (udhcpc6-build.sh).
build_initrd() {
	local tree=$1 flavour=$2 out=$3 stage=${4:-} root m mode=$2
	if [ "$flavour" = agent ]; then
		mode="wait"
	fi
	root=$(mktemp -d "$WORK/initrd-$flavour.XXXX")
	mkdir -p "$root"/{bin,dev,etc,proc,sys,lib/modules}
	install_busybox "$root"
	install -m 0755 "$HERE/init.sh" "$root/init"
	install -D -m 0755 "$HERE/udhcpc.sh" "$root/etc/udhcpc/default.script"
	# DHCPv6: busybox-static has no udhcpc6; this one is a program of its own.
	install -m 0755 "$WORK/udhcpc6" "$root/bin/udhcpc6"
	install -D -m 0755 "$HERE/udhcpc6.sh" "$root/etc/udhcpc6/default.script"
	echo "$mode" >"$root/etc/vmshim-mode"
	: >"$root/lib/modules/order"
	# evdev gives the power button a /dev/input/eventN; button is the ACPI
	# power button driver. Either may be built in.
	add_module "$tree" evdev "$root/lib/modules" "$root/lib/modules/order"
	add_module "$tree" button "$root/lib/modules" "$root/lib/modules/order"
	# pvpanic_mmio (with pvpanic) drives QEMU's ISA pvpanic device, ACPI id
	# QEMU0001: a guest panic reaches QEMU, which exits non-zero.
	add_module "$tree" pvpanic_mmio "$root/lib/modules" "$root/lib/modules/order"
	# The virtio NIC: virtio_pci (with virtio, virtio_ring and the modern
	# and legacy PCI transports) finds the device, virtio_net (with
	# net_failover and failover) drives it. virtio_mmio finds the virtio
	# devices of QEMU's microvm machine, which has no PCI. udhcpc needs
	# packet sockets, which Debian builds in (CONFIG_PACKET=y); af_packet
	# is added in case a kernel has them as a module.
	for m in virtio_pci virtio_mmio virtio_net af_packet; do
		add_module "$tree" "$m" "$root/lib/modules" "$root/lib/modules/order"
	done
	# virtio_mem grows and shrinks guest RAM when the shim resizes the VM;
	# the shim's memhp_default_state=online_movable onlines what it adds.
	add_module "$tree" virtio_mem "$root/lib/modules" "$root/lib/modules/order"
	# The disk drivers the shim can attach a disk with: virtio_blk;
	# virtio_scsi with sd_mod (and scsi_mod, scsi_common, t10-pi and the
	# CRC modules it needs); nvme with nvme-core.
	for m in virtio_blk virtio_scsi sd_mod nvme; do
		add_module "$tree" "$m" "$root/lib/modules" "$root/lib/modules/order"
	done
	# Guests without virtio: SATA (ahci, with libahci and libata), IDE
	# (ata_piix, ata_generic) and CD-ROM (sr_mod, with cdrom) disks; the
	# e1000, e1000e and RTL8139 NICs (8139cp drives QEMU's rtl8139, a C+
	# chip; 8139too the older ones).
	for m in ahci ata_piix ata_generic sr_mod e1000 e1000e 8139cp 8139too; do
		add_module "$tree" "$m" "$root/lib/modules" "$root/lib/modules/order"
	done
	# efivarfs (for init.sh's VMSHIM-EFI) refuses to load without EFI, so
	# it has its own list, which init.sh reads only on an EFI boot.
	add_module "$tree" efivarfs "$root/lib/modules" "$root/lib/modules/efi-order"
	if [ "$flavour" = agent ]; then
		# virtio_console drives the virtio-serial port qemu-ga talks on;
		# 9pnet_virtio and 9p (with 9pnet, netfs and fscache) let an exec
		# mount a volume's share. virtio_balloon reports the pages the
		# guest frees and its memory statistics to the shim's balloon;
		# the other flavours leave it out, and show a guest without it
		# runs as before beside the device.
		for m in virtio_console 9pnet_virtio 9p virtio_balloon; do
			add_module "$tree" "$m" "$root/lib/modules" "$root/lib/modules/order"
		done
		install_elf "$stage" "$root" "$AGENT_BIN"
		install_elf "$stage" "$root" "$SCRIPT_BIN"
		# init.sh puts qemu-ga's state directory under /run (/var/run,
		# qemu-ga's default, leads there too); guest-exec'd commands may
		# want /tmp.
		mkdir -p "$root"/{run,tmp,var}
		chmod 1777 "$root/tmp"
		ln -s ../run "$root/var/run"
	fi
	pack_initrd "$root" "$out"
}

# build_disk VMLINUZ INITRD OUT builds a BIOS-bootable qcow2 disk without
# loop devices: a FAT16 partition image made and filled with mtools, made
# bootable by syslinux's mtools installer, put behind an MBR at 1 MiB.
build_disk() {
	local kernel=$1 initrd=$2 out=$3 part raw
	part=$WORK/part.img
	raw=$WORK/disk.raw
	rm -f "$part" "$raw"
	boot_partition "$part" VMSHIM "$PART_START_MIB" "$PART_SIZE_MIB" "$kernel" "$initrd" "console=ttyS0 vmshim.bootdisk"

	truncate -s $(((PART_START_MIB + PART_SIZE_MIB) * 1024 * 1024)) "$raw"
	# One bootable FAT16 partition (type 6) at 1 MiB.
	echo "start=$((PART_START_MIB * 2048)), size=$((PART_SIZE_MIB * 2048)), type=6, bootable" |
		sfdisk --quiet --label dos "$raw"
	# mbr.bin is boot code only (440 bytes): the partition table stays.
	dd if="$(syslinux_mbr)" of="$raw" bs=440 count=1 conv=notrunc status=none
	dd if="$part" of="$raw" bs=1M seek="$PART_START_MIB" conv=notrunc status=none
	qemu-img convert -f raw -O qcow2 "$raw" "$out"
	rm -f "$part" "$raw"
}

main() {
	[ $# -eq 1 ] || die "usage: build.sh OUTDIR"
	local out kpkg kname kversion stamp deb tree kver flavour pack agent_pkgs name ver f cache
	mkdir -p "$1"
	out=$(cd "$1" && pwd)
	need_tools apt-get apt-cache dpkg-deb busybox cpio gzip xz zstd od readelf modinfo \
		mkfs.fat mcopy syslinux sfdisk qemu-img sha256sum flock
	# Concurrent builds of one OUTDIR (parallel test binaries) take turns;
	# the later ones then find the stamp and return.
	exec 9>"$out/.lock"
	flock 9
	kpkg=$(kernel_package)
	agent_pkgs=$(agent_packages)
	stamp=$(stamp_of "$kpkg" "$agent_pkgs")
	if [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
		return 0
	fi
	log "building test guests into $out ($kpkg)"
	rm -f "$out/stamp"
	WORK=$(mktemp -d "$out/.work.XXXX")
	trap 'rm -rf "$WORK"' EXIT

	cache=${VMSHIM_DEB_CACHE:-$(dirname "$out")/debs}
	read -r kname kversion <<<"$kpkg"
	deb=$(fetch_deb "$kname" "$kversion" "$cache")
	dpkg-deb -x "$deb" "$WORK/kpkg"
	kver=${kname#linux-image-} # the kernel release, e.g. 6.1.0-56-amd64
	tree=$WORK/kpkg/lib/modules/$kver
	[ -d "$tree" ] || die "$deb has no lib/modules/$kver"
	cp "$WORK/kpkg/boot/vmlinuz-$kver" "$WORK/vmlinuz"
	extract_vmlinux "$WORK/vmlinuz" "$WORK/vmlinux"

	# qemu-guest-agent and its dependencies, and bsdutils, unpacked together.
	mkdir "$WORK/agent"
	while read -r name ver; do
		deb=$(fetch_deb "$name" "$ver" "$cache")
		dpkg-deb -x "$deb" "$WORK/agent"
	done <<<"$agent_pkgs"

	# udhcpc6, built once and kept in the cache.
	"$HERE/udhcpc6-build.sh" "$cache" "$WORK/udhcpc6"

	pack=$(pack_tool)
	for flavour in wait poweroff agent; do
		build_initrd "$tree" "$flavour" "$WORK/initrd-$flavour.img" "$WORK/agent"
		"$pack" --kernel "$WORK/vmlinux" --initrd "$WORK/initrd-$flavour.img" \
			--ref "$REFS/kernel:$flavour" -o "$WORK/kernel-$flavour.tar"
		build_disk "$WORK/vmlinuz" "$WORK/initrd-$flavour.img" "$WORK/disk-$flavour.qcow2"
		"$pack" --disk "$WORK/disk-$flavour.qcow2" --ref "$REFS/disk:$flavour" -o "$WORK/disk-$flavour.tar"
	done

	for f in vmlinuz vmlinux initrd-{wait,poweroff,agent}.img disk-{wait,poweroff,agent}.qcow2 \
		{disk,kernel}-{wait,poweroff,agent}.tar; do
		mv -f "$WORK/$f" "$out/$f"
	done
	echo "$stamp" >"$out/stamp"
	log "done"
}

main "$@"
