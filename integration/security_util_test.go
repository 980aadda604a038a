package integration

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/thread"
)

// secFrame is a DHCP message a sniffer saw, with the interface it was on.
type secFrame struct {
	ifindex int
	msg     *dhcpv4.DHCPv4
}

// secSniffer records the DHCP frames on every interface of a network
// namespace, those sent as well as those received.
type secSniffer struct {
	fd     int
	done   chan struct{}
	mu     sync.Mutex // guards seen
	seen   []secFrame
	frames int // all frames seen; read after stop
}

// secSniff starts a sniffer in the network namespace at nsPath.
func secSniff(t *testing.T, nsPath string) *secSniffer {
	t.Helper()
	s := &secSniffer{fd: -1, done: make(chan struct{})}
	err := inNetns(nsPath, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(secHtons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		s.fd = fd
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
		tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	if err != nil {
		if s.fd >= 0 {
			unix.Close(s.fd)
		}
		t.Fatalf("packet socket in %s: %v", nsPath, err)
	}
	go s.run()
	t.Cleanup(func() { s.stop() })
	return s
}

func (s *secSniffer) run() {
	defer close(s.done)
	buf := make([]byte, 65536)
	for {
		n, from, err := unix.Recvfrom(s.fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return // closed by stop
		}
		s.frames++
		ll, _ := from.(*unix.SockaddrLinklayer)
		if msg := secParseDHCP(buf[:n]); msg != nil && ll != nil {
			s.mu.Lock()
			s.seen = append(s.seen, secFrame{ifindex: ll.Ifindex, msg: msg})
			s.mu.Unlock()
		}
	}
}

// stop ends the capture and returns the DHCP frames seen.
func (s *secSniffer) stop() []secFrame {
	s.mu.Lock()
	fd := s.fd
	s.fd = -1
	s.mu.Unlock()
	if fd >= 0 {
		_ = unix.Shutdown(fd, unix.SHUT_RDWR)
		unix.Close(fd)
		<-s.done
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen
}

// secParseDHCP returns the DHCP message of an Ethernet/IPv4/UDP frame to
// or from port 67 or 68, and nil for any other frame.
func secParseDHCP(frame []byte) *dhcpv4.DHCPv4 {
	if len(frame) < 14+20+8 || frame[12] != 0x08 || frame[13] != 0x00 {
		return nil
	}
	ip := frame[14:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[9] != unix.IPPROTO_UDP || len(ip) < ihl+8 {
		return nil
	}
	udp := ip[ihl:]
	src, dst := int(udp[0])<<8|int(udp[1]), int(udp[2])<<8|int(udp[3])
	if src != 67 && src != 68 && dst != 67 && dst != 68 {
		return nil
	}
	msg, err := dhcpv4.FromBytes(udp[8:])
	if err != nil {
		// Still a DHCP-port frame: report it unparsed.
		msg = &dhcpv4.DHCPv4{ClientHWAddr: net.HardwareAddr(frame[6:12])}
	}
	return msg
}

func secHtons(v uint16) uint16 { return v<<8 | v>>8 }

// secQEMU returns the pid and argv of the QEMU process that runs VM id.
func secQEMU(t *testing.T, id string) (int, []string) {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(data) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
		if strings.HasPrefix(filepath.Base(argv[0]), "qemu-system") && secHasPair(argv, "-name", "guest="+id+",debug-threads=on") {
			return pid, argv
		}
	}
	t.Fatalf("no qemu process for %s", id)
	return 0, nil
}

// secStatus returns the fields of /proc/PID/status.
func secStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	st := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			st[k] = strings.TrimSpace(v)
		}
	}
	return st
}

func secHasPair(argv []string, flag, value string) bool {
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] == flag && argv[i+1] == value {
			return true
		}
	}
	return false
}

// secSocketNamed reports whether socket fd of process pid, or its peer,
// has an address (a path or an abstract name), taking the fd with
// pidfd_getfd. A socketpair's ends have none: the kernel returns only the
// address family.
func secSocketNamed(t *testing.T, pid, fd int) bool {
	t.Helper()
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(pidfd)
	dup, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		t.Fatalf("pidfd_getfd %d fd %d: %v", pid, fd, err)
	}
	defer unix.Close(dup)
	named := false
	for _, call := range []uintptr{unix.SYS_GETSOCKNAME, unix.SYS_GETPEERNAME} {
		var sa unix.RawSockaddrUnix
		size := uint32(unsafe.Sizeof(sa))
		if _, _, errno := unix.Syscall(call, uintptr(dup), uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&size))); errno != 0 {
			t.Fatalf("socket name of fd %d: %v", fd, errno)
		}
		if sa.Family != unix.AF_UNIX {
			t.Fatalf("fd %d is a socket of family %d, want a unix socket", fd, sa.Family)
		}
		named = named || size > uint32(unsafe.Sizeof(sa.Family))
	}
	return named
}

// secAsUser is the thread.Step that sets the thread's file system ids
// to uid and gid, so that the kernel checks its path lookups and opens as
// that user's; its undo sets them back to root's.
func secAsUser(uid, gid int) thread.Step {
	return func() (func() bool, error) {
		_, _ = unix.SetfsgidRetGid(gid)
		_, _ = unix.SetfsuidRetUid(uid)
		back := func() bool {
			_, _ = unix.SetfsuidRetUid(0)
			_, _ = unix.SetfsgidRetGid(0)
			cur, _ := unix.SetfsuidRetUid(-1)
			return cur == 0
		}
		if cur, _ := unix.SetfsuidRetUid(-1); cur != uid {
			return back, fmt.Errorf("setfsuid %d did not take", uid)
		}
		return back, nil
	}
}

// secConnect connects to the unix socket at path and hangs up.
func secConnect(path string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Connect(fd, &unix.SockaddrUnix{Name: path})
}

// secOpenSocket listens on a socket every user may connect to.
func secOpenSocket(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vmshim-sec-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "open.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o777); err != nil {
		t.Fatal(err)
	}
	return path
}

// secIDs returns the uid and gid of user name.
func secIDs(t *testing.T, name string) (uid, gid int) {
	t.Helper()
	u, err := user.Lookup(name)
	if err == nil {
		uid, err = strconv.Atoi(u.Uid)
	}
	if err == nil {
		gid, err = strconv.Atoi(u.Gid)
	}
	if err != nil {
		t.Fatalf("user %s: %v", name, err)
	}
	return uid, gid
}
