#!/usr/bin/env bash
# Builds busybox's DHCPv6 client, udhcpc6, as one static program:
#
#   udhcpc6-build.sh CACHE DEST
#
# Debian's busybox and busybox-static leave udhcpc6 out, so build.sh puts
# this one in the test initramfs as /bin/udhcpc6, beside busybox-static's
# applets. It is built from Debian's copy of the upstream source,
# busybox_$BB_VERSION.orig.tar.bz2 from the pool of the Debian mirror
# ($VMSHIM_DEBIAN_MIRROR, else the one apt downloads busybox from), checked
# against BB_SHA256, with one fix (the IPv6 socket for unicast renewals,
# below): `make allnoconfig`, then CONFIG (static, IPv6,
# udhcpc6 with the DNS and search list options, usage text for --help, no
# shell), then `make -j2`. With one applet and no busybox applet, busybox
# builds a program that is that applet, whatever it is called.
#
# CACHE (build.sh passes its .deb cache) keeps the tarball and the program,
# udhcpc6-$BB_VERSION-KEY, KEY a hash of the version, the tarball's SHA-256,
# CONFIG and the build steps: a second run only copies it to DEST. Files
# enter CACHE by rename, so concurrent builds sharing it do not clash.
# Tools: curl, bzip2, gcc, make and libc6-dev (the static libc), from
# integration/setup/deps.sh.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_PREFIX=udhcpc6 # what log lines start with
BB_VERSION=1.35.0  # Debian bookworm's busybox (1:1.35.0-4)
BB_TARBALL=busybox_$BB_VERSION.orig.tar.bz2
BB_POOL=pool/main/b/busybox # its directory on a Debian mirror
BB_SHA256=faeeb244c35a348a334f4a59e44626ee870fb07b6884d68c10ae8bc19f83a694
# SOURCE_DATE_EPOCH for the build: the date in the usage banner, fixed
# (2021-12-26, the release) so the same source and config give the same program.
BB_EPOCH=1640476800

# CONFIG is applied on top of `make allnoconfig`. Lines naming a symbol
# replace allnoconfig's line for it; `make oldconfig` must then ask nothing
# (it runs without input and fails if it has to), and every line must be in
# the final .config. The choice of the shell for sh and bash is set to none:
# allnoconfig leaves ash chosen, which would add it as a second applet.
CONFIG='CONFIG_STATIC=y
CONFIG_FEATURE_IPV6=y
CONFIG_UDHCPC6=y
CONFIG_FEATURE_UDHCPC6_RFC3646=y
# CONFIG_FEATURE_UDHCPC6_RFC4704 is not set
# CONFIG_FEATURE_UDHCPC6_RFC4833 is not set
# CONFIG_FEATURE_UDHCPC6_RFC5970 is not set
CONFIG_UDHCPC_DEFAULT_SCRIPT="/etc/udhcpc6/default.script"
CONFIG_UDHCPC_DEFAULT_INTERFACE="eth0"
CONFIG_UDHCP_DEBUG=2
# CONFIG_FEATURE_UDHCP_PORT is not set
CONFIG_SHOW_USAGE=y
CONFIG_FEATURE_VERBOSE_USAGE=y
# CONFIG_FEATURE_COMPRESS_USAGE is not set
# CONFIG_SH_IS_ASH is not set
# CONFIG_SH_IS_HUSH is not set
CONFIG_SH_IS_NONE=y
# CONFIG_BASH_IS_ASH is not set
# CONFIG_BASH_IS_HUSH is not set
CONFIG_BASH_IS_NONE=y
# CONFIG_SHELL_ASH is not set
# CONFIG_SHELL_HUSH is not set'

# shellcheck source=lib.sh
. "$HERE/lib.sh"

