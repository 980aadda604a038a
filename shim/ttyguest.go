package shim

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"

	"github.com/vmshim/vmshim/launch"
)

// The programs a terminal session runs in the guest, through the agent's
// guest-exec, with nothing but a POSIX sh and util-linux's script:
//
//   - ttyRunScript finds util-linux's script and the session's port, opens
//     the port (a virtio port opens once: stdin, stdout and stderr share
//     it), reads the window size the shim writes first, and becomes
//     `script -q -e -c CMD /dev/null`. script puts CMD on a new pty as a
//     session leader; its exit code is CMD's (128+signal when killed).
//   - ttyResizeScript sets the size of the pty of script's child with
//     stty, which also makes the kernel send SIGWINCH.
//   - ttySignalScript signals script's child, the program; script itself
//     would answer a signal with a message and exit 0.
const (
	// guestShell runs the programs.
	guestShell = "/bin/sh"
	// guestPath is the PATH of the resize and signal programs.
	guestPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// ttyRunName, ttyResizeName and ttySignalName are the programs' $0.
	ttyRunName    = "vmshim-tty"
	ttyResizeName = "vmshim-tty-resize"
	ttySignalName = "vmshim-tty-signal"
	// ttyNoScript is ttyRunScript's exit code when the guest has no
	// util-linux script; ttyNoPort when the port never shows up.
	ttyNoScript = 127
	ttyNoPort   = 125
)

// ttyRunScript: $1 is the port's name, $2 the command line for script.
const ttyRunScript = `name=$1 cmd=$2
s=
IFS=:
for d in ${PATH-} /usr/bin /bin /usr/local/bin; do
	[ -n "$d" ] && [ -x "$d/script" ] || continue
	case $("$d/script" -V 2>/dev/null) in
	*util-linux*) s=$d/script; break ;;
	esac
done
unset IFS
if [ -z "$s" ]; then
	echo "the guest has no util-linux script, which a terminal needs (install util-linux or bsdutils)" >&2
	exit 127
fi
dev= i=0
while [ $i -lt 100 ]; do
	for p in /sys/class/virtio-ports/*; do
		v=
		read -r v 2>/dev/null <"$p/name"
		if [ "$v" = "$name" ] && [ -c "/dev/${p##*/}" ]; then
			dev=/dev/${p##*/}
			break 2
		fi
	done
	sleep 0.1
	i=$((i + 1))
done
if [ -z "$dev" ]; then
	echo "no virtio-serial port $name in the guest (is virtio_console loaded?)" >&2
	exit 125
fi
exec 0<>"$dev" 1>&0 2>&0
read -r rows cols
case $rows in '' | *[!0-9]*) rows=24 ;; esac
case $cols in '' | *[!0-9]*) cols=80 ;; esac
SHELL=/bin/sh
export SHELL
exec "$s" -q -e -c "stty rows $rows cols $cols 2>/dev/null; $cmd" /dev/null
`

// ttyChildOf sets c to the pid of $1's child (script's), or to nothing.
const ttyChildOf = `child_of() {
	c=
	if [ -r "/proc/$1/task/$1/children" ]; then
		read -r c _ 2>/dev/null <"/proc/$1/task/$1/children"
		return
	fi
	for s in /proc/[0-9]*/status; do
		while read -r k v; do
			if [ "$k" = PPid: ]; then
				[ "$v" != "$1" ] || { c=${s%/status}; c=${c#/proc/}; }
				break
			fi
		done 2>/dev/null <"$s"
		[ -z "$c" ] || return
	done
}
`

// ttyResizeScript: $1 is script's pid, $2 and $3 the rows and columns.
// The pty is the controlling terminal of script's child (tty_nr, the
// seventh field of its stat); Unix98 pty slaves have majors 136 to 143.
const ttyResizeScript = ttyChildOf + `pid=$1 rows=$2 cols=$3 i=0
while [ $i -lt 30 ]; do
	child_of "$pid"
	st=
	[ -z "$c" ] || read -r st 2>/dev/null <"/proc/$c/stat"
	if [ -n "$st" ]; then
		set -- ${st##*) }
		maj=$((($5 >> 8) & 4095)) min=$((($5 & 255) | (($5 >> 12) & 1048320)))
		if [ $maj -ge 136 ] && [ $maj -le 143 ]; then
			exec stty -F "/dev/pts/$(((maj - 136) * 256 + min))" rows "$rows" cols "$cols"
		fi
	fi
	sleep 0.1
	i=$((i + 1))
done
echo "no terminal found for guest pid $pid" >&2
exit 1
`

