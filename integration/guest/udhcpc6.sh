#!/bin/sh
# udhcpc6 event script of the vmshim test guest (installed as
# /etc/udhcpc6/default.script). busybox 1.35's udhcpc6 runs it as
# SCRIPT EVENT with, in the environment, interface and, from the Reply:
# ipv6 (the IA_NA address) and lease (its valid lifetime, s), dns (option 23)
# and search (option 24), space-separated. Addresses come fully written out
# (fd00:0000:...:0005); the script prints them as RFC 5952 has them
# (fd00::5), as the host's tools do.
#
# The kernel handles the router advertisements itself: the on-link prefix
# (A=0, so no SLAAC address), the default route through the router's
# link-local address, the MTU. So on bound and renew the script only gives
# the interface the lease's address as ADDR/128 (unless it has it; a
# different address from an earlier lease is removed), writes
# /etc/resolv.conf and prints one console line:
#   VMSHIM-LEASE6 if=IF ip=ADDR dns=A,B search=D,E
#   VMSHIM-RENEW6 if=IF ip=ADDR
# (VMSHIM-LEASE6 on bound, once duplicate address detection is over, 3 s at
# most; VMSHIM-RENEW6 on renew; - for an empty field).
# An address that fails duplicate address detection, or is still tentative
# after 3 s, gets a VMSHIM-GUEST-WARNING line first.
#
# /etc/resolv.conf is made of the IPv4 lease's lines (udhcpc.sh's: search,
# then name servers), then the IPv6 name servers, the IPv6 search domains
# joining the one search line. udhcpc.sh hands its lines over through the
# private event "resolv FILE" rather than writing the file itself, so
# either lease coming or going keeps the other's. The IPv6 part of each
# interface is kept in /run/vmshim/resolv6.IF, the IPv4 part in
# /run/vmshim/resolv.v4; without an IPv6 part the file is the IPv4 lines as
# they are.
#
# deconfig (udhcpc6 starting, or the lease lost) removes the address this
# script added, if any, and the interface's IPv6 name servers; IPv4
# addresses and the link-local address are left alone.
export PATH=/bin

run=/run/vmshim
addr_file=$run/dhcp6.$interface   # the address this script gave the interface
resolv6=$run/resolv6.$interface   # the interface's IPv6 resolv.conf lines
resolv4=$run/resolv.v4            # udhcpc.sh's lines

# canon6 ADDR... prints each IPv6 address in RFC 5952's form, space-separated:
# lower case, no leading zeros, the longest run of two or more zero groups
# (the first of equals) as ::.
canon6() {
	[ $# -gt 0 ] || return 0
	echo "$@" | awk '
	function canon(a,   n, i, j, g, h, k, best, bestlen, len, out) {
		a = tolower(a)
		if (index(a, "::")) {
			# Expand "::" to as many zero groups as are missing.
			h = substr(a, 1, index(a, "::") - 1)
			k = substr(a, index(a, "::") + 2)
			n = (h == "" ? 0 : split(h, g, ":")) + (k == "" ? 0 : split(k, g, ":"))
			out = h
			for (i = n; i < 8; i++)
				out = out (out == "" ? "" : ":") "0"
			a = out (k == "" ? "" : ":" k)
		}
		n = split(a, g, ":")
		if (n != 8)
			return a
		for (i = 1; i <= 8; i++) {
			sub(/^0+/, "", g[i])
			if (g[i] == "")
				g[i] = "0"
		}
		best = 0; bestlen = 1
		for (i = 1; i <= 8; i = j + 1) {
			for (j = i; j <= 8 && g[j] == "0"; j++)
				;
			len = j - i
			if (len > bestlen) { best = i; bestlen = len }
		}
		out = ""
		for (i = 1; i <= 8; i++) {
			if (i == best) {
				out = out "::"
				i += bestlen - 1
				continue
			}
			if (out != "" && substr(out, length(out)) != ":")
				out = out ":"
			out = out g[i]
		}
		return out
	}
	{
		for (i = 1; i <= NF; i++)
			printf "%s%s", (i > 1 ? " " : ""), canon($i)
		print ""
	}'
}

# csv joins its arguments with commas; - when there are none.
csv() {
	[ $# -gt 0 ] || { echo -; return; }
	out=$1
	shift
	for a; do out=$out,$a; done
	echo "$out"
}

# has_addr ADDR: whether the interface has ADDR/128.
has_addr() {
	ip -6 -o addr show dev "$interface" | awk '{print $4}' | grep -qxF "$1/128"
}

# wait_dad ADDR waits, 3 s at most, until ADDR on the interface is past
# duplicate address detection, and warns if it failed or is not over.
wait_dad() {
	for _ in $(seq 30); do
		flags=$(ip -6 -o addr show dev "$interface" | awk -v a="$1/128" '$4 == a')
		case $flags in
		*dadfailed*)
			echo "VMSHIM-GUEST-WARNING: IPv6 address $1 on $interface failed duplicate address detection" >/dev/console
			return
			;;
		*tentative*) sleep 0.1 ;;
		*) return ;;
		esac
	done
	echo "VMSHIM-GUEST-WARNING: IPv6 address $1 on $interface still tentative after 3 s" >/dev/console
}

