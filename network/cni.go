package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/utils"
)

// cniIfName is the interface CNI creates in the namespace.
const cniIfName = "eth0"

// CNIConfig says where CNI networks and plugins are.
type CNIConfig struct {
	Network  string   // name of the network (the "name" of a .conflist/.conf in ConfDir)
	ConfDir  string   // e.g. /etc/cni/net.d
	BinDirs  []string // e.g. /opt/cni/bin, /usr/lib/cni
	CacheDir string   // libcni cache dir; "" = libcni default (/var/lib/cni)
}

// CNIAttachment is one attachment, JSON-serialisable so it can be recorded in the bundle and undone later.
type CNIAttachment struct {
	Network     string
	ContainerID string
	Netns       string
	IfName      string
	ConfList    json.RawMessage // the conflist bytes used for ADD, every plugin inlined
	BinDirs     []string
	CacheDir    string   `json:",omitempty"`
	IPs         []string // CIDRs from the result, for logs and tests
}

// AttachCNI runs ADD for the network on netns with ifName "eth0": PrepareCNI,
// then Attach.
func AttachCNI(ctx context.Context, c CNIConfig, containerID, netns string) (*CNIAttachment, error) {
	a, err := PrepareCNI(ctx, c, containerID, netns)
	if err != nil {
		return nil, err
	}
	if err := a.Attach(ctx); err != nil {
		return nil, err
	}
	return a, nil
}

// PrepareCNI finds the network and its plugins and returns the attachment
// that Attach makes and Detach undoes; it changes nothing, so a caller can
// write the attachment down first. containerID must be unique and stable
// for the attachment (e.g. "<namespace>-<id>").
func PrepareCNI(ctx context.Context, c CNIConfig, containerID, netns string) (*CNIAttachment, error) {
	if err := checkAttachArgs(c, containerID, netns); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cni network %q: %w", c.Network, err)
	}
	if _, err := os.Stat(netns); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("cni network %q: netns %s: %w", c.Network, netns, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("cni network %q: netns %s: %w", c.Network, netns, err)
	}
	list, err := findNetwork(ctx, c.Network, c.ConfDir)
	if err != nil {
		return nil, err
	}
	a := &CNIAttachment{
		Network:     list.Name,
		ContainerID: containerID,
		Netns:       netns,
		IfName:      cniIfName,
		ConfList:    list.Bytes,
		BinDirs:     slices.Clone(c.BinDirs),
		CacheDir:    c.CacheDir,
	}
	if err := a.checkPlugins(list); err != nil {
		return nil, err
	}
	return a, nil
}

