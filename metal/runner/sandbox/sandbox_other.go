//go:build !linux && !darwin

package sandbox

import "os/exec"

// probe reports that this platform has no runner sandbox.
func probe() Status {
	return Status{Detail: "no runner sandbox on this platform"}
}

// Wrap leaves cmd as it is.
func Wrap(*exec.Cmd, Policy) error { return nil }
