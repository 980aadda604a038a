#!/bin/sh
# udhcpc event script of the vmshim test guest (installed as
# /etc/udhcpc/default.script). udhcpc runs it as SCRIPT EVENT with the lease
# in the environment: interface ip mask (prefix length) router dns domain
# search hostname mtu staticroutes ("dest/len gw" pairs, option 121) lease.
#
# On bound and renew it configures the interface: address, MTU, routes (the
# classless static routes of option 121 when present, which replace option 3
# as RFC 3442 says; else a default route through the first router),
# /etc/resolv.conf (through udhcpc6's script, udhcpc6.sh, which adds the
# IPv6 name servers) and the hostname. Then it prints one console line:
#   VMSHIM-LEASE if=IF ip=IP mask=LEN router=GW mtu=MTU dns=A,B search=D,E hostname=H routes=R
#   VMSHIM-RENEW if=IF ip=IP
# (VMSHIM-LEASE on bound, VMSHIM-RENEW on renew). Fields are - when empty;
# router= is the default gateway configured; routes= is the rest of the line,
# option 121 as udhcpc gave it. On bound it also writes "IF IP GW HOSTNAME"
# to the fifo /run/vmshim/leases for /init.
#
# With VMSHIM_DHCP=router-only in its environment (guest mode router-only)
# it acts like busybox's usual default.script and many appliance OSes: it
# ignores option 121 and only adds a default route through the first router
# of option 3. Then, on bound, it also prints the routes it left:
#   VMSHIM-ROUTES if=IF <route>; <route>; ...
export PATH=/bin

# gateway prints the default gateway this lease configures: the gateway of
# option 121's default route when option 121 is present, else the first
# router of option 3.
gateway() {
	if [ -n "$staticroutes" ] && [ "$VMSHIM_DHCP" != router-only ]; then
		set -- $staticroutes
		while [ $# -ge 2 ]; do
			[ "$1" = 0.0.0.0/0 ] && { echo "$2"; return; }
			shift 2
		done
		return
	fi
	set -- $router
	echo "$1"
}

# set_address gives the interface the lease's address, unless it has it.
set_address() {
	cidr=$ip/${mask:-32}
	have=$(ip -4 -o addr show dev "$interface" | awk '{print $4}')
	[ "$have" = "$cidr" ] && return
	ip -4 addr flush dev "$interface"
	ip addr add "$cidr" broadcast + dev "$interface"
}

# set_routes installs option 121's routes (on-link ones first, so gateways
# they make reachable can be used) or a default route through option 3.
# Their metric is the interface index, so with several NICs each keeps its
# routes and the first NIC's default route wins.
set_routes() {
	metric=$(cat "/sys/class/net/$interface/ifindex")
	if [ -z "$staticroutes" ] || [ "$VMSHIM_DHCP" = router-only ]; then
		set -- $router
		[ -n "$1" ] && ip route replace default via "$1" dev "$interface" metric "$metric"
		return 0
	fi
	for pass in onlink via; do
		set -- $staticroutes
		while [ $# -ge 2 ]; do
			dst=$1 via=$2
			shift 2
			if [ "$via" = 0.0.0.0 ]; then
				[ $pass = onlink ] && ip route replace "$dst" dev "$interface" metric "$metric"
			elif [ $pass = via ]; then
				ip route replace "$dst" via "$via" dev "$interface" metric "$metric" ||
					ip route replace "$dst" via "$via" dev "$interface" metric "$metric" onlink
			fi
		done
	done
	return 0
}

# write_resolv writes /etc/resolv.conf from the search list (option 119,
# else the domain name of option 15) and the DNS servers, if the lease has
# any. udhcpc6's script, where there is one, writes the file from these
# lines and the IPv6 name servers and search domains of DHCPv6 leases.
write_resolv() {
	[ -n "$dnsearch$dns" ] || return 0
	{
		[ -n "$dnsearch" ] && echo "search $dnsearch"
		for s in $dns; do
			echo "nameserver $s"
		done
	} >/etc/resolv.conf.tmp
	if [ -x /etc/udhcpc6/default.script ]; then
		/etc/udhcpc6/default.script resolv /etc/resolv.conf.tmp
	else
		mv /etc/resolv.conf.tmp /etc/resolv.conf
	fi
}

# csv joins its arguments with commas; - when there are none.
csv() {
	[ $# -gt 0 ] || { echo -; return; }
	out=$1
	shift
	for a; do out=$out,$a; done
	echo "$out"
}

configure() {
	dnsearch=${search:-$domain}
	gw=$(gateway)
	set_address
	[ -n "$mtu" ] && ip link set dev "$interface" mtu "$mtu"
	set_routes
	write_resolv
	[ -n "$hostname" ] && hostname "$hostname"
}

case $1 in
deconfig)
	ip link set dev "$interface" up
	ip -4 addr flush dev "$interface"
	;;
bound)
	configure
	line="VMSHIM-LEASE if=$interface ip=$ip mask=${mask:--} router=${gw:--} mtu=${mtu:--}"
	line="$line dns=$(csv $dns) search=$(csv $dnsearch) hostname=${hostname:--} routes=${staticroutes:--}"
	echo "$line" >/dev/console
	if [ "$VMSHIM_DHCP" = router-only ]; then
		echo "VMSHIM-ROUTES if=$interface $(ip -4 route show dev "$interface" | sed 's/ *$//' | tr '\n' ';' | sed 's/;$//; s/;/; /g')" >/dev/console
	fi
	# Tell /init, if it still waits for a first lease. Opening the fifo
	# read-write never blocks; once /init has closed it, this is dropped.
	[ -p /run/vmshim/leases ] && echo "$interface $ip ${gw:--} ${hostname:--}" 1<>/run/vmshim/leases
	;;
renew)
	configure
	echo "VMSHIM-RENEW if=$interface ip=$ip" >/dev/console
	;;
esac
exit 0
