package launch

import "context"

// A step of Launch makes one thing of the VM's on the host, or works out
// one part of its QEMU spec, and states what it needs made before it and
// what it makes: the order below follows from that (TestStepsOrder checks
// it). What a step makes on the host it pushes on the task record, with
// its undoer written next to it (see undoers).
type step struct {
	name  string
	needs []product
	makes []product
	do    func(*build, context.Context) error
}

// product is something a step makes, for the steps after it.
type product string

const (
	described     product = "description"  // c.desc, c.host, c.binary, c.img.Path: the VM as the config, spec and annotations describe it
	recorded      product = "record"       // c.rec, with the jail id and runtime dir; c.img.Jail
	podClaimed    product = "pod claim"    // the pod's one VM is this one
	cgrouped      product = "cgroup"       // c.limits; c.img.Start runs qemu-img in it
	rootfsFound   product = "rootfs"       // c.rootDir and c.boot: the image's disk, ISO or kernel, open
	netnsReady    product = "netns"        // c.nsPath, with its CNI network; c.hooks, create hooks run
	rootDiskMade  product = "root disk"    // the root drive, or a kernel boot's command line (c.qs.Append)
	firmwareOpen  product = "firmware"     // c.qs.Firmware
	devicesOpen   product = "host devices" // host block devices as drives, VFIO functions (c.vfio)
	sharesListed  product = "shares"       // c.qs.Shares, c.mounts; guest RAM on huge pages
	nicsWired     product = "nics"         // c.console, c.netw, c.qs.NICs
	seedWritten   product = "seed"         // the cloud-init seed drive
	accelChosen   product = "accelerator"  // c.qs.Accel
	jailDescribed product = "jail"         // c.j: the jail, shares and device nodes in it
	kernelBound   product = "kernel"       // c.qs.Kernel and Initrd, in the jail
	sized         product = "size"         // vCPUs, guest RAM, NUMA, the balloon; kernel arguments they need
	tpmRunning    product = "tpm"          // c.qs.TPMFD: swtpm runs, for a VM with a TPM
	qemuRunning   product = "qemu"         // c.vm: QEMU, paused
	resizerReady  product = "resizer"      // c.vm.resize, vCPUs pinned
)

// steps are Launch's steps, in order.
var steps = []step{
	{"resolve config", nil, []product{described}, (*build).resolve},
	{"record", []product{described}, []product{recorded}, (*build).record},
	{"claim pod", []product{recorded}, []product{podClaimed}, (*build).claimPod},
	// qemu-img, which reads the untrusted image, runs in the VM's
	// cgroup: it comes before the disks.
	{"cgroup", []product{recorded}, []product{cgrouped}, (*build).cgroup},
	{"rootfs", []product{described, recorded}, []product{rootfsFound}, (*build).rootfs},
	// A disk by URL is fetched from the VM's network namespace.
	{"netns", []product{described, recorded}, []product{netnsReady}, (*build).netns},
	{"disks", []product{rootfsFound, cgrouped, netnsReady}, []product{rootDiskMade}, (*build).disks},
	{"firmware", []product{rootDiskMade}, []product{firmwareOpen}, (*build).firmware},
	{"host devices", []product{described}, []product{devicesOpen}, (*build).hostDevices},
	{"shares", []product{described}, []product{sharesListed}, (*build).shares},
	// A resumed guest's NICs keep their MACs: the pod's interfaces take
	// them before they are read (c.saved comes with the root disk).
	{"network", []product{netnsReady, rootDiskMade}, []product{nicsWired}, (*build).network},
	{"seed", []product{nicsWired, sharesListed, rootfsFound}, []product{seedWritten}, (*build).seed},
	{"accelerator", []product{described}, []product{accelChosen}, (*build).accel},
	{"jail", []product{recorded, accelChosen, sharesListed, devicesOpen}, []product{jailDescribed}, (*build).jail},
	{"kernel", []product{rootfsFound, jailDescribed}, []product{kernelBound}, (*build).kernel},
	{"resources", []product{kernelBound, rootDiskMade, accelChosen, sharesListed, devicesOpen}, []product{sized}, (*build).resources},
	// swtpm keeps its state with the root disk, and runs as the VM's
	// jail id, in its cgroup and network namespace.
	{"tpm", []product{cgrouped, rootfsFound, netnsReady, rootDiskMade, jailDescribed}, []product{tpmRunning}, (*build).tpm},
	{"qemu", []product{cgrouped, nicsWired, seedWritten, firmwareOpen, jailDescribed, sized, tpmRunning}, []product{qemuRunning}, (*build).qemu},
	{"pin vcpus", []product{qemuRunning, sized}, []product{resizerReady}, (*build).newResizer},
}
