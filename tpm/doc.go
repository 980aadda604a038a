// Package tpm gives a VM a TPM 2.0: it checks the state swtpm keeps for
// the VM before swtpm is let at it, and says how swtpm is started for one
// VM, talking to QEMU over an inherited socket and keeping its state in
// one file. It knows nothing of QEMU, jails or the task.
package tpm
