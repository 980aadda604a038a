package shim

import (
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/vmshim/vmshim/launch"
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
			return NewTaskService(ic.Context, pp.(shim.Publisher), ss.(shutdown.Service), launch.NewLauncher(ic.Properties[plugins.PropertyGRPCAddress]))
		},
	})
}
