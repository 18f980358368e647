//go:build !linux

package runnerproc

import "testing"

func procTestDiesWithAgent(t *testing.T, _, _ string) {
	t.Skip("the parent-death signal is Linux only")
}
