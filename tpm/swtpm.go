package tpm

import "fmt"

// CtrlFD is the descriptor swtpm is given its control connection on: the
// first of exec.Cmd's ExtraFiles.
const CtrlFD = 3

// Args are swtpm's arguments for one VM's TPM 2.0, after the program's
// name. swtpm serves the TPM on CtrlFD, one end of a socketpair whose
// other end QEMU's tpm-emulator has: QEMU sends the TPM's commands, and
// its state for a migration, over it. swtpm keeps the state in the file
// at statePath (as swtpm sees it), ends when QEMU closes the connection
// (--terminate), and runs under its own seccomp filter, which kills it
// on a system call a TPM has no use for. It prints what goes wrong on
// its stderr, without --log: with --log fd=2, swtpm 0.7.1 answers
// QEMU's CMD_SET_DATAFD with an error, and QEMU gives up.
func Args(statePath string) []string {
	return []string{
		"socket", "--tpm2",
		"--ctrl", fmt.Sprintf("type=unixio,clientfd=%d", CtrlFD),
		"--tpmstate", "backend-uri=file://" + statePath,
		"--terminate",
		"--seccomp", "action=kill",
	}
}
