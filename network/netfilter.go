package network

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"slices"
	"unsafe"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/thread"
)

// Steering names the netfilter rules of the network namespace at path
// that steer the pod's traffic through a proxy of the netns, as a
// service mesh's init container installs them (istio-init, linkerd-init):
// a rule in the PREROUTING chain of the nat or mangle table (REDIRECT,
// TPROXY) or in the OUTPUT chain of the nat table, IPv4 or IPv6, written
// through either of the kernel's interfaces (nf_tables, as iptables-nft
// and nft write; x_tables, as iptables-legacy writes). None is nil.
//
// The VM's packets never meet them: the tc datapath moves them between
// the CNI interface and the tap before netfilter sees them (see
// docs/kubernetes.md, service meshes). Steering reads the rules and
// changes nothing: it instantiates no table the netns did not have.
func Steering(path string) ([]string, error) {
	ns, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("netfilter rules: %w", err)
	}
	defer ns.Close()
	found, err := nftSteering(int(ns.Fd()))
	if err != nil {
		return nil, err
	}
	var legacy []string
	err = thread.Run(func() (err error) {
		legacy, err = xtSteering()
		return err
	}, thread.JoinNetns(path))
	if err != nil {
		return nil, err
	}
	return append(found, legacy...), nil
}

// steeringHook tells whether a base chain of table type typ at hook
// steers traffic: nat's PREROUTING and OUTPUT, and PREROUTING of any
// other type (mangle's, where TPROXY sits).
func steeringHook(typ nftables.ChainType, hook uint32) bool {
	switch hook {
	case unix.NF_INET_PRE_ROUTING:
		return true
	case unix.NF_INET_LOCAL_OUT:
		return typ == nftables.ChainTypeNAT
	}
	return false
}

// nftSteering lists the base chains of the netns's nf_tables that
// steer traffic and hold a rule.
func nftSteering(nsFD int) ([]string, error) {
	c, err := nftables.New(nftables.WithNetNSFd(nsFD))
	if err != nil {
		return nil, fmt.Errorf("netfilter rules: nf_tables: %w", err)
	}
	chains, err := c.ListChains()
	if err != nil {
		if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ENOENT) {
			return nil, nil // no nf_tables in this kernel
		}
		return nil, fmt.Errorf("netfilter rules: nf_tables chains: %w", err)
	}
	var found []string
	for _, ch := range chains {
		if ch.Hooknum == nil || ch.Table == nil || !slices.Contains(inetFamilies, ch.Table.Family) || !steeringHook(ch.Type, uint32(*ch.Hooknum)) {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return nil, fmt.Errorf("netfilter rules: nf_tables chain %s %s: %w", ch.Table.Name, ch.Name, err)
		}
		if len(rules) > 0 {
			found = append(found, fmt.Sprintf("nf_tables %s table %s chain %s", familyName(ch.Table.Family), ch.Table.Name, ch.Name))
		}
	}
	return found, nil
}

// inetFamilies are the nf_tables families whose chains see IP packets.
var inetFamilies = []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6, nftables.TableFamilyINet}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	}
	return "inet"
}

// xtTable is an x_tables table of one family, as iptables-legacy and
// ip6tables-legacy see it, and the built-in chains of it that steer.
type xtTable struct {
	cmd    string // the command that writes it, for messages
	names  string // the netns's list of the family's tables in use
	family int
	level  int // getsockopt level
	name   string
	chains []xtChain
}

// xtChain is a built-in chain: its hook, and its name.
type xtChain struct {
	hook uint32
	name string
}

var (
	natChains    = []xtChain{{unix.NF_INET_PRE_ROUTING, "PREROUTING"}, {unix.NF_INET_LOCAL_OUT, "OUTPUT"}}
	mangleChains = []xtChain{{unix.NF_INET_PRE_ROUTING, "PREROUTING"}}
	xtTables     = []xtTable{
		{"iptables-legacy", "ip_tables_names", unix.AF_INET, unix.SOL_IP, "nat", natChains},
		{"iptables-legacy", "ip_tables_names", unix.AF_INET, unix.SOL_IP, "mangle", mangleChains},
		{"ip6tables-legacy", "ip6_tables_names", unix.AF_INET6, unix.SOL_IPV6, "nat", natChains},
		{"ip6tables-legacy", "ip6_tables_names", unix.AF_INET6, unix.SOL_IPV6, "mangle", mangleChains},
	}
)

// xtGetInfo is struct ipt_getinfo (and ip6t_getinfo, the same).
type xtGetInfo struct {
	Name       [32]byte
	ValidHooks uint32
	HookEntry  [unix.NF_INET_NUMHOOKS]uint32
	Underflow  [unix.NF_INET_NUMHOOKS]uint32
	NumEntries uint32
	Size       uint32
}

// soGetInfo is IPT_SO_GET_INFO and IP6T_SO_GET_INFO.
const soGetInfo = 64

// xtSteering lists the x_tables chains of the calling thread's netns
// that steer traffic and hold a rule. It asks only for tables the netns
// has in use (the kernel makes a table for a netns the first time it is
// asked for it), and reads the chains' bounds, not their rules: a
// built-in chain holds a rule when its first entry is not its policy.
func xtSteering() ([]string, error) {
	var found []string
	for _, tb := range xtTables {
		used, err := xtTablesInUse(tb.names)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(used, tb.name) {
			continue
		}
		info, err := xtInfo(tb.family, tb.level, tb.name)
		if err != nil {
			return nil, fmt.Errorf("netfilter rules: %s table %s: %w", tb.cmd, tb.name, err)
		}
		for _, ch := range tb.chains {
			if info.ValidHooks&(1<<ch.hook) != 0 && info.HookEntry[ch.hook] != info.Underflow[ch.hook] {
				found = append(found, fmt.Sprintf("%s table %s chain %s", tb.cmd, tb.name, ch.name))
			}
		}
	}
	return found, nil
}

// xtTablesInUse reads the calling thread's netns's list of x_tables
// tables of a family; none when the kernel has no x_tables for it.
func xtTablesInUse(names string) ([]string, error) {
	f, err := os.Open("/proc/thread-self/net/" + names)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("netfilter rules: %w", err)
	}
	defer f.Close()
	var used []string
	sc := bufio.NewScanner(f)
	for sc.Scan() && len(used) < 64 {
		used = append(used, sc.Text())
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("netfilter rules: %s: %w", names, err)
	}
	return used, nil
}

// xtInfo asks the kernel for the bounds of an x_tables table.
func xtInfo(family, level int, name string) (*xtGetInfo, error) {
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var info xtGetInfo
	copy(info.Name[:len(info.Name)-1], name)
	size := uint32(unsafe.Sizeof(info))
	if _, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), soGetInfo,
		uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&size)), 0); errno != 0 {
		return nil, errno
	}
	return &info, nil
}
