//go:build !linux

package localfleet

import "os/exec"

// dieWithParent: only Linux can tie a child's life to its parent's; elsewhere Stop
// (and Ctrl-C of hack/localfleet) ends the components.
func dieWithParent(*exec.Cmd) {}
