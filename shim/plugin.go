package shim

import (
	"os"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/vmshim/vmshim/launch"
	"github.com/vmshim/vmshim/runcshim"
)

// RuntimeName is the runtime type containerd knows this shim by.
const RuntimeName = "io.containerd.vm.v2"

// Register registers the task service as the shim's ttrpc plugin.
func Register() {
	registry.Register(&plugin.Registration{
		Type:     plugins.TTRPCPlugin,
		ID:       "task",
		Requires: []plugin.Type{plugins.EventPlugin, plugins.InternalPlugin},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			pp, err := ic.GetByID(plugins.EventPlugin, "publisher")
			if err != nil {
				return nil, err
			}
			ss, err := ic.GetByID(plugins.InternalPlugin, "shutdown")
			if err != nil {
				return nil, err
			}
			grpc := ic.Properties[plugins.PropertyGRPCAddress]
			rc := runcshim.Config{
				Address: grpc, TTRPCAddress: ic.Properties[plugins.PropertyTTRPCAddress],
				Containerd: flagValue(os.Args, "-publish-binary"), Debug: slices.Contains(os.Args, "-debug"),
				SocketDir: runcSocketDir,
			}
			return NewTaskService(ic.Context, pp.(shim.Publisher), ss.(shutdown.Service), launch.NewLauncher(grpc), rc)
		},
	})
}

// flagValue is the value given to flag name in args (-name value or
// -name=value), "" for none.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}
