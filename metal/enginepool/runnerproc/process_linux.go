package runnerproc

import "syscall"

// dieWithParent makes the kernel SIGKILL the runner when the agent dies, so a crashed
// or killed agent leaves no runner holding memory. The signal is tied to the thread
// that forked, which the Go runtime only ends after a goroutine exits while locked to
// it; Start runs on an ordinary goroutine.
func dieWithParent(a *syscall.SysProcAttr) {
	a.Pdeathsig = syscall.SIGKILL
}
