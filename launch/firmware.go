package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/image"
	"github.com/vmshim/vmshim/qemu"
	"github.com/vmshim/vmshim/rootdisk"
)

// vncTimeout bounds handing one VNC client to QEMU.
const vncTimeout = 5 * time.Second

// firmware gives a VM that boots UEFI its firmware: OVMF's code, and a
// variables store of its own made from the template. The store lives in
// the VM's files directory, or, with a root disk kept on a filesystem
// volume, on the volume beside it, where it is kept too.
func (c *build) firmware(ctx context.Context) error {
	fw := c.desc.Firmware
	if fw == "" && (c.boot.Disk != "" || c.boot.ISO != "") {
		var err error
		if fw, err = c.imageFirmware(ctx); err != nil {
			return err
		}
	}
	if fw == "" || fw == config.FirmwareBIOS {
		return nil
	}
	if c.boot.Disk == "" && c.boot.ISO == "" {
		return fmt.Errorf("annotation %s: %s boots a disk, and the image boots a kernel directly: %w",
			config.AnnotationFirmware, fw, errdefs.ErrInvalidArgument)
	}
	codeKey, code, varsKey, vars := "uefi_code", c.cfg.UEFICode, "uefi_vars", c.cfg.UEFIVars
	if fw == config.FirmwareUEFISecure {
		codeKey, code, varsKey, vars = "uefi_secure_code", c.cfg.UEFISecureCode, "uefi_secure_vars", c.cfg.UEFISecureVars
	}
	codeFile, err := openFirmware(codeKey, code)
	if err != nil {
		return err
	}
	c.keep(codeFile)
	template, err := openFirmware(varsKey, vars)
	if err != nil {
		return err
	}
	defer template.Close()
	store, err := c.varsStore(template)
	if err != nil {
		return err
	}
	c.qs.Firmware = &qemu.Firmware{Code: c.fdSet(codeFile), Vars: c.fdSet(store), SecureBoot: fw == config.FirmwareUEFISecure}
	return nil
}

// imageFirmware is the firmware the image names with its OCI label
// (config.LabelFirmware), "" for none. containerd keeps an image's labels
// as its containers' labels, which the task API does not carry: they are
// read from containerd, only for a VM that boots a disk, since a kernel
// boot takes no firmware.
func (c *build) imageFirmware(ctx context.Context) (string, error) {
	labels, err := containerLabels(ctx, c.launcher.containerd, c.ns, c.r.ID)
	if err != nil {
		return "", err
	}
	fw, ok := labels[config.LabelFirmware]
	if !ok {
		return "", nil
	}
	if err := config.CheckFirmware("image label "+config.LabelFirmware, fw); err != nil {
		return "", err
	}
	c.desc.Firmware = fw
	return fw, nil
}

// varsStore returns the VM's UEFI variables store, read-write: the one
// kept on its root disk's filesystem volume, or a copy of template made
// in its files directory.
func (c *build) varsStore(template *os.File) (*os.File, error) {
	if v := c.desc.RootVolume; v != nil && !v.Block {
		f, err := rootdisk.VarsOnDirectory(v.HostDir, v.Path, template)
		if err != nil {
			return nil, err
		}
		return c.keep(f), nil
	}
	f, err := c.create(image.VarsName)
	if err != nil {
		return nil, err
	}
	if _, err := io.Copy(f, template); err != nil {
		return nil, fmt.Errorf("uefi variables %s: %w", f.Name(), err)
	}
	return f, nil
}

// openFirmware opens a firmware file the config names under key.
func openFirmware(key, path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("config %s: %s does not exist (Debian's ovmf package has it): %w", key, path, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", key, err)
	}
	return f, nil
}

// seedDrive is the drive of the cloud-init seed: virtio-blk, or, for a
// guest given SATA or IDE disks, a CD-ROM on the same bus, which such a
// guest can read without virtio drivers.
func seedDrive(path, diskDriver string) qemu.Drive {
	d := qemu.Drive{ID: "seed", Path: path, Format: qemu.FormatRaw, ReadOnly: true, Driver: config.DiskDriverVirtioBlk}
	if diskDriver == config.DiskDriverSATA || diskDriver == config.DiskDriverIDE {
		d.Driver, d.CDROM = diskDriver, true
	}
	return d
}

// vncServer hands connections made to the pod's loopback on
// qemu.VNCPort (kubectl port-forward pod/NAME 5900) to the VM's VNC
// server, once the VM runs.
type vncServer struct {
	vm     atomic.Pointer[qemu.VM]
	logger *log.Entry
}

// local is the network option that sends the VNC port to s.
func (s *vncServer) local() map[int]func(*net.TCPConn) {
	return map[int]func(*net.TCPConn){qemu.VNCPort: s.serve}
}

// serve hands c to QEMU, or closes it when the VM is not up.
func (s *vncServer) serve(c *net.TCPConn) {
	defer c.Close()
	vm := s.vm.Load()
	if vm == nil {
		return
	}
	f, err := c.File()
	if err != nil {
		s.logger.WithError(err).Warn("vnc client")
		return
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), vncTimeout)
	defer cancel()
	if err := vm.AddVNCClient(ctx, f); err != nil {
		s.logger.WithError(err).Warn("vnc client")
	}
}
