package testenv

import (
	"net/url"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/macfleet/macfleet/test/support/tcprelay"
)

// Relay forwards TCP connections from a reserved loopback port to a target
// (tcprelay.Relay). Cut closes the listener and every relayed connection, so clients
// see their connections end and new ones refused, as when the API server goes away;
// Restore listens again on the same port.
type Relay = tcprelay.Relay

// NewRelay starts a relay to target (host:port); it is closed when the test ends.
func NewRelay(tb testing.TB, target string) *Relay {
	tb.Helper()
	r, err := tcprelay.New(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.Close)
	return r
}

// RelayConfig starts a relay to cfg's API server and returns a copy of cfg that
// reaches it through the relay.
func RelayConfig(tb testing.TB, cfg *rest.Config) (*rest.Config, *Relay) {
	tb.Helper()
	u, err := url.Parse(cfg.Host)
	if err != nil || u.Host == "" {
		tb.Fatalf("API server host %q: %v", cfg.Host, err)
	}
	r := NewRelay(tb, u.Host)
	rc := rest.CopyConfig(cfg)
	u.Host = r.Addr()
	rc.Host = u.String()
	return rc, r
}