# set_address gives the interface the lease's address, unless it has it,
# and removes the one an earlier lease gave it, if different.
set_address() {
	old=$(cat "$addr_file" 2>/dev/null)
	if [ -n "$old" ] && [ "$old" != "$addr" ]; then
		ip -6 addr del "$old/128" dev "$interface" 2>/dev/null
		rm -f "$addr_file"
	fi
	[ -n "$addr" ] || return 0
	has_addr "$addr" || ip -6 addr add "$addr/128" dev "$interface" ||
		echo "VMSHIM-GUEST-WARNING: cannot add $addr/128 to $interface" >/dev/console
	echo "$addr" >"$addr_file"
}

# lock and unlock serialize the writers of /etc/resolv.conf (both scripts,
# every interface). After 5 s of waiting, lock goes on without the lock.
lock() {
	for _ in $(seq 100); do
		mkdir "$run/resolv.lock" 2>/dev/null && return
		sleep 0.05
	done
}
unlock() {
	rmdir "$run/resolv.lock" 2>/dev/null
}

# write_resolv writes /etc/resolv.conf from resolv.v4 and every resolv6.*:
# one search line (the IPv4 domains, then the IPv6 ones not among them),
# then the IPv4 name servers, then the IPv6 ones. Without IPv6 lines it is
# resolv.v4 as it is; with nothing at all it is left alone.
write_resolv() {
	set -- "$run"/resolv6.*
	[ -f "$1" ] || set --
	if [ $# -eq 0 ]; then
		[ -f "$resolv4" ] && cp "$resolv4" /etc/resolv.conf.tmp6 && mv /etc/resolv.conf.tmp6 /etc/resolv.conf
		return 0
	fi
	[ -f "$resolv4" ] && set -- "$resolv4" "$@"
	awk '
	$1 == "search" { for (i = 2; i <= NF; i++) if (!($i in seen)) { seen[$i] = 1; search = search " " $i } }
	$1 == "nameserver" && !($2 in ns) { ns[$2] = 1; servers = servers "nameserver " $2 "\n" }
	END {
		if (search != "") print "search" search
		printf "%s", servers
	}' "$@" >/etc/resolv.conf.tmp6
	mv /etc/resolv.conf.tmp6 /etc/resolv.conf
}

# set_resolv keeps the lease's name servers and search domains as the
# interface's IPv6 part of /etc/resolv.conf and writes the file.
set_resolv() {
	lock
	if [ -n "$dns$search" ]; then
		{
			[ -z "$search" ] || echo "search $search"
			for s in $dns; do
				echo "nameserver $s"
			done
		} >"$resolv6"
	else
		rm -f "$resolv6"
	fi
	write_resolv
	unlock
}

configure() {
	addr=$(canon6 $ipv6)
	dns=$(canon6 $dns)
	set_address
	set_resolv
}

mkdir -p "$run"
case $1 in
deconfig)
	old=$(cat "$addr_file" 2>/dev/null)
	if [ -n "$old" ]; then
		ip -6 addr del "$old/128" dev "$interface" 2>/dev/null
		rm -f "$addr_file"
	fi
	if [ -f "$resolv6" ]; then
		lock
		rm -f "$resolv6"
		write_resolv
		unlock
	fi
	;;
bound)
	configure
	[ -z "$addr" ] || wait_dad "$addr"
	echo "VMSHIM-LEASE6 if=$interface ip=${addr:--} dns=$(csv $dns) search=$(csv $search)" >/dev/console
	;;
renew)
	configure
	echo "VMSHIM-RENEW6 if=$interface ip=${addr:--}" >/dev/console
	;;
resolv)
	# From udhcpc.sh: $2 holds the IPv4 lease's lines.
	lock
	mv "$2" "$resolv4"
	write_resolv
	unlock
	;;
esac
exit 0