// ttySignalScript: $1 is script's pid, $2 the signal number. Before
// script has a child, script itself is signalled.
const ttySignalScript = ttyChildOf + `child_of "$1"
exec kill -"$2" "${c:-$1}"
`

// maxTermSize bounds the rows and columns of a window: far beyond any
// screen, and the guest's programs allocate rows × columns cells.
const maxTermSize = 4096

// defaultSize is the window size when the client gives none in time.
var defaultSize = winSize{rows: 24, cols: 80}

// winSize is a terminal's size in character cells.
type winSize struct{ rows, cols uint32 }

// clampSize turns ResizePty's width and height into a window size, each
// at most maxTermSize. Zero stays zero: the size is unknown.
func clampSize(width, height uint32) winSize {
	return winSize{rows: min(height, maxTermSize), cols: min(width, maxTermSize)}
}

// header is what the shim writes first on the port: the size ttyRunScript
// reads before the program starts.
func (w winSize) header() []byte { return []byte(fmt.Sprintf("%d %d\n", w.rows, w.cols)) }

// shellQuote quotes s as one word for a POSIX shell: in single quotes,
// where nothing is special; at each single quote of s the quoting ends,
// the quote is written escaped (\') and the quoting starts again.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// shellWords quotes args as words of a POSIX shell command line. A NUL
// cannot be in a program's argument, so an argument with one is refused.
func shellWords(args []string) (string, error) {
	words := make([]string, len(args))
	for i, a := range args {
		if strings.IndexByte(a, 0) >= 0 {
			return "", fmt.Errorf("argument %d contains a NUL byte: %w", i, errdefs.ErrInvalidArgument)
		}
		words[i] = shellQuote(a)
	}
	return strings.Join(words, " "), nil
}

// ttyCommandLine is the command line script runs the program with: it
// gives the program back the SHELL of env (script ran with SHELL=/bin/sh)
// and execs args.
func ttyCommandLine(args, env []string) (string, error) {
	words, err := shellWords(args)
	if err != nil {
		return "", err
	}
	restore := "unset SHELL; "
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "SHELL="); ok {
			if strings.IndexByte(v, 0) >= 0 {
				return "", fmt.Errorf("environment variable SHELL contains a NUL byte: %w", errdefs.ErrInvalidArgument)
			}
			restore = "SHELL=" + shellQuote(v) + "; export SHELL; "
		}
	}
	return restore + "exec " + words, nil
}

// ttyEnv is the environment of a terminal's program: env with TERM=xterm
// when env sets no TERM. A nil env stays nil: the program then gets the
// agent's environment, as a program without a terminal does.
func ttyEnv(env []string) []string {
	if env == nil {
		return nil
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, "TERM=") {
			return env
		}
	}
	return append(append([]string(nil), env...), "TERM=xterm")
}

// ttyRunCommand runs ttyRunScript for the port and command line.
func ttyRunCommand(port, cmdline string, env []string) launch.GuestCommand {
	return launch.GuestCommand{Path: guestShell, Args: []string{"-c", ttyRunScript, ttyRunName, port, cmdline}, Env: env}
}

// ttyResizeCommand runs ttyResizeScript for script's pid.
func ttyResizeCommand(pid int, w winSize) launch.GuestCommand {
	return launch.GuestCommand{Path: guestShell, Env: []string{guestPath}, Args: []string{
		"-c", ttyResizeScript, ttyResizeName, strconv.Itoa(pid),
		strconv.FormatUint(uint64(w.rows), 10), strconv.FormatUint(uint64(w.cols), 10),
	}}
}

// ttySignalCommand runs ttySignalScript for script's pid.
func ttySignalCommand(pid int, sig syscall.Signal) launch.GuestCommand {
	return launch.GuestCommand{Path: guestShell, Env: []string{guestPath}, Args: []string{
		"-c", ttySignalScript, ttySignalName, strconv.Itoa(pid), strconv.Itoa(int(sig)),
	}}
}

// maxMessage bounds, in characters, what errors quote of a guest program.
const maxMessage = 200

// guestMessage makes what a guest program wrote one short, printable line.
func guestMessage(b []byte) string {
	s := strings.ToValidUTF8(string(b), "?")
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > maxMessage {
		s = string(r[:maxMessage]) + "..."
	}
	return s
}
