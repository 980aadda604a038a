package guestconsole

import (
	"bytes"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// What the kernels print, Linux's after its printk prefix, FreeBSD's at
// column 0.
const (
	linuxPanic   = "Kernel panic - not syncing: "
	linuxTrailer = "---[ end Kernel panic - not syncing: "
	trailerEnd   = " ]---"
	linuxHalted  = "reboot: System halted"
	linuxCPU     = "CPU: "                       // dump_stack's first line: "CPU: 0 PID: 1 Comm: swapper/0 ..."
	linuxOffset  = "Kernel Offset: "             // x86's panic notifier
	linuxNMI     = "Shutting down cpus with NMI" // the other CPUs stopped
	bsdPanic     = "panic: "
	bsdCPUID     = "cpuid = "
)

const (
	// panicReason starts the reason of a kernel panic.
	panicReason = "kernel panic"
	// haltedReason is the reason of a guest that halted.
	haltedReason = "the guest halted: " + linuxHalted
	// maxMessage bounds, in bytes, the kernel's message a reason quotes.
	maxMessage = 200
	// maxReason bounds a reason's length in bytes.
	maxReason = len(panicReason+": ") + maxMessage + len(ellipsis)
	// ellipsis ends a message that was cut.
	ellipsis = "..."
	// linuxWindow is how many lines after Linux's panic line the rest of
	// its report must begin: dump_stack's first line follows at once, and
	// after an oops's panic the offset or the trailer within a few.
	linuxWindow = 64
	// bsdWindow is how many lines after FreeBSD's "panic: " line its
	// "cpuid = " line may come.
	bsdWindow = 3
	// maxStampDigits bounds the seconds of a kernel timestamp: below 1e8 s,
	// three years of uptime. Longer ones are garbage.
	maxStampDigits = 8
)

// lineStart skips the colour and erase-line escapes (ESC [ digits and
// semicolons, then m or K) at the start of a line: they move nothing, so
// what follows is still at column 0.
func lineStart(b []byte) []byte {
	for len(b) >= 2 && b[0] == 0x1b && b[1] == '[' {
		i := 2
		for i < len(b) && (isDigit(b[i]) || b[i] == ';') {
			i++
		}
		if i == len(b) || (b[i] != 'm' && b[i] != 'K') {
			return b
		}
		b = b[i+1:]
	}
	return b
}

// stamp splits a printk timestamp, "[" spaces digits "." digits "]", off
// the start of b: the digits before and after the point, and what follows.
func stamp(b []byte) (secs, frac, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '[' {
		return nil, nil, nil, false
	}
	i := skipSpaces(b, 1)
	j := skipDigits(b, i)
	if j == i || j == len(b) || b[j] != '.' {
		return nil, nil, nil, false
	}
	k := skipDigits(b, j+1)
	if k == j+1 || k == len(b) || b[k] != ']' {
		return nil, nil, nil, false
	}
	return b[i:j], b[j+1 : k], b[k+1:], true
}

// kernelTime returns the time of the well-formed printk timestamp at the
// start of b: at most maxStampDigits of seconds and six of microseconds.
func kernelTime(b []byte) (time.Duration, bool) {
	secs, frac, _, ok := stamp(b)
	if !ok || len(secs) > maxStampDigits || len(frac) != 6 {
		return 0, false
	}
	var s, us int64
	for _, c := range secs {
		s = s*10 + int64(c-'0')
	}
	for _, c := range frac {
		us = us*10 + int64(c-'0')
	}
	return time.Duration(s)*time.Second + time.Duration(us)*time.Microsecond, true
}

// callerID splits printk's caller id, "[" spaces "T" or "C" digits "]",
// off the start of b.
func callerID(b []byte) (rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '[' {
		return nil, false
	}
	i := skipSpaces(b, 1)
	if i == len(b) || (b[i] != 'T' && b[i] != 'C') {
		return nil, false
	}
	j := skipDigits(b, i+1)
	if j == i+1 || j == len(b) || b[j] != ']' {
		return nil, false
	}
	return b[j+1:], true
}

// message returns what a Linux kernel wrote on the line b: all of it when
// it has no printk prefix, else what follows the prefix and one space.
// A prefix followed by anything but one space leaves no message.
func message(b []byte) []byte {
	rest, prefixed := b, false
	if _, _, r, ok := stamp(rest); ok {
		rest, prefixed = r, true
		if len(rest) > 0 && rest[0] == ' ' {
			// The caller id follows the timestamp directly; allow
			// one space between them too.
			if r, ok := callerID(rest[1:]); ok {
				rest = r
			}
		}
	}
	if r, ok := callerID(rest); ok {
		rest, prefixed = r, true
	}
	if !prefixed {
		return b
	}
	if len(rest) == 0 || rest[0] != ' ' || (len(rest) > 1 && rest[1] == ' ') {
		return nil
	}
	return rest[1:]
}

// linuxVerdict returns the reason a Linux message shows the guest dead
// on its own: a panic's trailer or a halt. trailer says it is the former.
func linuxVerdict(msg []byte) (reason string, trailer, ok bool) {
	if m, ok := bytes.CutPrefix(msg, []byte(linuxTrailer)); ok {
		// A trailer cut at maxLine has lost its end; the message is
		// still the kernel's.
		return reasonPanic(bytes.TrimSuffix(bytes.TrimRight(m, " \t"), []byte(trailerEnd))), true, true
	}
	if string(bytes.TrimRight(msg, " \t")) == linuxHalted {
		return haltedReason, false, true
	}
	return "", false, false
}

// isPanicReport reports whether a Linux message is one the kernel prints
// after its panic line and nothing else does: dump_stack's first line
// ("CPU: <n> PID: ..." or, since 6.9, "CPU: <n> UID: <n> PID: ...", with
// the task's Comm), the kernel's offset, or the other CPUs' stop.
func isPanicReport(msg []byte) bool {
	if rest, ok := bytes.CutPrefix(msg, []byte(linuxCPU)); ok {
		i := skipDigits(rest, 0)
		return i > 0 && i < len(rest) && rest[i] == ' ' &&
			bytes.Contains(rest, []byte(" PID: ")) && bytes.Contains(rest, []byte(" Comm: "))
	}
	return bytes.HasPrefix(msg, []byte(linuxOffset)) || bytes.HasPrefix(msg, []byte(linuxNMI))
}

// isCPUID reports whether b is FreeBSD's "cpuid = <n>" line, or the
// "cpuid = <n>; apic id = <m>" of its x86 trap report.
func isCPUID(b []byte) bool {
	rest, ok := bytes.CutPrefix(b, []byte(bsdCPUID))
	if !ok {
		return false
	}
	i := skipDigits(rest, 0)
	if i == 0 {
		return false
	}
	rest = bytes.TrimRight(rest[i:], " \t")
	return len(rest) == 0 || rest[0] == ';'
}

// reasonPanic is the reason of a kernel panic with the message m.
func reasonPanic(m []byte) string {
	if s := printable(m); s != "" {
		return panicReason + ": " + s
	}
	return panicReason
}

// printable returns b as one line of printable text of at most maxMessage
// bytes (and an ellipsis if cut): tabs become spaces, other control and
// non-printing characters and invalid UTF-8 are dropped, and spaces at
// either end are trimmed.
func printable(b []byte) string {
	var sb strings.Builder
	cut := false
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		b = b[size:]
		switch {
		case r == '\t':
			r = ' '
		case r == utf8.RuneError && size == 1, !unicode.IsPrint(r):
			continue
		}
		if sb.Len()+utf8.RuneLen(r) > maxMessage {
			cut = true
			break
		}
		sb.WriteRune(r)
	}
	s := strings.TrimSpace(sb.String())
	if cut {
		s += ellipsis
	}
	return s
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// skipDigits returns the index of the first non-digit in b from i.
func skipDigits(b []byte, i int) int {
	for i < len(b) && isDigit(b[i]) {
		i++
	}
	return i
}

// skipSpaces returns the index of the first non-space in b from i.
func skipSpaces(b []byte, i int) int {
	for i < len(b) && b[i] == ' ' {
		i++
	}
	return i
}
