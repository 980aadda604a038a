package rootdisk

import (
	"reflect"
	"testing"
)

// FuzzParseStateHeader: any header block either fails to parse or reads
// as a StateInfo that writes back to a block reading the same.
func FuzzParseStateHeader(f *testing.F) {
	info := testStateInfo()
	info.Stream = 1 << 20
	h, err := stateHeader(info)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(h)
	f.Add([]byte(stateMagic))
	f.Add(append([]byte(stateMagic), 0, 0, 0, 2, '{', '}'))
	f.Fuzz(func(t *testing.T, b []byte) {
		info, err := parseStateHeader(b)
		if err != nil {
			return
		}
		again, err := stateHeader(info)
		if err != nil {
			t.Fatalf("parsed %+v does not write back: %v", info, err)
		}
		back, err := parseStateHeader(again)
		if err != nil || !reflect.DeepEqual(back, info) {
			t.Fatalf("round trip: %+v, %v; want %+v", back, err, info)
		}
	})
}
