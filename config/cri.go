package config

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Annotations containerd's CRI puts on the specs of a pod's containers.
const (
	// AnnotationSandboxID names the pod sandbox a container belongs to:
	// every container of a pod shares one shim process, and a pod runs
	// one VM.
	AnnotationSandboxID = "io.kubernetes.cri.sandbox-id"
	// AnnotationSandboxUID is the pod's uid, stable across sandboxes.
	AnnotationSandboxUID = "io.kubernetes.cri.sandbox-uid"
	// AnnotationContainerType marks a pod's sandbox (pause) container.
	AnnotationContainerType = "io.kubernetes.cri.container-type"
)

// SandboxID is the id of the CRI pod sandbox spec's container belongs to,
// "" outside a CRI pod.
func SandboxID(spec *specs.Spec) string { return spec.Annotations[AnnotationSandboxID] }

// PodUID is the uid of the CRI pod spec's container belongs to, "" when
// the CRI names none.
func PodUID(spec *specs.Spec) string { return spec.Annotations[AnnotationSandboxUID] }

// IsSandbox reports whether spec is a CRI pod sandbox container.
func IsSandbox(spec *specs.Spec) bool { return spec.Annotations[AnnotationContainerType] == "sandbox" }

// ReadSpec reads the bundle's OCI runtime spec.
func ReadSpec(bundle string) (*specs.Spec, error) {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read bundle spec: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("parse bundle spec: %w", errdefs.ErrInvalidArgument)
	}
	return &spec, nil
}
