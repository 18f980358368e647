package httpserver

import (
	"fmt"
	"testing"
	"time"
)

// TestAttackFourSourcesFillTheCap: four addresses (127.0.0.2-5, each its own source
// on Linux's loopback) each open their share of idle connections, filling the global
// cap; a client of a fifth address must be served at once — a newcomer at the global
// cap takes the oldest idle slot of the source holding the most, not a refusal.
func TestAttackFourSourcesFillTheCap(t *testing.T) {
	const perSource = 16
	addr := serve(t, echoBody, Limits{MaxConnections: 4 * perSource, MaxConnectionsPerSource: perSource})
	for src := 2; src <= 5; src++ {
		for range perSource {
			dialFrom(t, fmt.Sprintf("127.0.0.%d", src), addr)
		}
	}
	if ok, last := servedWithin(clientFrom("127.0.0.6"), addr, 3*time.Second); !ok {
		t.Fatalf("with 4 addresses holding the cap of %d in idle connections, a fifth address was not served in 3s: %s", 4*perSource, last)
	}
}
