package shim

// Version and Revision identify the build; the Makefile sets them with
// -ldflags -X.
var (
	Version  = "dev"
	Revision = ""
)
