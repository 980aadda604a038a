// Package deploy holds the Kubernetes manifests that install vmshim on a
// cluster (installer.yaml, runtimeclass.yaml, example-pod.yaml) and the
// installer image's Dockerfile; its tests check that the manifests decode
// strictly and agree with the shim's config and with docs/kubernetes.md.
package deploy
