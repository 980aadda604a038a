package cloudinit

import (
	"bytes"
	"testing"
)

// FuzzWriteSeed writes seeds of fuzzed documents, the user-data grown by
// fillKiB KiB to reach past minSeedSize, and checks each is a standard
// image that holds the documents as given under their Rock Ridge names.
func FuzzWriteSeed(f *testing.F) {
	f.Add("instance-id: i\n", "", "", uint8(0))
	f.Add("instance-id: \"i-1\"\nlocal-hostname: \"vm1\"\n", "#cloud-config\nruncmd:\n  - \"echo hi\"\n", "version: 2\n", uint8(0))
	f.Add("", "", "", uint8(0))
	f.Add("instance-id: i\n", "#cloud-config\n", "version: 2\n", uint8(64))
	f.Add("instance-id: i\n", "#!/bin/sh\n", "", uint8(255))
	f.Fuzz(func(t *testing.T, metaData, userData, networkConfig string, fillKiB uint8) {
		files := map[string][]byte{
			SeedMetaData:      []byte(metaData),
			SeedUserData:      append([]byte(userData), bytes.Repeat([]byte("#"), int(fillKiB)<<10)...),
			SeedNetworkConfig: []byte(networkConfig),
		}
		_, img := writeSeedImage(t, files)
		checkSeedImage(t, img)
		label, joliet, rr := parseISO(t, img)
		if label != SeedLabel || joliet {
			t.Errorf("label %q, Joliet %v; want %q, false", label, joliet, SeedLabel)
		}
		if !equalFiles(rr, files) {
			t.Errorf("Rock Ridge files %q differ from those written", names(rr))
		}
	})
}
