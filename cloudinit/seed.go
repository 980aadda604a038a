package cloudinit

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
)

// SeedLabel is the volume label cloud-init's NoCloud datasource looks for.
const SeedLabel = "cidata"

// isoBlockSize is the ISO9660 logical block size.
const isoBlockSize = 2048

// WriteSeed writes files into f, an empty file open read-write, as an
// ISO9660 image labelled cidata, with Rock Ridge and Joliet so the guest
// sees the names as given. The image's scratch files live in a temporary
// directory of the shim's own.
func WriteSeed(f *os.File, files map[string][]byte) error {
	name := f.Name()
	names := make([]string, 0, len(files))
	for n := range files {
		if n == "" || strings.ContainsAny(n, "/\x00") || n == "." || n == ".." {
			return invalidf("seed %s: %q is not a file name", name, n)
		}
		names = append(names, n)
	}
	sort.Strings(names)
	workspace, err := os.MkdirTemp("", "vmshim-seed-")
	if err != nil {
		return fmt.Errorf("seed %s: %w", name, err)
	}
	defer os.RemoveAll(workspace)
	fs, err := iso9660.Create(file.New(f, false), 0, 0, isoBlockSize, workspace)
	if err != nil {
		return fmt.Errorf("seed %s: create iso9660: %w", name, err)
	}
	for _, n := range names {
		if err := writeISOFile(fs, n, files[n]); err != nil {
			return fmt.Errorf("seed %s: %w", name, err)
		}
	}
	opts := iso9660.FinalizeOptions{RockRidge: true, Joliet: true, VolumeIdentifier: SeedLabel}
	if err := fs.Finalize(opts); err != nil {
		return fmt.Errorf("seed %s: finalize iso9660: %w", name, err)
	}
	// The last file ends mid-block; a drive's size must be whole blocks.
	if err := padToBlock(f); err != nil {
		return fmt.Errorf("seed %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("seed %s: %w", name, err)
	}
	return nil
}

// writeISOFile adds one file to the image being built.
func writeISOFile(fs *iso9660.FileSystem, name string, data []byte) error {
	f, err := fs.OpenFile("/"+name, os.O_CREATE|os.O_RDWR)
	if err != nil {
		return fmt.Errorf("add %s: %w", name, err)
	}
	_, werr := f.Write(data)
	if err := errors.Join(werr, f.Close()); err != nil {
		return fmt.Errorf("add %s: %w", name, err)
	}
	return nil
}

// padToBlock extends f with zeros to a whole number of ISO blocks.
func padToBlock(f *os.File) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if rem := st.Size() % isoBlockSize; rem != 0 {
		return f.Truncate(st.Size() + isoBlockSize - rem)
	}
	return nil
}
