package launch

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/vmshim/vmshim/image"
)

// TestTPMFitsKernel: a TPM is refused, in one line, only for an ELF
// kernel booted with an initrd, whose initrd QEMU would load over the
// TPM's ACPI tables.
func TestTPMFitsKernel(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) *os.File {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	elf, bz, initrd, disk := file("vmlinux", "\x7fELF\x02\x01\x01"), file("vmlinuz", "MZ\x00\x00HdrS"), file("initrd", "0707"), file("disk", "QFI\xfb")
	for _, tc := range []struct {
		name string
		boot image.Boot
		bad  bool
	}{
		{"a disk", image.Boot{DiskFile: disk}, false},
		{"elf alone", image.Boot{KernelFile: elf}, false},
		{"bzImage and initrd", image.Boot{KernelFile: bz, InitrdFile: initrd}, false},
		{"elf and initrd", image.Boot{KernelFile: elf, InitrdFile: initrd}, true},
	} {
		err := tpmFitsKernel(&tc.boot)
		switch {
		case !tc.bad && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.bad && (err == nil || !errdefs.IsInvalidArgument(err) || !strings.HasPrefix(err.Error(), "annotation vmshim.io/tpm: ") || strings.Contains(err.Error(), "\n")):
			t.Errorf("%s: %v, want one line refusing it", tc.name, err)
		}
	}
}
