package jail

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// IDRange is a range of host ids, first to last inclusive, handed out one
// to each VM: its QEMU's uid, and the same number as its gid.
type IDRange struct {
	First, Last uint32
}

// ParseIDRange parses "FIRST-LAST". The range must not hold 0 (root),
// 65534 (nobody) or ids from 2^31 up, which some tools read as negative.
func ParseIDRange(s string) (IDRange, error) {
	a, b, ok := strings.Cut(s, "-")
	first, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 32)
	last, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 32)
	switch {
	case !ok || err1 != nil || err2 != nil:
		return IDRange{}, fmt.Errorf("%q is not a range FIRST-LAST of ids", s)
	case first == 0 || first > last:
		return IDRange{}, fmt.Errorf("%q: want 0 < FIRST <= LAST", s)
	case last >= 1<<31:
		return IDRange{}, fmt.Errorf("%q: ids from 2147483648 up are read as negative by some tools", s)
	case first <= 65534 && 65534 <= last:
		return IDRange{}, fmt.Errorf("%q holds 65534, the id of nobody", s)
	}
	return IDRange{First: uint32(first), Last: uint32(last)}, nil
}

// Size is how many ids the range holds.
func (r IDRange) Size() uint64 { return uint64(r.Last) - uint64(r.First) + 1 }

// Claim takes an id of r for owner, node-wide: each id in use has a file
// named after it in dir, made with O_EXCL, so shims of different pods
// never share one. The search starts at a point derived from owner, so a
// VM usually gets the same id each time. The claim holds until Release;
// dir should be on a tmpfs, so a reboot frees every id.
func Claim(dir string, r IDRange, owner string) (uint32, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("claim id: %w", err)
	}
	h := fnv.New64a()
	h.Write([]byte(owner))
	size := r.Size()
	start := h.Sum64() % size
	for i := uint64(0); i < size; i++ {
		id := r.First + uint32((start+i)%size)
		f, err := os.OpenFile(idFile(dir, id), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("claim id %d: %w", id, err)
		}
		_, werr := f.WriteString(owner)
		if err := errors.Join(werr, f.Close()); err != nil {
			_ = os.Remove(idFile(dir, id))
			return 0, fmt.Errorf("claim id %d: %w", id, err)
		}
		return id, nil
	}
	return 0, fmt.Errorf("no free id left in %d-%d (%d VMs run on this node): %w", r.First, r.Last, size, errdefs.ErrUnavailable)
}

// Release gives back id, if owner still holds it; a missing claim is
// released already. An id of 0, for an owner that crashed before it
// learned which id Claim gave it, gives back every claim owner holds.
func Release(dir string, id uint32, owner string) error {
	if id == 0 {
		return releaseOwner(dir, owner)
	}
	p := idFile(dir, id)
	data, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("release id %d: %w", id, err)
	}
	if string(data) != owner {
		return nil // someone else's now
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("release id %d: %w", id, err)
	}
	return nil
}

// releaseOwner gives back the claims in dir that owner holds.
func releaseOwner(dir, owner string) error {
	if owner == "" {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("release ids of %s: %w", owner, err)
	}
	for _, e := range entries {
		id, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil || id == 0 || !e.Type().IsRegular() {
			continue
		}
		if err := Release(dir, uint32(id), owner); err != nil {
			return err
		}
	}
	return nil
}

// idFile is the claim file of id in dir.
func idFile(dir string, id uint32) string {
	return filepath.Join(dir, strconv.FormatUint(uint64(id), 10))
}
