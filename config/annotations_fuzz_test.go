package config

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// annotationKeys are the keys FuzzAnnotations sets, in the order of its
// arguments and of the bits of its set mask.
var annotationKeys = []string{
	AnnotationVCPUs, AnnotationMemory, AnnotationDiskDriver, AnnotationRootDiskSize,
	AnnotationUserData, AnnotationSSHAuthorizedKeys, AnnotationKernelCmdline, AnnotationNetworkConfig,
}

// annotationSeed is one FuzzAnnotations input: the set mask, the eight
// values in annotationKeys order, then one more key and its value (bit 8).
type annotationSeed struct {
	set  uint16
	vals [10]string
}

// annotationSeeds are valid and tricky FuzzAnnotations inputs.
func annotationSeeds() []annotationSeed {
	key := sshKey("ssh-ed25519", "alice@example")
	seed := func(set uint16, vals ...string) annotationSeed {
		s := annotationSeed{set: set}
		copy(s.vals[:], vals)
		return s
	}
	return []annotationSeed{
		seed(0),
		seed(0xff, "2", "1Gi", "virtio-scsi", "20Gi", "#cloud-config\npackages: [curl]\n", key, "quiet", "version: 2\nethernets: {}\n"),
		seed(0xff, "16", "16Gi", "nvme", "256Gi", "#!/bin/sh\necho hi\n", key+"\n\n"+sshKey("ecdsa-sha2-nistp256", ""), "", ""),
		seed(1<<4|1<<5, "", "", "", "", "Content-Type: multipart/mixed; boundary=X\nMIME-Version: 1.0\n\n--X--\n", key),
		seed(1, "0"), seed(1, "17"), seed(1, "+2"), seed(1, "99999999999999999999"), seed(1, " 2"),
		seed(1<<1, "", "63Mi"), seed(1<<1, "", "1e3"), seed(1<<1, "", "-1Gi"), seed(1<<1, "", "9223372036854775807"), seed(1<<1, "", "1.5Gi"),
		seed(1<<1, "", "100Ei"), seed(1<<1, "", "0.1"), seed(1<<1, "", "1e-999999999"), seed(1<<1, "", "1E99"), seed(1<<1, "", "1e+9x"),
		seed(1<<2, "", "", "ide"),
		seed(1<<3, "", "", "", "0"), seed(1<<3, "", "", "", "257Gi"), seed(1<<3, "", "", "", "1m"), seed(1<<3, "", "", "", "1e9999999"),
		seed(1<<4, "", "", "", "", "#cloud-config\nwrite_files: {path: /a}\n"),
		seed(1<<4, "", "", "", "", "#cloud-config\nfqdn: a: b\n"),
		seed(1<<4, "", "", "", "", "#cloud-config\r\n- a\n"),
		seed(1<<4, "", "", "", "", "#cloud-config\nruncmd:\n\t- ls\n"),
		seed(1<<4, "", "", "", "", "#cloud-config\nmounts: ~\nssh_authorized_keys: []\nx: .inf\ny: 1e400\n"),
		seed(1<<4, "", "", "", "", "hello\nworld"),
		seed(1<<5, "", "", "", "", "", "ssh-ed25519 AAAA"),
		seed(1<<5, "", "", "", "", "", "ssh-rsa AAAAB3NzaC1yc2E= x\r"),
		seed(1<<5, "", "", "", "", "", "ssh-ed25519 AAAA/////w== a\x00b"),
		seed(1<<6, "", "", "", "", "", "", "console=ttyS1\ninit=/bin/sh"),
		seed(1<<6, "", "", "", "", "", "", strings.Repeat("a", maxCmdline+1)),
		seed(1<<7, "", "", "", "", "", "", "", "version: 3\n"),
		seed(1<<7, "", "", "", "", "", "", "", "- version: 1\n"),
		seed(1<<8, "", "", "", "", "", "", "", "", "vmshim.io/cpus", "2"),
		seed(1<<8, "", "", "", "", "", "", "", "", "vmshim.io/a\nb", ""),
		seed(1<<8, "", "", "", "", "", "", "", "", "vmshim.io/\xff", ""),
		seed(1<<8, "", "", "", "", "", "", "", "", "example.com/other", "x"),
	}
}

// FuzzAnnotations feeds the vmshim.io/* annotations, one by one or
// together, to Resolve, and checks what it accepts against the limits of
// the configuration and against what the cloud-init seed builder takes.
func FuzzAnnotations(f *testing.F) {
	for _, s := range annotationSeeds() {
		v := s.vals
		f.Add(s.set, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9])
	}
	cfg := Default()
	f.Fuzz(func(t *testing.T, set uint16, vcpus, memory, diskDriver, rootDiskSize, userData, sshKeys, kernelCmdline, networkConfig, extraKey, extraValue string) {
		vals := []string{vcpus, memory, diskDriver, rootDiskSize, userData, sshKeys, kernelCmdline, networkConfig}
		ann := map[string]string{}
		for i, k := range annotationKeys {
			if set&(1<<i) != 0 {
				ann[k] = vals[i]
			}
		}
		if set&(1<<8) != 0 {
			ann[extraKey] = extraValue
		}
		spec := newSpec()
		spec.Annotations = ann
		start := time.Now()
		vm, err := Resolve(cfg, "c1", spec)
		if d := time.Since(start); d > slow {
			t.Fatalf("Resolve took %v", d)
		}
		checkResolved(t, cfg, spec, vm, err)
		if err != nil {
			return
		}
		checkSeed(t, spec, vm, nil)
		if v, ok := ann[AnnotationVCPUs]; ok {
			if n, _ := strconv.Atoi(v); vm.VCPUs != n {
				t.Errorf("vcpus annotation %q gave %d vcpus", v, vm.VCPUs)
			}
		}
		if v, ok := ann[AnnotationMemory]; ok {
			if n, _ := parseBytes(v); vm.MemoryMiB != int(n>>20) {
				t.Errorf("memory annotation %q gave %d MiB", v, vm.MemoryMiB)
			}
		}
		if v, ok := ann[AnnotationRootDiskSize]; ok {
			if n, _ := parseBytes(v); vm.RootDiskSize != n || n <= 0 {
				t.Errorf("root-disk-size annotation %q gave %d bytes", v, vm.RootDiskSize)
			}
		}
		if v, ok := ann[AnnotationDiskDriver]; ok && vm.DiskDriver != v {
			t.Errorf("disk-driver annotation %q gave %q", v, vm.DiskDriver)
		}
		if v := strings.TrimSpace(ann[AnnotationKernelCmdline]); v != "" && !strings.HasSuffix(vm.KernelCmdline, " "+v) {
			t.Errorf("kernel-cmdline annotation %q gave %q", v, vm.KernelCmdline)
		}
	})
}
