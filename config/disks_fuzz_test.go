package config

import (
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzDiskAnnotations feeds hostile root disk and disk URL annotations to
// Resolve: it must never panic; what it accepts names a volume of the
// container and an http(s) URL with a host and a 64-hex-digit sha256;
// what it refuses, it refuses in one line of UTF-8.
func FuzzDiskAnnotations(f *testing.F) {
	f.Add("/data", "keep", "https://disks.example/a.qcow2", testSum, uint8(15))
	f.Add("/dev/xvdb", "recreate", "http://10.0.0.1:8080/d.img.xz", "sha256:"+testSum, uint8(15))
	f.Add("/data/../data", "", "HTTP://[::1]:80/x", strings.ToUpper(testSum), uint8(13))
	f.Add("/ro", "keep", "ftp://a/b", testSum, uint8(15))
	f.Add("", "", "http://a/b\x00", testSum, uint8(12))
	f.Add("/data", "", "http://user:pw@a/%zz", testSum, uint8(13))
	f.Add("/\xff", "x", "https://a/b#frag", "", uint8(7))
	f.Fuzz(func(t *testing.T, volume, policy, u, sum string, set uint8) {
		ann := map[string]string{}
		for i, kv := range [][2]string{
			{AnnotationRootDiskVolume, volume}, {AnnotationRootDiskPolicy, policy},
			{AnnotationDiskURL, u}, {AnnotationDiskSHA256, sum},
		} {
			if set&(1<<i) != 0 {
				ann[kv[0]] = kv[1]
			}
		}
		vm, err := Resolve(Default(), "c1", diskSpec(ann))
		if err != nil {
			if msg := err.Error(); strings.Contains(msg, "\n") || !utf8.ValidString(msg) {
				t.Fatalf("error is not one line of UTF-8: %q", msg)
			}
			return
		}
		if v := vm.RootVolume; v != nil && v.Path != "/data" && v.Path != "/dev/xvdb" {
			t.Fatalf("root volume %+v is not a volume of the container", v)
		}
		if vm.DiskURL != "" {
			p, err := url.Parse(vm.DiskURL)
			if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || len(vm.DiskURL) > 3*4096 {
				t.Fatalf("accepted disk URL %q", vm.DiskURL)
			}
			if len(vm.DiskSHA256) != 64 || strings.ToLower(vm.DiskSHA256) != vm.DiskSHA256 {
				t.Fatalf("accepted sha256 %q", vm.DiskSHA256)
			}
		}
	})
}
