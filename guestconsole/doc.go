// Package guestconsole reads what a guest writes on its first serial
// console and says when the console shows the guest dead, and how far its
// kernel has booted. It knows nothing of QEMU, the shim or the task: the
// caller copies the console's bytes to a Watcher as they come.
//
// # Lines
//
// A line ends with '\n'. A '\r' followed by more text on the same line
// starts the line over, as it does on a terminal: "foo\rbar" is the line
// "bar", and a trailing '\r' ("...\r\n") is dropped. The line's start then
// skips colour and erase-line escapes (ESC [ ... m, ESC [ ... K), which
// move nothing. A line counts once its '\n' arrives; at most the first
// 1 KiB of a line is kept and the rest, up to the next newline, is
// ignored, so a watcher's memory is the same whatever the guest writes.
//
// # Verdicts
//
// The console shows the guest dead when a line, at its start, is one of:
//
//   - Linux's panic line, "Kernel panic - not syncing: <msg>", once the
//     rest of the report the kernel prints after it begins within 64
//     lines: dump_stack's first line ("CPU: <n> PID: <n> Comm: ..."), the
//     kernel's offset ("Kernel Offset: ..."), the other CPUs' stop
//     ("Shutting down cpus with NMI") or the trailer; so one line that
//     quotes a panic at its start, as a write to /dev/kmsg would, is not
//     one;
//   - the trailer Linux prints at the end of a panic when it hangs,
//     "---[ end Kernel panic - not syncing: <msg> ]---";
//   - Linux's "reboot: System halted", printed when halt -f has stopped
//     every CPU and QEMU runs on with nothing to run ("reboot: Power
//     down" is not one: QEMU exits then, and "reboot: Restarting system"
//     is a reset);
//   - FreeBSD's "panic: <msg>", but only when a "cpuid = <n>" line follows
//     within three lines, as FreeBSD prints on every SMP kernel; a lone
//     "panic: " line is what a Go program prints when it dies, too.
//
// A Linux line starts either at column 0 (kernels built without
// CONFIG_PRINTK_TIME print no timestamp) or after a printk prefix: a
// timestamp "[    1.234567]", a caller id "[    T1]" or "[    C0]", or
// both, then exactly one space. Any digits around the timestamp's point
// will do here. Text before the message (a syslog or journal prefix, a
// shell prompt, "audit: ...", a stray NUL) means the line only mentions a
// panic and does not count. So a panic line the kernel writes after text
// user space left on the line (a login prompt) is missed; its trailer, on
// a line of its own, is caught when the kernel hangs after the panic
// (panic=0, the default). Text that user space ended with a '\r', as
// systemd ends the status of a job it waits for, is overwritten and does
// not hide the panic line.
//
// The reason is one line of printable text, "kernel panic: <msg>" or
// "the guest halted: reboot: System halted", the message stripped of
// control characters and invalid UTF-8 and cut at 200 bytes. The first
// verdict stands; nothing after it changes it.
//
// A guest can print any of these from user space, from a program echoing
// a panic and its report to a dmesg of a ring buffer with a panic in it:
// the console is the guest's own, and a guest that says it is dead only
// ends itself.
//
// # Kernel time
//
// KernelTime is the largest printk timestamp seen at a line's start. Only
// a well-formed one counts: '[', spaces, at most 8 digits of seconds, '.',
// exactly 6 digits of microseconds, ']'. A reboot inside the guest starts
// its kernel's clock again at zero; KernelTime keeps the largest.
package guestconsole
