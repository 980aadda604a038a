package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestFormatProgress(t *testing.T) {
	tests := []struct {
		name        string
		done, total int64
		elapsed     time.Duration
		want        string
	}{
		{"disk.qcow2", 1288490189, 4 << 30, 14456 * time.Millisecond, "packing disk.qcow2  1.2 GiB / 4.0 GiB  30%  85 MiB/s"},
		{"disk.img", 0, 10 << 20, 0, "packing disk.img  0 B / 10.0 MiB  0%"},
		{"vmlinux + initrd.img", 512, 1000, time.Second, "packing vmlinux + initrd.img  512 B / 1000 B  51%  512 B/s"},
		{"k", 3 << 20, 3 << 20, time.Second, "packing k  3.0 MiB / 3.0 MiB  100%  3.0 MiB/s"},
		{"big", 1 << 40, 2 << 40, 1000 * time.Second, "packing big  1.0 TiB / 2.0 TiB  50%  1.0 GiB/s"},
		{"empty", 0, 0, time.Second, "packing empty  0 B / 0 B  100%  0 B/s"},
	}
	for _, tt := range tests {
		if got := formatProgress(tt.name, tt.done, tt.total, tt.elapsed); got != tt.want {
			t.Errorf("formatProgress(%q, %d, %d, %v)\n got %q\nwant %q", tt.name, tt.done, tt.total, tt.elapsed, got, tt.want)
		}
	}
}

func TestFormatBytesAndRate(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 30: "5.0 GiB"} {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
	for r, want := range map[float64]string{100: "100 B/s", 9.5 * 1024 * 1024: "9.5 MiB/s", 85.4 * 1024 * 1024: "85 MiB/s", 2048: "2.0 KiB/s"} {
		if got := formatRate(r); got != want {
			t.Errorf("formatRate(%v) = %q, want %q", r, got, want)
		}
	}
}

func TestParseProgressMode(t *testing.T) {
	tests := []struct {
		in       string
		terminal bool
		want     progressMode
		wantErr  bool
	}{
		{"auto", true, progressLive, false},
		{"auto", false, progressNone, false},
		{"plain", true, progressPlain, false},
		{"plain", false, progressPlain, false},
		{"none", true, progressNone, false},
		{"fancy", true, progressNone, true},
	}
	for _, tt := range tests {
		got, err := parseProgressMode(tt.in, tt.terminal)
		if got != tt.want || (err != nil) != tt.wantErr || (err != nil && !errors.Is(err, errdefs.ErrInvalidArgument)) {
			t.Errorf("parseProgressMode(%q, %v) = %v, %v; want %v, error %v", tt.in, tt.terminal, got, err, tt.want, tt.wantErr)
		}
	}
}

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestProgressPlain(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	var out strings.Builder
	p := newProgress(progressOptions{Mode: progressPlain, Out: &out, Now: clock.now}, "disk.qcow2", 100<<20)
	// 1 MiB reads, one per 10 ms (100 MiB/s), as io.CopyBuffer does them.
	for range 100 {
		clock.t = clock.t.Add(10 * time.Millisecond)
		p.add(1 << 20)
	}
	p.finish()
	p.note("importing x")
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 11 {
		t.Fatalf("got %d lines, want ten steps and a note:\n%s", len(lines), out.String())
	}
	for i, l := range lines[:10] {
		want := "packing disk.qcow2  " + formatBytes(int64(i+1)*10<<20) + " / 100.0 MiB  " + []string{
			"10", "20", "30", "40", "50", "60", "70", "80", "90", "100"}[i] + "%  100 MiB/s"
		if l != want {
			t.Errorf("line %d = %q, want %q", i, l, want)
		}
	}
	if lines[10] != "importing x" {
		t.Errorf("note %q", lines[10])
	}
}

func TestProgressPlainJumps(t *testing.T) {
	// A read that crosses several steps prints one line; finish adds the
	// 100% line only when it is missing.
	var out strings.Builder
	p := newProgress(progressOptions{Mode: progressPlain, Out: &out, Now: (&fakeClock{}).now}, "k", 300)
	p.add(5)   // 1%: nothing
	p.add(100) // 35%
	p.add(195) // 100%
	p.finish()
	want := "packing k  105 B / 300 B  35%\npacking k  300 B / 300 B  100%\n"
	if out.String() != want {
		t.Errorf("got\n%q\nwant\n%q", out.String(), want)
	}
}

func TestProgressLive(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	var out strings.Builder
	p := newProgress(progressOptions{Mode: progressLive, Out: &out, Now: clock.now}, "d", 1000)
	for range 10 { // 10 reads 100 ms apart: the first drawn at once, then one in three (≥ 250 ms apart)
		clock.t = clock.t.Add(100 * time.Millisecond)
		p.add(100)
	}
	p.finish()
	draws := strings.Count(out.String(), "\r")
	if draws != 4+1 {
		t.Errorf("%d redraws, want 4 and the final one:\n%q", draws, out.String())
	}
	if !strings.HasSuffix(out.String(), "\rpacking d  1000 B / 1000 B  100%  1000 B/s\x1b[K\n") {
		t.Errorf("final line: %q", out.String())
	}
	if strings.Contains(out.String(), "\n\r") || strings.Count(out.String(), "\n") != 1 {
		t.Errorf("the live line must stay one line: %q", out.String())
	}
}

func TestProgressNone(t *testing.T) {
	var out strings.Builder
	p := newProgress(progressOptions{Mode: progressNone, Out: &out}, "d", 10)
	if p != nil {
		t.Fatal("progressNone made a reporter")
	}
	p.add(10) // a nil reporter is a no-op
	p.finish()
	p.note("x")
	if out.Len() != 0 {
		t.Errorf("wrote %q", out.String())
	}
}