// Attach runs ADD and notes the addresses it gave; on error it runs DEL
// so nothing is left. The plugins run in the caller's network namespace,
// so host-side devices such as a bridge appear there.
func (a *CNIAttachment) Attach(ctx context.Context) (retErr error) {
	list, err := libcni.ConfListFromBytes(a.ConfList)
	if err != nil {
		return fmt.Errorf("cni network %q: conflist: %w: %w", a.Network, err, errdefs.ErrInvalidArgument)
	}
	if err := a.checkPlugins(list); err != nil {
		return err
	}
	res, err := a.cni().AddNetworkList(ctx, list, a.runtimeConf())
	defer func() {
		if retErr == nil {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if derr := a.Detach(cctx); derr != nil {
			log.G(ctx).WithError(derr).WithField("netns", a.Netns).Warn("undo cni add")
		}
	}()
	if err != nil {
		return fmt.Errorf("cni network %q add on netns %s: %w", a.Network, a.Netns, cniError(ctx, err))
	}
	cur, err := types100.NewResultFromResult(res)
	if err != nil {
		return fmt.Errorf("cni network %q add on netns %s: result: %w", a.Network, a.Netns, err)
	}
	a.IPs = nil
	for _, ip := range cur.IPs {
		a.IPs = append(a.IPs, ip.Address.String())
	}
	log.G(ctx).WithFields(log.Fields{"cni_network": a.Network, "netns": a.Netns, "ips": a.IPs}).Info("cni network attached")
	return nil
}

// Detach runs DEL; a netns that no longer exists still gets DEL (plugins must release IPAM); idempotent.
func (a *CNIAttachment) Detach(ctx context.Context) error {
	if a == nil {
		return nil
	}
	if a.Network == "" || a.ContainerID == "" || a.IfName == "" || len(a.ConfList) == 0 {
		return fmt.Errorf("cni attachment (network %q, container %q, ifname %q) is incomplete: %w",
			a.Network, a.ContainerID, a.IfName, errdefs.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("cni network %q del: %w", a.Network, err)
	}
	list, err := libcni.ConfListFromBytes(a.ConfList)
	if err != nil {
		return fmt.Errorf("cni network %q del: recorded conflist: %w: %w", a.Network, err, errdefs.ErrInvalidArgument)
	}
	if err := a.checkPlugins(list); err != nil {
		return err
	}
	if err := a.cni().DelNetworkList(ctx, list, a.runtimeConf()); err != nil {
		return fmt.Errorf("cni network %q del on netns %s: %w", a.Network, a.Netns, cniError(ctx, err))
	}
	log.G(ctx).WithFields(log.Fields{"cni_network": a.Network, "netns": a.Netns}).Info("cni network detached")
	return nil
}

// checkAttachArgs validates AttachCNI's arguments before anything runs.
func checkAttachArgs(c CNIConfig, containerID, netns string) error {
	if err := utils.ValidateNetworkName(c.Network); err != nil {
		return fmt.Errorf("cni network %q: %w: %w", c.Network, err, errdefs.ErrInvalidArgument)
	}
	if c.ConfDir == "" {
		return fmt.Errorf("cni network %q: no configuration directory: %w", c.Network, errdefs.ErrInvalidArgument)
	}
	if len(c.BinDirs) == 0 {
		return fmt.Errorf("cni network %q: no plugin directories: %w", c.Network, errdefs.ErrInvalidArgument)
	}
	if err := utils.ValidateContainerID(containerID); err != nil {
		return fmt.Errorf("cni network %q: container id %q: %w: %w", c.Network, containerID, err, errdefs.ErrInvalidArgument)
	}
	if netns == "" {
		return fmt.Errorf("cni network %q: netns path is empty: %w", c.Network, errdefs.ErrInvalidArgument)
	}
	return nil
}

// findNetwork loads the network called name from the configurations in
// dir, taken in file name order, and returns it with every plugin inlined
// so that its Bytes alone can undo it later. Files that do not parse are
// skipped with a warning.
func findNetwork(ctx context.Context, name, dir string) (*libcni.NetworkConfigList, error) {
	files, err := libcni.ConfFiles(dir, []string{".conflist", ".conf", ".json"})
	if err != nil {
		return nil, fmt.Errorf("cni network %q: read %s: %w", name, dir, err)
	}
	slices.Sort(files)
	for _, f := range files {
		list, err := loadConfList(f)
		if err != nil {
			log.G(ctx).WithError(err).WithField("file", f).Warn("skip cni configuration")
			continue
		}
		if list.Name != name {
			continue
		}
		inlined, err := inlinePlugins(list)
		if err != nil {
			return nil, fmt.Errorf("cni network %q in %s: %w: %w", name, f, err, errdefs.ErrInvalidArgument)
		}
		return inlined, nil
	}
	return nil, errdefs.ErrNotFound.WithMessage(fmt.Sprintf("cni network %q not found in %s", name, dir))
}

// loadConfList reads one configuration file, a list or a single plugin.
func loadConfList(file string) (*libcni.NetworkConfigList, error) {
	if filepath.Ext(file) == ".conflist" {
		return libcni.ConfListFromFile(file)
	}
	conf, err := libcni.ConfFromFile(file)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromConf(conf)
}

// inlinePlugins rewrites list so that its Bytes hold every plugin, also
// those libcni loaded from the network's plugin directory.
func inlinePlugins(list *libcni.NetworkConfigList) (*libcni.NetworkConfigList, error) {
	if len(list.Plugins) == 0 {
		return nil, errors.New("no plugins")
	}
	raw := map[string]json.RawMessage{}
	if err := json.Unmarshal(list.Bytes, &raw); err != nil {
		return nil, err
	}
	plugins := make([]json.RawMessage, len(list.Plugins))
	for i, p := range list.Plugins {
		plugins[i] = p.Bytes
	}
	b, err := json.Marshal(plugins)
	if err != nil {
		return nil, err
	}
	raw["plugins"] = b
	raw["loadOnlyInlinedPlugins"] = json.RawMessage("true")
	if b, err = json.Marshal(raw); err != nil {
		return nil, err
	}
	return libcni.ConfListFromBytes(b)
}

// checkPlugins makes sure every plugin of list is in a.BinDirs.
func (a *CNIAttachment) checkPlugins(list *libcni.NetworkConfigList) error {
	for _, p := range list.Plugins {
		if _, err := invoke.FindInPath(p.Network.Type, a.BinDirs); err != nil {
			return fmt.Errorf("cni network %q: %w: %w", a.Network, err, errdefs.ErrNotFound)
		}
	}
	return nil
}

func (a *CNIAttachment) cni() *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir(a.BinDirs, a.CacheDir, nil)
}

func (a *CNIAttachment) runtimeConf() *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: a.ContainerID, NetNS: a.Netns, IfName: a.IfName}
}

// cniError adds to err from libcni the errdefs class of its CNI error
// code, or the context's error when ctx ended.
func cniError(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%w: %w", err, cerr)
	}
	var te *types.Error
	if !errors.As(err, &te) {
		return err
	}
	switch te.Code {
	case types.ErrIncompatibleCNIVersion, types.ErrUnsupportedField, types.ErrDecodingFailure,
		types.ErrInvalidNetworkConfig, types.ErrInvalidEnvironmentVariables, types.ErrInvalidNetNS:
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	case types.ErrUnknownContainer:
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	case types.ErrTryAgainLater, types.ErrPluginNotAvailable:
		return fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable)
	}
	return err
}
