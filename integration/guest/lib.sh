# shellcheck shell=bash
# Sourced by build.sh and cloud.sh: the helpers both guest builds use. The
# sourcing script sets LOG_PREFIX (what its log lines start with) before
# sourcing, and HERE (its directory), REPO (the repository), WORK (its
# scratch directory) and STAMP_FILES (the files its stamp hashes besides
# this one) before calling them.

log() { echo "$LOG_PREFIX: $*" >&2; }
trap 'log "failed at line $LINENO: $BASH_COMMAND"' ERR
die() {
	log "$*"
	exit 1
}

# need_tools TOOL... dies unless every TOOL is on PATH and syslinux's
# mbr.bin is installed.
need_tools() {
	local t missing=()
	for t in "$@"; do
		command -v "$t" >/dev/null || missing+=("$t")
	done
	[ ${#missing[@]} -eq 0 ] || die "missing tools: ${missing[*]} (run integration/setup/deps.sh)"
	[ -f "$(syslinux_mbr)" ] || die "syslinux mbr.bin not found (package syslinux-common)"
}

syslinux_mbr() {
	local f
	for f in /usr/lib/syslinux/mbr/mbr.bin /usr/lib/SYSLINUX/mbr.bin /usr/share/syslinux/mbr.bin; do
		[ -f "$f" ] && { echo "$f"; return; }
	done
	echo /usr/lib/syslinux/mbr/mbr.bin
}

# kernel_package prints "NAME VERSION" of the kernel image package that
# linux-image-amd64 depends on, e.g. "linux-image-6.1.0-56-amd64 6.1.192-2"
# (from "Depends: linux-image-6.1.0-56-amd64 (= 6.1.192-2)"). It refreshes
# the apt lists once if they lack the metapackage.
kernel_package() {
	local info dep name ver
	info=$(apt-cache show --no-all-versions linux-image-amd64 2>/dev/null) || info=
	if [ -z "$info" ]; then
		log "apt lists lack linux-image-amd64; running apt-get update"
		apt-get update -qq >&2
		info=$(apt-cache show --no-all-versions linux-image-amd64)
	fi
	dep=$(sed -n 's/^Depends:.*\(linux-image-[^ ,]*-amd64\)\( *(= *\([^)]*\))\)\{0,1\}.*/\1 \3/p' <<<"$info")
	read -r name ver <<<"$dep" || true
	[ -n "$name" ] || die "cannot resolve the kernel package of linux-image-amd64"
	if [ -z "$ver" ]; then
		ver=$(apt-cache show --no-all-versions "$name" | sed -n 's/^Version: *//p')
	fi
	[ -n "$ver" ] || die "no version for $name"
	echo "$name $ver"
}

# fetch_deb NAME VERSION CACHE prints the path of the .deb in CACHE,
# downloading it if absent.
fetch_deb() {
	local name=$1 ver=$2 cache=$3 f
	mkdir -p "$cache"
	for f in "$cache/${name}"_*.deb; do
		[ -f "$f" ] && [ "$(dpkg-deb -f "$f" Version)" = "$ver" ] && { echo "$f"; return; }
	done
	log "downloading $name=$ver into $cache"
	local opts=()
	# As root, apt drops to _apt for downloads, which cannot write to a
	# cache owned by root; download as root instead.
	[ "$(id -u)" -eq 0 ] && opts=(-o APT::Sandbox::User=root)
	(cd "$cache" && apt-get download -qq "${opts[@]}" "$name=$ver" >&2)
	for f in "$cache/${name}"_*.deb; do
		[ -f "$f" ] && [ "$(dpkg-deb -f "$f" Version)" = "$ver" ] && { echo "$f"; return; }
	done
	die "apt-get download $name=$ver left no .deb in $cache"
}

# stamp_of ARGS... hashes what the artefacts depend on: STAMP_FILES, this
# file, the vmshim-pack sources and ARGS (package versions and the like).
stamp_of() {
	{
		cat "${STAMP_FILES[@]}" "$HERE/lib.sh"
		local f
		for f in "$REPO"/cmd/vmshim-pack/*.go; do
			case $f in *_test.go) ;; *) [ -f "$f" ] && cat "$f" ;; esac
		done
		echo "$@"
	} | sha256sum | cut -d' ' -f1
}

# install_busybox ROOT copies the host's busybox, which must be static, into
# ROOT/bin with a symlink for each of its applets.
install_busybox() {
	local root=$1 applet
	cp "$(command -v busybox)" "$root/bin/busybox"
	grep -q INTERP <<<"$(readelf -l "$root/bin/busybox")" &&
		die "busybox is dynamically linked; install busybox-static"
	for applet in $(busybox --list); do
		[ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
	done
}

# newc_chardev NAME MAJOR MINOR writes a one-entry newc cpio archive holding
# a character device, so the initramfs has /dev/console without mknod (and
# without root) at build time. Header: magic + 13 eight-digit hex fields.
newc_chardev() {
	local name=$1 major=$2 minor=$3 namesize=$((${#1} + 1))
	printf '070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X' \
		1 $((0020000 | 0600)) 0 0 1 0 0 0 0 "$major" "$minor" "$namesize" 0
	printf '%s\0' "$name"
	# header (110) + name is padded to a multiple of 4.
	head -c $(((4 - (110 + namesize) % 4) % 4)) /dev/zero
}

# newc_trailer writes the end-of-archive entry.
newc_trailer() {
	printf '070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X' \
		0 0 0 0 1 0 0 0 0 0 0 11 0
	printf 'TRAILER!!!\0'
	head -c $(((4 - (110 + 11) % 4) % 4)) /dev/zero
}

# pack_initrd ROOT OUT writes the tree ROOT, owned by root, as a gzip'd newc
# initramfs to OUT, /dev/console included.
pack_initrd() {
	local root=$1 out=$2
	{
		(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0)
		# A second archive: the kernel unpacks concatenated cpio archives.
		newc_chardev dev/console 5 1
		newc_trailer
	} | gzip -9 -n >"$out"
}

# boot_partition IMG LABEL START_MIB SIZE_MIB VMLINUZ INITRD APPEND makes IMG
# a FAT16 partition image of SIZE_MIB, for a partition at START_MIB, holding
# the kernel and initramfs and made bootable by syslinux's mtools installer,
# which boots them on the serial console with kernel command line APPEND.
boot_partition() {
	local img=$1 label=$2 start=$3 size=$4 kernel=$5 initrd=$6 append=$7
	cat >"$WORK/syslinux.cfg" <<-EOF
		SERIAL 0 115200
		DEFAULT linux
		PROMPT 0
		TIMEOUT 0
		LABEL linux
		  KERNEL vmlinuz
		  INITRD initrd.img
		  APPEND $append
	EOF
	# -h: hidden sectors = the partition's start LBA, used by the boot sector.
	mkfs.fat -C -F 16 -n "$label" -h $((start * 2048)) "$img" $((size * 1024)) >/dev/null
	MTOOLS_SKIP_CHECK=1 mcopy -i "$img" "$kernel" ::vmlinuz
	MTOOLS_SKIP_CHECK=1 mcopy -i "$img" "$initrd" ::initrd.img
	MTOOLS_SKIP_CHECK=1 mcopy -i "$img" "$WORK/syslinux.cfg" ::syslinux.cfg
	syslinux --install "$img"
}

# pack_tool prints the vmshim-pack binary: $VMSHIM_PACK, else built from
# the repository into the work dir.
pack_tool() {
	if [ -n "${VMSHIM_PACK:-}" ]; then
		echo "$VMSHIM_PACK"
		return
	fi
	command -v go >/dev/null || die "go not found; set VMSHIM_PACK"
	(cd "$REPO" && go build -o "$WORK/vmshim-pack" ./cmd/vmshim-pack)
	echo "$WORK/vmshim-pack"
}
