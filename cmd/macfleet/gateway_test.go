package main

import (
	"strings"
	"testing"
)

// TestGatewayRefusesANonPositivePeerFetchMargin: a margin of 0 or less is an error that
// names the flag, not the default in silence.
func TestGatewayRefusesANonPositivePeerFetchMargin(t *testing.T) {
	for _, v := range []string{"0", "-1"} {
		cmd := newGatewayCmd()
		cmd.SetArgs([]string{"--peer-fetch-margin=" + v})
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), "--peer-fetch-margin must be positive") {
			t.Errorf("--peer-fetch-margin=%s: %v, want it refused", v, err)
		}
	}
}