# pool_url prints the URL of the directory holding the busybox source
# package on the Debian mirror: $VMSHIM_DEBIAN_MIRROR's pool, else the pool
# apt would download busybox-static from, else deb.debian.org's.
pool_url() {
	local uri
	if [ -n "${VMSHIM_DEBIAN_MIRROR:-}" ]; then
		echo "${VMSHIM_DEBIAN_MIRROR%/}/$BB_POOL"
		return
	fi
	uri=$(apt-get download --print-uris -qq busybox-static 2>/dev/null | sed -n "1s/^'\([^']*\)'.*/\1/p") || uri=
	case $uri in
	*/"$BB_POOL"/*) echo "${uri%%/"$BB_POOL"/*}/$BB_POOL" ;;
	*) echo "http://deb.debian.org/debian/$BB_POOL" ;;
	esac
}

# sha_ok FILE: whether FILE is there with BB_SHA256.
sha_ok() {
	[ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$BB_SHA256" ]
}

# fetch_tarball CACHE prints the path of the checked source tarball in
# CACHE, downloading it (two tries, 5 s apart) if it is missing or wrong.
fetch_tarball() {
	local cache=$1 url tmp attempt
	if sha_ok "$cache/$BB_TARBALL"; then
		echo "$cache/$BB_TARBALL"
		return
	fi
	url=$(pool_url)/$BB_TARBALL
	tmp=$(mktemp "$cache/.$BB_TARBALL.XXXX")
	for attempt in 1 2; do
		log "downloading $url"
		if curl -fsSL --connect-timeout 30 --max-time 600 -o "$tmp" "$url"; then
			sha_ok "$tmp" && break
			log "$url: SHA-256 $(sha256sum "$tmp" | cut -d' ' -f1), want $BB_SHA256"
		fi
		[ "$attempt" -eq 2 ] && {
			rm -f "$tmp"
			die "cannot download $url (set VMSHIM_DEBIAN_MIRROR to another Debian mirror)"
		}
		sleep 5
	done
	chmod 0644 "$tmp"
	mv -f "$tmp" "$cache/$BB_TARBALL"
	echo "$cache/$BB_TARBALL"
}

# is_static FILE: whether FILE is an ELF program with no interpreter.
is_static() {
	[ -f "$1" ] && [ -x "$1" ] && [ "$(head -c 4 "$1" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] &&
		! readelf -l "$1" 2>/dev/null | grep -q INTERP
}

# build_udhcpc6 TARBALL DIR OUT builds udhcpc6 from TARBALL in DIR into OUT.
build_udhcpc6() {
	local tarball=$1 dir=$2 out=$3 src syms line usage
	tar -xjf "$tarball" -C "$dir"
	src=$dir/busybox-$BB_VERSION
	[ -f "$src/Makefile" ] || die "$tarball has no busybox-$BB_VERSION/Makefile"
	# One fix: to renew, udhcpc6 unicasts to the server from its leased
	# address and waits for the Reply on a UDP socket, but 1.35 opens that
	# socket with udhcpc's IPv4 function, so the Reply never reaches it; it
	# then renews only by rebinding (multicast), once 30 s or less of the
	# lease remain. d6_listen_socket (d6_socket.c, unused in 1.35) is the
	# IPv6 one.
	grep -c 'client_data.sockfd = udhcp_listen_socket(/\*INADDR_ANY,\*/ CLIENT_PORT6,' \
		"$src/networking/udhcp/d6_dhcpc.c" | grep -qx 1 ||
		die "d6_dhcpc.c has not one IPv4 listen socket to replace"
	sed -i 's|client_data.sockfd = udhcp_listen_socket(/\*INADDR_ANY,\*/ CLIENT_PORT6,|client_data.sockfd = d6_listen_socket(CLIENT_PORT6,|' \
		"$src/networking/udhcp/d6_dhcpc.c"
	grep -q 'client_data.sockfd = d6_listen_socket(CLIENT_PORT6,' "$src/networking/udhcp/d6_dhcpc.c" ||
		die "d6_dhcpc.c: the IPv4 listen socket was not replaced"
	# The kconfig tools are built here too, for the host.
	(cd "$src" && make allnoconfig) >"$dir/config.log" 2>&1 ||
		die "make allnoconfig failed: $(tail -5 "$dir/config.log")"
	syms=$(sed -n 's/^\(CONFIG_[A-Z0-9_]*\)=.*/\1/p; s/^# \(CONFIG_[A-Z0-9_]*\) is not set$/\1/p' <<<"$CONFIG" | paste -sd'|')
	{
		grep -Ev "^(# )?($syms)[= ]" "$src/.config"
		echo "$CONFIG"
	} >"$src/.config.new"
	mv "$src/.config.new" "$src/.config"
	(cd "$src" && make oldconfig </dev/null) >>"$dir/config.log" 2>&1 ||
		die "make oldconfig failed: $(tail -5 "$dir/config.log")"
	while IFS= read -r line; do
		grep -qxF "$line" "$src/.config" || die "the busybox config lost '$line'"
	done <<<"$CONFIG"
	grep -qx 'CONFIG_BUSYBOX=y' "$src/.config" && die "the busybox config has the busybox applet"
	(cd "$src" && make -j2) >"$dir/make.log" 2>&1 ||
		die "make failed: $(tail -20 "$dir/make.log")"
	grep -qx '#define NUM_APPLETS 1' "$src/include/applet_tables.h" ||
		die "busybox was built with more applets than udhcpc6: $(sed -n '/applet_names/,/;/p' "$src/include/applet_tables.h" | tr '\n' ' ')"
	is_static "$src/busybox" || die "$src/busybox is not a static program"
	# Usage goes to stderr, and the program exits 1.
	usage=$("$src/busybox" --help 2>&1) || true
	grep -q '^Usage: udhcpc6 ' <<<"$usage" || die "the program built does not show udhcpc6's usage: $usage"
	cp "$src/busybox" "$out"
}

main() {
	[ $# -eq 2 ] || die "usage: udhcpc6-build.sh CACHE DEST"
	local cache=$1 dest=$2 key cached tarball dir t start=$SECONDS
	mkdir -p "$cache"
	key=$({
		echo "$BB_VERSION $BB_SHA256 $BB_EPOCH"
		echo "$CONFIG"
		declare -f build_udhcpc6
	} | sha256sum | cut -c1-16)
	cached=$cache/udhcpc6-$BB_VERSION-$key
	if ! is_static "$cached"; then
		for t in curl bzip2 gcc make; do
			command -v "$t" >/dev/null || die "missing tool: $t (run integration/setup/deps.sh)"
		done
		[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || die "no static libc (libc6-dev; run integration/setup/deps.sh)"
		tarball=$(fetch_tarball "$cache")
		log "building udhcpc6 from busybox $BB_VERSION into $cached"
		dir=$(mktemp -d "${TMPDIR:-/tmp}/udhcpc6-build.XXXX")
		# shellcheck disable=SC2064 # expand now: dir is local
		trap "rm -rf '$dir'" EXIT
		SOURCE_DATE_EPOCH=$BB_EPOCH LC_ALL=C build_udhcpc6 "$tarball" "$dir" "$dir/udhcpc6"
		cp "$dir/udhcpc6" "$cached.tmp.$$"
		mv -f "$cached.tmp.$$" "$cached"
		rm -rf "$dir"
		trap - EXIT
		log "built udhcpc6 in $((SECONDS - start)) s"
	fi
	install -m 0755 "$cached" "$dest"
}

main "$@"
