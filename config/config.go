package config

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/containerd/errdefs"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/vmshim/vmshim/diskcache"
	"github.com/vmshim/vmshim/jail"
)

// DefaultPath is where the shim looks for its configuration file.
const DefaultPath = "/etc/vmshim/config.toml"

// EnvPath is the environment variable that overrides DefaultPath.
const EnvPath = "VMSHIM_CONFIG"

// Disk drivers accepted by the disk_driver key and the disk-driver annotation.
const (
	DiskDriverVirtioBlk  = "virtio-blk"
	DiskDriverVirtioSCSI = "virtio-scsi"
	DiskDriverNVMe       = "nvme"
)

// Accelerator modes accepted by the accel key.
const (
	AccelAuto = "auto"
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

const (
	// MinMemory is the smallest guest RAM any source may ask for.
	MinMemory = 64 << 20
	// vcpuLimit is the largest vCPU count QEMU's q35 machine accepts.
	vcpuLimit = 288
	// maxCmdline bounds kernel command lines from the file and annotations.
	maxCmdline = 4 << 10
)

// Config is the shim's configuration file.
type Config struct {
	QEMUBinary    string `toml:"qemu_binary"`    // QEMU system emulator, a command name (looked up in PATH by the caller) or an absolute path
	QEMUImg       string `toml:"qemu_img"`       // qemu-img, a command name or an absolute path
	SWTPM         string `toml:"swtpm"`          // swtpm, which emulates a VM's TPM; a command name or an absolute path
	RuncShim      string `toml:"runc_shim"`      // containerd's runc shim, which runs a VM pod's ordinary containers; a command name or an absolute path
	Runc          string `toml:"runc"`           // the runc the runc shim runs them with; "" for its own default
	Accel         string `toml:"accel"`          // auto, kvm or tcg
	DefaultVCPUs  int    `toml:"default_vcpus"`  // vCPUs when neither an annotation nor a CPU limit says
	DefaultMemory string `toml:"default_memory"` // guest RAM (Kubernetes quantity) when neither an annotation nor a memory limit says
	MaxVCPUs      int    `toml:"max_vcpus"`      // upper bound for the vCPU count from any source
	MaxMemory     string `toml:"max_memory"`     // upper bound for guest RAM from any source
	// DefaultMaxMemory is the guest RAM a memory resize can grow a VM to
	// when vmshim.io/max-memory does not say; "" (the default) leaves
	// guest RAM fixed at boot. The headroom costs the guest: its kernel
	// then sees memory above 4 GiB and sets aside a 64 MiB DMA bounce
	// buffer (swiotlb), which the shim turns off for kernel boots.
	DefaultMaxMemory string `toml:"default_max_memory"`
	// MemoryOverhead is what QEMU itself may use beyond guest RAM: the
	// VM's cgroup memory limit is guest RAM plus this.
	MemoryOverhead string `toml:"memory_overhead"`
	MaxDiskSize    string `toml:"max_disk_size"`  // largest virtual size of an image disk or grown root disk
	DiskDriver     string `toml:"disk_driver"`    // virtio-blk, virtio-scsi or nvme
	KernelCmdline  string `toml:"kernel_cmdline"` // base command line for direct kernel boot
	Sandbox        bool   `toml:"sandbox"`        // run QEMU with -sandbox on
	BootTimeout    string `toml:"boot_timeout"`   // Go duration from QEMU start to QMP ready
	// BootSlots paces the node's guest boots: at most this many VMs,
	// across all shims, run their early boot at once, and the rest wait
	// for a slot with their vCPUs stopped (see package bootslot). 0 sizes
	// it to the host's online CPUs under TCG and turns pacing off under
	// KVM; -1 turns it off.
	BootSlots int `toml:"boot_slots"`
	// BootSlotHold bounds how long a booting VM holds its slot (a Go
	// duration): it gives it back sooner once its kernel's clock passed
	// its early boot, or when it ends.
	BootSlotHold string `toml:"boot_slot_hold"`
	// CNINetwork is the CNI network that tasks asking for a new network
	// namespace without a path are attached to; "" attaches none.
	CNINetwork string   `toml:"cni_network"`
	CNIConfDir string   `toml:"cni_conf_dir"` // directory of CNI network configurations
	CNIBinDirs []string `toml:"cni_bin_dirs"` // directories searched, in order, for CNI plugins
	// Jail runs each VM's QEMU in a jail of its own (see package jail):
	// its own uid and gid from JailIDs, no capabilities, a mount namespace
	// that shows it only /usr and its own files. Off only to compare.
	Jail bool `toml:"jail"`
	// JailIDs is the range of host ids, "FIRST-LAST", from which each VM
	// gets its own uid and gid (the same number).
	JailIDs string `toml:"jail_ids"`
	// PrivilegedDevices lets a privileged container's host block devices
	// and VFIO groups reach its VM; off, a privileged container gets none.
	PrivilegedDevices bool `toml:"privileged_devices"`
	// CacheDir holds the disks fetched by URL (vmshim.io/disk-url), one
	// file per sha256, shared by every VM of the node.
	CacheDir string `toml:"cache_dir"`
	// CacheMaxSize caps what CacheDir holds (a quantity; "0" = no cap):
	// above it the least recently used disks that no VM uses are removed.
	CacheMaxSize string `toml:"cache_max_size"`
	// MaxDownloadSize caps a disk-url download, in bytes as served
	// (compressed); "0" leaves only max_disk_size.
	MaxDownloadSize string `toml:"max_download_size"`
	// MaxDecompressionRatio caps a decompressed disk-url disk at this
	// many times its download; 0 leaves only max_disk_size.
	MaxDecompressionRatio int `toml:"max_decompression_ratio"`
	// DownloadTimeout bounds a disk-url download and its decompression
	// (a Go duration) besides the create's own deadline; "0" = no bound.
	DownloadTimeout string `toml:"download_timeout"`
	// CAFile, when set, is a PEM file of certificates trusted for https
	// disk URLs besides the system's.
	CAFile string `toml:"ca_file"`
	// URLDisks allows disks by URL (vmshim.io/disk-url) and pointer
	// images; off, a VM that names one is refused.
	URLDisks bool `toml:"url_disks"`
	// URLDenyCIDRs are the networks (CIDRs or addresses) no download of a
	// URL disk may connect to, even from the pod's network namespace.
	URLDenyCIDRs []string `toml:"url_deny_cidrs"`
	// UEFICode and UEFIVars are OVMF's code and the template of each VM's
	// variables store, for vmshim.io/firmware uefi; UEFISecureCode and
	// UEFISecureVars the same for uefi-secure (Secure Boot, with
	// Microsoft's and the distributions' keys enrolled).
	UEFICode       string `toml:"uefi_code"`
	UEFIVars       string `toml:"uefi_vars"`
	UEFISecureCode string `toml:"uefi_secure_code"`
	UEFISecureVars string `toml:"uefi_secure_vars"`
	// Mesh is what becomes of a VM in a pod whose network namespace
	// steers traffic through a proxy with netfilter rules, when
	// vmshim.io/mesh does not say: MeshRefuse or MeshBypass.
	Mesh string `toml:"mesh"`
	// OnStop is what a stop does to a VM when vmshim.io/on-stop does not
	// say: OnStopPoweroff or OnStopSuspend (which a VM without a
	// root-disk volume does not follow: it powers off).
	OnStop string `toml:"on_stop"`
	// OnResumeError is what becomes of a VM whose root-disk volume holds
	// a saved state it cannot resume, when vmshim.io/on-resume-error
	// does not say: OnResumeErrorRefuse or OnResumeErrorBoot.
	OnResumeError string `toml:"on_resume_error"`
	// MemMerge offers guest RAM to KSM, the kernel's same-page merging
	// (QEMU's mem-merge, on by default); it takes effect only where the
	// node runs KSM (/sys/kernel/mm/ksm/run).
	MemMerge bool `toml:"mem_merge"`
	// Balloon gives every VM whose guest RAM can be given back (not on
	// huge pages, no passed-through device) a virtio-balloon device with
	// free page reporting, unless vmshim.io/balloon says off.
	Balloon bool `toml:"balloon"`
	// BalloonStatsInterval is how often QEMU asks a guest with a balloon
	// for its memory statistics, which the shim then reads as often: a
	// Go duration of whole seconds, 1s to 1h, or 0 for never.
	BalloonStatsInterval string `toml:"balloon_stats_interval"`
	// TPM gives every VM a TPM unless vmshim.io/tpm says none: TPM20, or
	// TPMNone (also when "") for none.
	TPM string `toml:"tpm"`
	// QEMUUser was the one user every QEMU ran as; each VM now has its
	// own (Jail). Kept only to name it when a config still sets it.
	QEMUUser string `toml:"qemu_user"`
}

// DefaultJailIDs is the default range of jail ids: 65536 ids from
// 0x70000000, above the ranges systemd gives containers
// (0x00080000-0x6FFFFFFF) and below 2^31, far from the ranges the kubelet
// gives pods with user namespaces, which it hands out from 65536 upwards.
const DefaultJailIDs = "1879048192-1879113727"

// cniName is CNI's rule for network names.
var cniName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`)

// Default returns the built-in configuration.
func Default() Config {
	return Config{
		QEMUBinary:            "qemu-system-x86_64",
		QEMUImg:               "qemu-img",
		SWTPM:                 "swtpm",
		RuncShim:              "containerd-shim-runc-v2",
		Accel:                 AccelAuto,
		DefaultVCPUs:          1,
		DefaultMemory:         "512Mi",
		MaxVCPUs:              16,
		MaxMemory:             "16Gi",
		MemoryOverhead:        "128Mi",
		MaxDiskSize:           "256Gi",
		DiskDriver:            DiskDriverVirtioBlk,
		KernelCmdline:         "console=ttyS0 no_timer_check",
		Sandbox:               true,
		BootTimeout:           "60s",
		BootSlotHold:          "30s",
		CNIConfDir:            "/etc/cni/net.d",
		CNIBinDirs:            []string{"/opt/cni/bin", "/usr/lib/cni"},
		Jail:                  true,
		JailIDs:               DefaultJailIDs,
		CacheDir:              "/var/lib/vmshim/disks",
		CacheMaxSize:          "50Gi",
		MaxDownloadSize:       "10Gi",
		MaxDecompressionRatio: 100,
		DownloadTimeout:       "1h",
		URLDisks:              true,
		URLDenyCIDRs:          slices.Clone(diskcache.DefaultDeny),
		UEFICode:              "/usr/share/OVMF/OVMF_CODE_4M.fd",
		UEFIVars:              "/usr/share/OVMF/OVMF_VARS_4M.fd",
		UEFISecureCode:        "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd",
		UEFISecureVars:        "/usr/share/OVMF/OVMF_VARS_4M.ms.fd",
		Mesh:                  MeshRefuse,
		OnStop:                OnStopPoweroff,
		OnResumeError:         OnResumeErrorRefuse,
		Balloon:               true,
		BalloonStatsInterval:  "10s",
		MemMerge:              true,
	}
}

// PathFrom picks the config path: explicit (runtime option ConfigPath) > $VMSHIM_CONFIG > DefaultPath.
func PathFrom(explicit string) string {
	if explicit != "" {
		return explicit
	}
	if p := os.Getenv(EnvPath); p != "" {
		return p
	}
	return DefaultPath
}

// Load reads the file at path over Default(), strictly, and validates the result.
// A missing file at DefaultPath (and only there) yields Default().
func Load(path string) (Config, error) {
	cfg := Default()
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if filepath.Clean(path) == DefaultPath {
				return cfg, nil
			}
			return Config{}, errdefs.ErrNotFound.WithMessage(fmt.Sprintf("config %s: file does not exist", path))
		}
		return Config{}, fmt.Errorf("config %s: %w", path, errdefs.ErrFailedPrecondition.WithMessage(oneLine(err.Error())))
	}
	md, err := toml.Decode(string(data), &cfg)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, invalidf("%s", oneLine(err.Error())))
	}
	if keys := unknownKeys(md.Undecoded()); len(keys) > 0 {
		word := "key"
		if len(keys) > 1 {
			word = "keys"
		}
		return Config{}, fmt.Errorf("config %s: %w", path, invalidf("unknown %s %s", word, strings.Join(keys, ", ")))
	}
	if err := cfg.validate(); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// unknownKeys lists undecoded keys, quoted and sorted, leaving out keys
// whose table is itself unknown.
func unknownKeys(undecoded []toml.Key) []string {
	seen := make(map[string]bool, len(undecoded))
	for _, k := range undecoded {
		seen[k.String()] = true
	}
	var out []string
	for _, k := range undecoded {
		parentUnknown := false
		for i := 1; i < len(k); i++ {
			if seen[toml.Key(k[:i]).String()] {
				parentUnknown = true
				break
			}
		}
		if !parentUnknown {
			out = append(out, fmt.Sprintf("%q", k.String()))
		}
	}
	sort.Strings(out)
	return out
}

// Validate checks every value and names the key of each invalid one.
func (c Config) Validate() error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return nil
}

func (c Config) validate() error {
	var problems []string
	add := func(key, format string, args ...any) {
		problems = append(problems, key+": "+fmt.Sprintf(format, args...))
	}
	for key, v := range map[string]string{"qemu_binary": c.QEMUBinary, "qemu_img": c.QEMUImg, "swtpm": c.SWTPM, "runc_shim": c.RuncShim} {
		if msg := checkCommand(v); msg != "" {
			add(key, "%s", msg)
		}
	}
	if c.Runc != "" {
		if msg := checkCommand(c.Runc); msg != "" {
			add("runc", "%s", msg)
		}
	}
	if !oneOf(c.Accel, AccelAuto, AccelKVM, AccelTCG) {
		add("accel", "%q is not one of auto, kvm, tcg", c.Accel)
	}
	if c.TPM != "" && !oneOf(c.TPM, TPM20, TPMNone) {
		add("tpm", "%q is not one of %s, %s", c.TPM, TPM20, TPMNone)
	}
	if c.MaxVCPUs < 1 || c.MaxVCPUs > vcpuLimit {
		add("max_vcpus", "%d is not in 1..%d", c.MaxVCPUs, vcpuLimit)
	} else if c.DefaultVCPUs < 1 || c.DefaultVCPUs > c.MaxVCPUs {
		add("default_vcpus", "%d is not in 1..%d (max_vcpus)", c.DefaultVCPUs, c.MaxVCPUs)
	}
	maxMem, err := parseBytes(c.MaxMemory)
	switch {
	case err != nil:
		add("max_memory", "%v", err)
	case maxMem < MinMemory:
		add("max_memory", "%q is less than 64Mi", c.MaxMemory)
	default:
		if mem, err := parseBytes(c.DefaultMemory); err != nil {
			add("default_memory", "%v", err)
		} else if mem < MinMemory || mem > maxMem {
			add("default_memory", "%q is not in 64Mi..%s (max_memory)", c.DefaultMemory, c.MaxMemory)
		}
		if c.DefaultMaxMemory != "" {
			if mem, err := parseBytes(c.DefaultMaxMemory); err != nil {
				add("default_max_memory", "%v", err)
			} else if mem < MinMemory || mem > maxMem {
				add("default_max_memory", "%q is not in 64Mi..%s (max_memory)", c.DefaultMaxMemory, c.MaxMemory)
			}
		}
	}
	if _, err := parseBytes(c.MemoryOverhead); err != nil {
		add("memory_overhead", "%v", err)
	}
	if size, err := parseBytes(c.MaxDiskSize); err != nil {
		add("max_disk_size", "%v", err)
	} else if size == 0 {
		add("max_disk_size", "%q must be greater than zero", c.MaxDiskSize)
	}
	if !validDiskDriver(c.DiskDriver) {
		add("disk_driver", "%q is not one of virtio-blk, virtio-scsi, nvme, sata, ide", c.DiskDriver)
	}
	if !oneOf(c.OnStop, OnStopPoweroff, OnStopSuspend) {
		add("on_stop", "%q is not one of %s, %s", c.OnStop, OnStopPoweroff, OnStopSuspend)
	}
	if !oneOf(c.OnResumeError, OnResumeErrorRefuse, OnResumeErrorBoot) {
		add("on_resume_error", "%q is not one of %s, %s", c.OnResumeError, OnResumeErrorRefuse, OnResumeErrorBoot)
	}
	if !oneOf(c.Mesh, MeshRefuse, MeshBypass) {
		add("mesh", "%q is not one of %s, %s", c.Mesh, MeshRefuse, MeshBypass)
	}
	if msg := checkCmdline(c.KernelCmdline); msg != "" {
		add("kernel_cmdline", "%s", msg)
	}
	if d, err := time.ParseDuration(c.BootTimeout); err != nil {
		add("boot_timeout", "%q is not a duration (e.g. 60s)", c.BootTimeout)
	} else if d <= 0 {
		add("boot_timeout", "%q must be greater than zero", c.BootTimeout)
	}
	if c.BootSlots < -1 || c.BootSlots > MaxBootSlots {
		add("boot_slots", "%d is not -1 (no pacing), 0 (auto) or a count up to %d", c.BootSlots, MaxBootSlots)
	}
	if d, err := time.ParseDuration(c.BootSlotHold); err != nil {
		add("boot_slot_hold", "%q is not a duration (e.g. 30s)", c.BootSlotHold)
	} else if d <= 0 || d > maxBootSlotHold {
		add("boot_slot_hold", "%q is not greater than zero and at most %s", c.BootSlotHold, maxBootSlotHold)
	}
	if d, err := time.ParseDuration(c.BalloonStatsInterval); err != nil {
		add("balloon_stats_interval", "%q is not a duration (e.g. 10s)", c.BalloonStatsInterval)
	} else if d != 0 && (d < time.Second || d > maxBalloonStatsInterval || d%time.Second != 0) {
		add("balloon_stats_interval", "%q is not 0 or a whole number of seconds from 1s to 1h", c.BalloonStatsInterval)
	}
	if c.CNINetwork != "" && !cniName.MatchString(c.CNINetwork) {
		add("cni_network", "%q is not a CNI network name (letters, digits, _ . -, starting with a letter or digit)", c.CNINetwork)
	}
	if msg := checkDir(c.CNIConfDir); msg != "" {
		add("cni_conf_dir", "%s", msg)
	}
	if len(c.CNIBinDirs) == 0 {
		add("cni_bin_dirs", "must list at least one directory")
	}
	for _, d := range c.CNIBinDirs {
		if msg := checkDir(d); msg != "" {
			add("cni_bin_dirs", "%s", msg)
		}
	}
	if msg := checkDir(c.CacheDir); msg != "" {
		add("cache_dir", "%s", msg)
	}
	if _, err := parseBytes(c.CacheMaxSize); err != nil {
		add("cache_max_size", "%v", err)
	}
	if _, err := parseBytes(c.MaxDownloadSize); err != nil {
		add("max_download_size", "%v", err)
	}
	if c.MaxDecompressionRatio < 0 {
		add("max_decompression_ratio", "%d is negative", c.MaxDecompressionRatio)
	}
	if d, err := time.ParseDuration(c.DownloadTimeout); err != nil {
		add("download_timeout", "%q is not a duration (e.g. 1h)", c.DownloadTimeout)
	} else if d < 0 {
		add("download_timeout", "%q is negative", c.DownloadTimeout)
	}
	for key, v := range map[string]string{"uefi_code": c.UEFICode, "uefi_vars": c.UEFIVars, "uefi_secure_code": c.UEFISecureCode, "uefi_secure_vars": c.UEFISecureVars} {
		if msg := checkDir(v); msg != "" {
			add(key, "%s", msg)
		}
	}
	if c.CAFile != "" {
		if msg := checkDir(c.CAFile); msg != "" {
			add("ca_file", "%s", msg)
		}
	}
	if _, err := diskcache.ParseDeny(c.URLDenyCIDRs); err != nil {
		add("url_deny_cidrs", "%v", err)
	}
	if c.QEMUUser != "" {
		add("qemu_user", "no longer supported: each VM's QEMU runs as an id of its own from jail_ids")
	}
	if _, err := jail.ParseIDRange(c.JailIDs); err != nil {
		add("jail_ids", "%v", err)
	}
	if len(problems) == 0 {
		return nil
	}
	sort.Strings(problems)
	return invalidf("%s", strings.Join(problems, "; "))
}

// MemoryOverheadBytes returns the validated memory_overhead.
func (c Config) MemoryOverheadBytes() int64 { return mustBytes(c.MemoryOverhead) }

// MaxBootSlots bounds boot_slots.
const MaxBootSlots = 1024

// maxBootSlotHold bounds boot_slot_hold.
const maxBootSlotHold = 10 * time.Minute

// BootSlotHoldDuration returns the validated boot_slot_hold.
func (c Config) BootSlotHoldDuration() time.Duration {
	d, _ := time.ParseDuration(c.BootSlotHold)
	return d
}

// bootTimeout returns the validated boot_timeout.
// maxBalloonStatsInterval bounds balloon_stats_interval.
const maxBalloonStatsInterval = time.Hour

// balloonStatsInterval is BalloonStatsInterval, once validated.
func (c Config) balloonStatsInterval() time.Duration {
	d, _ := time.ParseDuration(c.BalloonStatsInterval)
	return d
}

func (c Config) bootTimeout() time.Duration {
	d, _ := time.ParseDuration(c.BootTimeout)
	return d
}

func checkCommand(v string) string {
	switch {
	case v == "":
		return "must not be empty"
	case strings.ContainsAny(v, "\x00\n"):
		return fmt.Sprintf("%q contains a newline or NUL", v)
	case strings.Contains(v, "/") && !filepath.IsAbs(v):
		return fmt.Sprintf("%q must be a command name or an absolute path", v)
	}
	return ""
}

// checkDir accepts an absolute directory path.
func checkDir(v string) string {
	switch {
	case strings.ContainsAny(v, "\x00\n"):
		return fmt.Sprintf("%q contains a newline or NUL", v)
	case !filepath.IsAbs(v):
		return fmt.Sprintf("%q must be an absolute path", v)
	}
	return ""
}

func checkCmdline(v string) string {
	switch {
	case strings.ContainsAny(v, "\x00\n\r"):
		return "contains a newline or NUL"
	case len(v) > maxCmdline:
		return fmt.Sprintf("%d bytes, more than %d", len(v), maxCmdline)
	}
	return ""
}

func validDiskDriver(v string) bool {
	return oneOf(v, DiskDriverVirtioBlk, DiskDriverVirtioSCSI, DiskDriverNVMe, DiskDriverSATA, DiskDriverIDE)
}

func oneOf(v string, allowed ...string) bool {
	for _, a := range allowed {
		if v == a {
			return true
		}
	}
	return false
}

// parseBytes parses a non-negative Kubernetes quantity into bytes (rounded up).
func parseBytes(s string) (int64, error) {
	// ParseQuantity and Cmp take time that grows steeply with a decimal
	// exponent ("1e-9999999" takes seconds, longer ones hours); no byte
	// count needs one outside -99..99.
	if i := strings.IndexAny(s, "eE"); i >= 0 && s[i+1:] != "" && s[i+1:] != "i" {
		if exp, err := strconv.Atoi(s[i+1:]); errors.Is(err, strconv.ErrSyntax) {
			return 0, fmt.Errorf("%q is not a quantity (e.g. 512Mi)", s)
		} else if err != nil || exp < -99 || exp > 99 {
			return 0, fmt.Errorf("%q has an exponent outside -99..99", s)
		}
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a quantity (e.g. 512Mi)", s)
	}
	if q.Sign() < 0 {
		return 0, fmt.Errorf("%q is negative", s)
	}
	// ParseQuantity clamps huge binary-SI values to MaxInt64, so reaching it means too large.
	if q.Cmp(*resource.NewQuantity(math.MaxInt64, resource.BinarySI)) >= 0 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return q.Value(), nil
}

// mustBytes parses a quantity that validate has already accepted.
func mustBytes(s string) int64 {
	n, _ := parseBytes(s)
	return n
}

// invalidf returns a one-line error that is errdefs.ErrInvalidArgument.
func invalidf(format string, args ...any) error {
	return errdefs.ErrInvalidArgument.WithMessage(fmt.Sprintf(format, args...))
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// JailIDRange is jail_ids; call it on a validated Config.
func (c Config) JailIDRange() jail.IDRange {
	r, _ := jail.ParseIDRange(c.JailIDs)
	return r
}

// MaxDiskBytes is max_disk_size in bytes; call it on a validated Config.
func (c Config) MaxDiskBytes() int64 {
	return mustBytes(c.MaxDiskSize)
}

// URLDeny is url_deny_cidrs parsed; call it on a validated Config.
func (c Config) URLDeny() []netip.Prefix {
	deny, _ := diskcache.ParseDeny(c.URLDenyCIDRs)
	return deny
}

// CacheMaxBytes is cache_max_size in bytes (0 = no cap); call it on a
// validated Config.
func (c Config) CacheMaxBytes() int64 {
	return mustBytes(c.CacheMaxSize)
}

// MaxDownloadBytes is max_download_size in bytes (0 = max_disk_size
// alone); call it on a validated Config.
func (c Config) MaxDownloadBytes() int64 {
	return mustBytes(c.MaxDownloadSize)
}

// DownloadTimeoutDuration is download_timeout (0 = none); call it on a
// validated Config.
func (c Config) DownloadTimeoutDuration() time.Duration {
	d, _ := time.ParseDuration(c.DownloadTimeout)
	return d
}
