package config

import (
	"cmp"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// VM is the validated description of the VM a container asks for.
type VM struct {
	ID                string
	Hostname          string // spec.Hostname
	VCPUs             int
	MemoryMiB         int
	DiskDriver        string
	RootDiskSize      int64  // bytes; 0 = keep the image's size
	UserData          string // cloud-config, script or MIME multipart; "" = none
	SSHAuthorizedKeys []string
	NetworkConfig     string   // cloud-init network-config (v1 or v2 YAML); "" = DHCP on every NIC
	KernelCmdline     string   // cfg.KernelCmdline + " " + annotation (trimmed)
	Env               []string // spec.Process.Env
	BootTimeout       time.Duration

	// RootVolume keeps the root disk across boots; nil boots from an
	// overlay made anew each time.
	RootVolume     *RootVolume
	RootDiskPolicy string // RootDiskKeep or RootDiskRecreate, with a RootVolume
	DiskURL        string // the VM's disk comes from this URL, not the image
	DiskSHA256     string // the sha256 of the file at DiskURL, lowercase hex

	// Firmware is FirmwareBIOS, FirmwareUEFI or FirmwareUEFISecure from
	// the annotation; "" leaves it to the image (its label), else BIOS.
	Firmware string
	VNC      bool   // vmshim.io/graphics vnc
	NICModel string // NICVirtio (also when ""), NICE1000, NICE1000E or NICRTL8139
	Windows  bool   // vmshim.io/os windows
	// TPM is TPM20 for a VM with a TPM 2.0 (vmshim.io/tpm, else the
	// config's tpm), "" for none.
	TPM     string
	Machine string // vmshim.io/machine: MachineMicroVM, or "" (or MachineQ35) for q35
	Mesh    string // vmshim.io/mesh, else the config's mesh: MeshRefuse or MeshBypass
	// Suspend saves the VM onto its root-disk volume at a stop, instead
	// of the power button: vmshim.io/on-stop suspend, or the config's
	// on_stop for a VM with a root-disk volume.
	Suspend bool
	// StopGrace is the stop's grace period the kubelet gave the
	// container (AnnotationTerminationGracePeriod), for a VM that
	// suspends; 0 when unknown.
	StopGrace time.Duration
	// ResumeErrorBoots removes a saved state the VM cannot resume and
	// boots the disk, instead of refusing the VM: vmshim.io/on-resume-error
	// boot, or the config's on_resume_error.
	ResumeErrorBoots bool
	// Balloon gives the VM a virtio-balloon device with free page
	// reporting (vmshim.io/balloon, else the config's balloon; never
	// with guest RAM on huge pages). BalloonAsked says the annotation
	// asked for it: a VM that cannot have one (a passed-through
	// device, known at launch) is refused rather than run without.
	Balloon, BalloonAsked bool
	// BalloonStatsInterval is how often the guest's memory statistics
	// are asked for and read; 0 for never.
	BalloonStatsInterval time.Duration

	Resources Resources
}

// Resolve combines cfg, the vmshim.io/* annotations and the resource limits of
// spec into the VM container id asks for; precedence is annotation > spec limit > cfg default.
func Resolve(cfg Config, id string, spec *specs.Spec) (*VM, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if id == "" {
		return nil, invalidf("container id is empty")
	}
	if spec == nil {
		return nil, invalidf("container %s: no runtime spec", id)
	}
	ann, err := parseAnnotations(cfg, spec.Annotations)
	if err != nil {
		return nil, err
	}
	vm := &VM{
		ID:                id,
		Hostname:          spec.Hostname,
		DiskDriver:        cfg.DiskDriver,
		RootDiskSize:      ann.rootDiskSize,
		UserData:          ann.userData,
		SSHAuthorizedKeys: ann.sshKeys,
		NetworkConfig:     ann.networkConfig,
		KernelCmdline:     cfg.KernelCmdline,
		BootTimeout:       cfg.bootTimeout(),
	}
	if ann.diskDriver != "" {
		vm.DiskDriver = ann.diskDriver
	}
	if ann.kernelCmdline != "" {
		vm.KernelCmdline = strings.TrimSpace(cfg.KernelCmdline + " " + ann.kernelCmdline)
	}
	if spec.Process != nil && len(spec.Process.Env) > 0 {
		vm.Env = append([]string(nil), spec.Process.Env...)
	}
	if vm.VCPUs, err = resolveVCPUs(cfg, ann, spec); err != nil {
		return nil, err
	}
	memBytes, err := resolveMemory(cfg, ann, spec)
	if err != nil {
		return nil, err
	}
	vm.MemoryMiB = int(memBytes >> 20)
	if err := resolveResources(cfg, ann, spec.Annotations, spec, vm); err != nil {
		return nil, err
	}
	vm.DiskURL, vm.DiskSHA256 = ann.diskURL, ann.diskSHA256
	if err := resolveBalloon(cfg, ann, vm); err != nil {
		return nil, err
	}
	resolveGuest(cfg, vm, ann)
	vm.Mesh = cfg.Mesh
	if ann.guest.mesh != "" {
		vm.Mesh = ann.guest.mesh
	}
	if err := resolveMachine(vm, ann, spec.Annotations); err != nil {
		return nil, err
	}
	if ann.rootDiskVolume != "" {
		if vm.RootVolume, err = resolveRootVolume(spec, ann.rootDiskVolume); err != nil {
			return nil, err
		}
		vm.RootDiskPolicy = RootDiskKeep
		if ann.rootDiskPolicy != "" {
			vm.RootDiskPolicy = ann.rootDiskPolicy
		}
	}
	switch {
	case ann.guest.onStop == OnStopSuspend && vm.RootVolume == nil:
		return nil, annotationErr(AnnotationOnStop, "%s needs %s: the state is saved beside the root disk", OnStopSuspend, AnnotationRootDiskVolume)
	case ann.guest.onStop == OnStopSuspend && vm.RootVolume.Block:
		return nil, annotationErr(AnnotationOnStop, "%s needs a filesystem volume for %s, and %s is a block device", OnStopSuspend, AnnotationRootDiskVolume, vm.RootVolume.Path)
	case ann.guest.onStop != "":
		vm.Suspend = ann.guest.onStop == OnStopSuspend
	default:
		vm.Suspend = cfg.OnStop == OnStopSuspend && vm.RootVolume != nil && !vm.RootVolume.Block
	}
	vm.ResumeErrorBoots = cmp.Or(ann.guest.onResumeError, cfg.OnResumeError) == OnResumeErrorBoot
	if vm.Suspend {
		if vm.StopGrace, err = stopGrace(spec.Annotations); err != nil {
			return nil, err
		}
	}
	return vm, nil
}

// resolveVCPUs picks the annotation, else the CPU limit rounded up, else the default.
func resolveVCPUs(cfg Config, ann annotations, spec *specs.Spec) (int, error) {
	if ann.vcpus > 0 {
		return ann.vcpus, nil
	}
	if spec.Linux == nil || spec.Linux.Resources == nil || spec.Linux.Resources.CPU == nil {
		return cfg.DefaultVCPUs, nil
	}
	n, ok := VCPUsForCPU(spec.Linux.Resources.CPU)
	if !ok {
		return cfg.DefaultVCPUs, nil
	}
	if n > uint64(cfg.MaxVCPUs) {
		cpu := spec.Linux.Resources.CPU
		return 0, invalidf("spec linux.resources.cpu: quota %d / period %d gives %d vcpus, more than %d (max_vcpus)",
			*cpu.Quota, *cpu.Period, n, cfg.MaxVCPUs)
	}
	return int(n), nil
}

// VCPUsForCPU is the vCPU count a CPU limit gives: its quota over its
// period, rounded up. ok is false when cpu sets no limit.
func VCPUsForCPU(cpu *specs.LinuxCPU) (n uint64, ok bool) {
	if cpu == nil || cpu.Quota == nil || *cpu.Quota <= 0 || cpu.Period == nil || *cpu.Period == 0 {
		return 0, false
	}
	quota, period := uint64(*cpu.Quota), *cpu.Period
	n = quota / period
	if quota%period != 0 {
		n++
	}
	return n, true
}

// resolveMemory picks the annotation, else the memory limit, else the default, in bytes.
func resolveMemory(cfg Config, ann annotations, spec *specs.Spec) (int64, error) {
	var limit int64
	if spec.Linux != nil && spec.Linux.Resources != nil && spec.Linux.Resources.Memory != nil &&
		spec.Linux.Resources.Memory.Limit != nil {
		limit = *spec.Linux.Resources.Memory.Limit
	}
	if ann.memoryBytes > 0 {
		if limit > 0 && ann.memoryBytes > limit {
			return 0, annotationErr(AnnotationMemory, "%d bytes is more than the container's memory limit (%d bytes)", ann.memoryBytes, limit)
		}
		return ann.memoryBytes, nil
	}
	if spec.Linux == nil || spec.Linux.Resources == nil || spec.Linux.Resources.Memory == nil ||
		spec.Linux.Resources.Memory.Limit == nil || *spec.Linux.Resources.Memory.Limit <= 0 {
		return mustBytes(cfg.DefaultMemory), nil
	}
	if limit < MinMemory {
		return 0, invalidf("spec linux.resources.memory.limit: %d bytes is less than 64Mi", limit)
	}
	if limit > mustBytes(cfg.MaxMemory) {
		return 0, invalidf("spec linux.resources.memory.limit: %d bytes is more than %s (max_memory)", limit, cfg.MaxMemory)
	}
	return limit, nil
}

// resolveGuest applies the annotations that fit the VM to its guest. A
// Windows guest gets what its installer has drivers for, e1000e and SATA,
// unless the annotations say otherwise.
func resolveGuest(cfg Config, vm *VM, ann annotations) {
	g := ann.guest
	vm.Firmware, vm.VNC = g.firmware, g.graphics == GraphicsVNC
	if tpm := cmp.Or(g.tpm, cfg.TPM); tpm != TPMNone {
		vm.TPM = tpm
	}
	if g.os == OSWindows {
		vm.Windows, vm.NICModel = true, NICE1000E
		if ann.diskDriver == "" {
			vm.DiskDriver = DiskDriverSATA
		}
	}
	if g.nicModel != "" {
		vm.NICModel = g.nicModel
	}
}

// resolveBalloon decides whether the VM gets a balloon, once its guest
// RAM is resolved: not on huge pages, which are preallocated and cannot
// be given back (asked for there, it is refused in one line; OnHugePages
// does the same for huge pages found later).
func resolveBalloon(cfg Config, ann annotations, vm *VM) error {
	switch ann.guest.balloon {
	case BalloonOn:
		if vm.Resources.HugePageSize != 0 {
			return balloonOnHugePages("the container's hugepages limit")
		}
		vm.Balloon, vm.BalloonAsked = true, true
	case BalloonOff:
	default:
		vm.Balloon = cfg.Balloon && vm.Resources.HugePageSize == 0
	}
	if vm.Balloon {
		vm.BalloonStatsInterval = cfg.balloonStatsInterval()
	}
	return nil
}

// balloonOnHugePages is the error of a balloon asked for with guest RAM
// on huge pages, which what asks for.
func balloonOnHugePages(what string) error {
	return annotationErr(AnnotationBalloon, "%s: guest RAM on huge pages (as %s asks) is preallocated and cannot be given back", BalloonOn, what)
}

// maxStopGrace bounds AnnotationTerminationGracePeriod: a day.
const maxStopGrace = 24 * time.Hour

// stopGrace reads the grace period the kubelet gave the container; 0
// when there is none.
func stopGrace(in map[string]string) (time.Duration, error) {
	v, ok := in[AnnotationTerminationGracePeriod]
	if !ok {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || time.Duration(n)*time.Second > maxStopGrace {
		return 0, annotationErr(AnnotationTerminationGracePeriod, "%s is not a number of seconds from 0 to %d", quoteValue(v), int64(maxStopGrace/time.Second))
	}
	// The kubelet gives a stop 2 s at least, whatever the pod says.
	return time.Duration(max(n, 2)) * time.Second, nil
}
