// Package config resolves the shim's TOML configuration, the vmshim.io/*
// annotations and the OCI runtime spec into one validated VM description.
package config
