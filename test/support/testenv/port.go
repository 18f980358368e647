package testenv

import (
	"testing"

	"github.com/macfleet/macfleet/test/support/tcprelay"
)

// Port is a loopback TCP port held for a test's lifetime by a socket bound to it but
// not listening (tcprelay.Port). Connections to Addr are refused until Listen, and no
// other process can take the port meanwhile, as it could once a listener on port 0
// was closed.
type Port = tcprelay.Port

// ReservePort holds a free loopback port until the test ends.
func ReservePort(tb testing.TB) *Port {
	tb.Helper()
	p, err := tcprelay.Reserve()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}
