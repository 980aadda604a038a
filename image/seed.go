package image

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
)

// SeedLabel is the volume label cloud-init's NoCloud datasource looks for.
const SeedLabel = "cidata"

// isoBlockSize is the ISO9660 logical block size.
const isoBlockSize = 2048

// WriteSeed writes files into an ISO9660 image at path, labelled cidata, with
// Rock Ridge and Joliet so the guest sees the names as given. The image is
// written next to path and renamed into place, mode 0600.
func WriteSeed(path string, files map[string][]byte) (retErr error) {
	names := make([]string, 0, len(files))
	for name := range files {
		if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
			return invalidf("seed %s: %q is not a file name", path, name)
		}
		names = append(names, name)
	}
	sort.Strings(names)
	dir := filepath.Dir(path)
	workspace, err := os.MkdirTemp(dir, ".seed-files-")
	if err != nil {
		return fmt.Errorf("seed %s: %w", path, err)
	}
	defer os.RemoveAll(workspace)
	tmp, err := os.CreateTemp(dir, ".seed-*.iso")
	if err != nil {
		return fmt.Errorf("seed %s: %w", path, err)
	}
	defer func() {
		if retErr != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	fs, err := iso9660.Create(file.New(tmp, false), 0, 0, isoBlockSize, workspace)
	if err != nil {
		return fmt.Errorf("seed %s: create iso9660: %w", path, err)
	}
	for _, name := range names {
		if err := writeISOFile(fs, name, files[name]); err != nil {
			return fmt.Errorf("seed %s: %w", path, err)
		}
	}
	opts := iso9660.FinalizeOptions{RockRidge: true, Joliet: true, VolumeIdentifier: SeedLabel}
	if err := fs.Finalize(opts); err != nil {
		return fmt.Errorf("seed %s: finalize iso9660: %w", path, err)
	}
	// The last file ends mid-block; a drive's size must be whole blocks.
	if err := padToBlock(tmp); err != nil {
		return fmt.Errorf("seed %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("seed %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("seed %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("seed %s: %w", path, err)
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
