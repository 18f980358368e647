package localfleet

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill the component when the process that started it
// (a test binary, hack/localfleet) dies, however it dies.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
