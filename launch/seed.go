package launch

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/cloudinit"
	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/image"
	"github.com/vmshim/vmshim/network"
	"github.com/vmshim/vmshim/qemu"
)

// hostEnv lists environment variables of the container that describe the
// container, not the workload, and would only mislead the guest.
var hostEnv = map[string]bool{"PATH": true, "HOME": true, "HOSTNAME": true, "TERM": true}

// shares exposes the container's volumes to the guest over virtio-9p and
// returns them for the guest to mount.
func shares(ctx context.Context, spec *specs.Spec, qs *qemu.Spec, rootVolume *config.RootVolume) (mounts []cloudinit.Mount, hugePages []int64) {
	list, skipped := config.ResolveShares(spec)
	for i, s := range list {
		if rootVolume != nil && s.GuestPath == rootVolume.Path {
			// It holds the root disk, which the guest has as a disk.
			skipped = append(skipped, fmt.Sprintf("%q: it holds the root disk", s.GuestPath))
			continue
		}
		if size := hugetlbfsPageSize(s.HostPath); size != 0 {
			// A hugepages volume is how a pod is given huge pages; guest
			// RAM takes them (see config.Resources.HugePageSize).
			skipped = append(skipped, fmt.Sprintf("%q: a hugetlbfs volume", s.GuestPath))
			hugePages = append(hugePages, size)
			continue
		}
		qs.Shares = append(qs.Shares, qemu.Share{ID: fmt.Sprintf("%d", i), Tag: s.Tag, Path: s.HostPath, ReadOnly: s.ReadOnly})
		mounts = append(mounts, cloudinit.Mount{Tag: s.Tag, Path: s.GuestPath, ReadOnly: s.ReadOnly})
	}
	if len(skipped) > 0 {
		log.G(ctx).WithField("mounts", strings.Join(skipped, "; ")).Info("mounts not shared with the vm")
	}
	return mounts, hugePages
}

// hugetlbfsPageSize is the page size of the hugetlbfs at path, 0 when
// path is not one.
func hugetlbfsPageSize(path string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil || st.Type != unix.HUGETLBFS_MAGIC {
		return 0
	}
	return st.Bsize
}

// cloudInitFiles are the files of the VM's cloud-init NoCloud seed.
func cloudInitFiles(ns string, spec *specs.Spec, host string, desc *config.VM, mounts []cloudinit.Mount, nics []network.NIC) (map[string][]byte, error) {
	ci := cloudinit.Documents{
		InstanceID:    instanceID(ns, desc.ID, spec),
		Hostname:      host,
		UserData:      desc.UserData,
		SSHKeys:       desc.SSHAuthorizedKeys,
		Mounts:        mounts,
		NetworkConfig: desc.NetworkConfig,
	}
	for _, kv := range desc.Env {
		if k, _, ok := strings.Cut(kv, "="); ok && !hostEnv[k] {
			ci.Env = append(ci.Env, kv)
		}
	}
	for _, n := range nics {
		mac := n.MAC.String()
		ci.MACs = append(ci.MACs, mac)
		if n.Lease6 != nil {
			ci.IPv6 = append(ci.IPv6, mac)
			if n.Lease == nil {
				ci.NoIPv4 = append(ci.NoIPv4, mac)
			}
		}
	}
	files, err := ci.Files()
	if err != nil {
		return nil, fmt.Errorf("cloud-init seed: %w", err)
	}
	return files, nil
}

// instanceID is stable for the pod, so cloud-init's once-per-instance
// steps run once per pod, not at every container restart; outside a pod
// it is the container's.
func instanceID(ns, id string, spec *specs.Spec) string {
	if uid := config.PodUID(spec); uid != "" {
		return "vmshim-" + uid
	}
	if sid := config.SandboxID(spec); sid != "" {
		return "vmshim-" + sid
	}
	return "vmshim-" + ns + "-" + id
}

// shares exposes the container's volumes to the guest over virtio-9p.
func (c *build) shares(ctx context.Context) error {
	var hugePages []int64
	c.mounts, hugePages = shares(ctx, c.spec, &c.qs, c.desc.RootVolume)
	// A hugetlbfs volume is how Kubernetes gives a pod huge pages; with
	// containerd's default disable_hugetlb_controller the spec carries
	// no hugepages limit, so the volume alone says guest RAM goes there.
	for _, size := range hugePages {
		if err := c.desc.OnHugePages(size, "a hugetlbfs volume"); err != nil {
			return err
		}
	}
	return nil
}

// seed writes the cloud-init seed into the VM's files directory.
func (c *build) seed(context.Context) error {
	var nics []network.NIC
	if c.netw != nil {
		nics = c.netw.NICs()
	}
	files, err := cloudInitFiles(c.ns, c.spec, c.host, c.desc, c.mounts, nics)
	if err != nil {
		return err
	}
	f, err := c.create(image.SeedName)
	if err != nil {
		return err
	}
	if err := cloudinit.WriteSeed(f, files); err != nil {
		return fmt.Errorf("cloud-init seed: %w", err)
	}
	// QEMU opens the seed read-only: it needs a read-only fd of it.
	ro, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cloud-init seed: %w", err)
	}
	c.qs.Drives = append(c.qs.Drives, seedDrive(c.fdSet(c.keep(ro)), c.desc.DiskDriver))
	return nil
}
