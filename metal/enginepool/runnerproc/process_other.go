//go:build !linux

package runnerproc

import "syscall"

// dieWithParent does nothing: darwin has no parent-death signal, so a runner whose
// agent was SIGKILLed keeps running until something stops it.
func dieWithParent(*syscall.SysProcAttr) {}
