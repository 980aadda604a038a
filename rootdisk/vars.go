package rootdisk

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// VarsName is the UEFI variables store kept on a filesystem volume with
// the root disk, so that boot entries and Secure Boot state persist too.
const VarsName = "vmshim-efivars.fd"

// VarsOnDirectory returns the UEFI variables store kept in dir, a
// filesystem volume's host directory (name is the volume as the container
// sees it), open read-write, making it from template on the first boot.
// A store whose size is not the template's is not one of this firmware's
// and is refused. Call it once the volume's root disk is claimed.
func VarsOnDirectory(dir, name string, template *os.File) (_ *os.File, retErr error) {
	v, err := openVolume(dir, name)
	if err != nil {
		return nil, err
	}
	defer v.dir.Close()
	st, err := template.Stat()
	if err != nil {
		return nil, fmt.Errorf("uefi variables template: %w", err)
	}
	f, err := v.open(VarsName, unix.O_RDWR)
	if err == nil {
		fi, err := f.Stat()
		switch {
		case err != nil:
			f.Close()
			return nil, fmt.Errorf("root disk volume %s: %w", name, err)
		case fi.Size() != st.Size():
			f.Close()
			return nil, fmt.Errorf("root disk volume %s: %s is not a variables store of this firmware (%d bytes, want %d): %w",
				name, VarsName, fi.Size(), st.Size(), errdefs.ErrFailedPrecondition)
		}
		return f, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	const temp = VarsName + ".part"
	_ = unix.Unlinkat(int(v.dir.Fd()), temp, 0)
	if f, err = v.open(temp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			f.Close()
			_ = unix.Unlinkat(int(v.dir.Fd()), temp, 0)
		}
	}()
	if _, err := io.Copy(f, io.NewSectionReader(template, 0, st.Size())); err != nil {
		return nil, fmt.Errorf("root disk volume %s: %s: %w", name, VarsName, err)
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	if err := unix.Renameat(int(v.dir.Fd()), temp, int(v.dir.Fd()), VarsName); err != nil {
		return nil, fmt.Errorf("root disk volume %s: %w", name, err)
	}
	return f, nil
}

// KeptOnDirectory returns the file name kept in dir, a filesystem
// volume's host directory (volName is the volume as the container sees
// it), open read-write, made empty when there is none: a VM's own file
// kept with its root disk, such as its TPM's state. What is at the name
// is opened only if it is a regular file with one link, beneath dir, and
// left as it is otherwise. Call it once the volume's root disk is
// claimed.
func KeptOnDirectory(dir, volName, name string) (*os.File, error) {
	v, err := openVolume(dir, volName)
	if err != nil {
		return nil, err
	}
	defer v.dir.Close()
	return v.openOrCreate(name)
}
