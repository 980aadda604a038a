package shim

// Annotations containerd's CRI puts on the specs of a pod's containers.
const (
	// sandboxIDAnnotation names the pod sandbox a container belongs to:
	// every container of a pod shares one shim process (see the
	// manager's grouping), and a pod runs one VM.
	sandboxIDAnnotation = "io.kubernetes.cri.sandbox-id"
	// sandboxUIDAnnotation is the pod's uid, stable across sandboxes.
	sandboxUIDAnnotation = "io.kubernetes.cri.sandbox-uid"
	// containerTypeAnnotation marks a pod's sandbox (pause) container.
	containerTypeAnnotation = "io.kubernetes.cri.container-type"
)
