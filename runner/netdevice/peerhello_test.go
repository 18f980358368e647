//go:build cgo

package netdevice

import (
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// TestPeerHelloMatchesTheAgents: the peer greeting the worker protocol defines is the
// one the agents check on a peer link (runnerapi), which cannot include the C header.
func TestPeerHelloMatchesTheAgents(t *testing.T) {
	cmd, session := PeerHello()
	if cmd != runnerapi.SplitPeerHello || session != runnerapi.SplitPeerSessionBytes {
		t.Errorf("the worker protocol's peer greeting is command %d with a %d-byte session; runnerapi says %d and %d",
			cmd, session, runnerapi.SplitPeerHello, runnerapi.SplitPeerSessionBytes)
	}
}
