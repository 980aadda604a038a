package launch

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/mount"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/image"
)

// Class is what a container of a VM pod is, decided once, at its create.
type Class struct {
	// VM is set for a container this package makes: a VM, or a pod
	// sandbox's pause process. The others are ordinary containers.
	VM bool
	// RuncShim and Runc are, for an ordinary container, containerd's
	// runc shim that runs it (a command name or an absolute path) and the
	// runc it runs it with ("" for the shim's default): config runc_shim
	// and runc.
	RuncShim, Runc string
}

// Classify decides what the container r would make is: a pod sandbox, a
// container that names a disk by URL (vmshim.io/disk-url), or one whose
// image holds a VM (image.Find) is a VM; any other is an ordinary
// container. The rootfs is mounted to look into, and unmounted again; a
// VM's Launch mounts it anew.
func (l *qemuLauncher) Classify(ctx context.Context, r *Request) (Class, error) {
	cfg, err := loadConfig(r.Options)
	if err != nil {
		return Class{}, err
	}
	spec, err := config.ReadSpec(r.Bundle)
	if err != nil {
		return Class{}, err
	}
	if config.IsSandbox(spec) || spec.Annotations[config.AnnotationDiskURL] != "" {
		return Class{VM: true}, nil
	}
	vm, err := holdsVM(r)
	if err != nil || vm {
		return Class{VM: vm}, err
	}
	return Class{RuncShim: cfg.RuncShim, Runc: cfg.Runc}, nil
}

// holdsVM reports whether the image of the container r would make holds
// a VM (a disk, an installer ISO, a pointer to a disk by URL, or a kernel).
// An image image.Find refuses for any other reason than holding none is a
// VM's: its create then says why.
func holdsVM(r *Request) (_ bool, retErr error) {
	root := filepath.Join(r.Bundle, "rootfs")
	if len(r.Rootfs) > 0 {
		if err := mount.All(r.Rootfs, root); err != nil {
			return false, fmt.Errorf("mount rootfs: %w", err)
		}
		defer func() {
			if err := unmountRootfs(root); err != nil {
				retErr = errors.Join(retErr, fmt.Errorf("unmount rootfs: %w", err))
			}
		}()
	}
	b, err := image.Find(root)
	if errors.Is(err, image.ErrNoVM) {
		return false, nil
	}
	if err == nil {
		b.Close()
	}
	return true, nil
}
