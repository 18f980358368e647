package addressproof

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/macfleet/macfleet/controllers/certsigner/certsignertest"
	"github.com/macfleet/macfleet/internal/pki"
)

// TestProber shakes hands with real listeners: only the one holding mac-a's
// certificate from the fleet CA proves mac-a's address; a failure is retried only
// after its backoff, a proof lasts its TTL, and a new address is probed at once.
func TestProber(t *testing.T) {
	ca, err := pki.NewCA(time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ca.NewSource(ptr(pki.Manager("manager")), time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	rogue, err := pki.NewCA(time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	agentOf := func(ca *pki.CA, name string) string {
		src, err := ca.NewSource(ptr(pki.Node(name)), time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return certsignertest.ServeTLS(t, src, "127.0.0.1")
	}
	macA, macB := agentOf(ca, "mac-a"), agentOf(ca, "mac-b")
	forged := agentOf(rogue, "mac-a")
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedAddr := closed.Addr().String()
	closed.Close()

	clk := clocktesting.NewFakePassiveClock(time.Now())
	p := &Prober{Source: mgr, Clock: clk, Timeout: 300 * time.Millisecond,
		Policy: Policy{TTL: time.Minute, MinBackoff: time.Second, MaxBackoff: 10 * time.Second}}
	ctx := context.Background()

	for _, tc := range []struct{ name, addr, why string }{
		{"another Mac's agent", macB, "is macfleet://node/mac-b, not macfleet://node/mac-a"},
		{"a certificate naming mac-a from another CA", forged, "not from the fleet CA"},
		{"a plain TCP listener that says nothing", silent.Addr().String(), "did not prove"},
		{"nothing listening", closedAddr, "dialing the agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, probed := p.Verify(ctx, "mac-a", tc.addr, time.Time{})
			if v.Proven || !probed || !strings.Contains(v.Why, tc.why) {
				t.Fatalf("Verify(mac-a, %s) = %+v probed %v, want not proven, probed, why containing %q", tc.addr, v, probed, tc.why)
			}
			if v, probed := p.Verify(ctx, "mac-a", tc.addr, time.Time{}); v.Proven || probed || v.RecheckAfter != time.Second {
				t.Errorf("again within the backoff: %+v probed %v, want the cached failure and a recheck in 1s", v, probed)
			}
		})
	}

	v, probed := p.Verify(ctx, "mac-a", macA, time.Time{})
	if !v.Proven || !probed || v.RecheckAfter != time.Minute {
		t.Fatalf("Verify(mac-a, its own agent) = %+v probed %v, want proven for a minute", v, probed)
	}
	clk.SetTime(clk.Now().Add(59 * time.Second))
	if v, probed := p.Verify(ctx, "mac-a", macA, time.Time{}); !v.Proven || probed {
		t.Errorf("within the TTL: %+v probed %v, want the cached proof", v, probed)
	}
	clk.SetTime(clk.Now().Add(time.Second))
	if v, probed := p.Verify(ctx, "mac-a", macA, time.Time{}); !v.Proven || !probed {
		t.Errorf("after the TTL: %+v probed %v, want a new handshake that proves it", v, probed)
	}
	// The Mac moves to another Mac's address: probed at once, refused.
	if v, probed := p.Verify(ctx, "mac-a", macB, time.Time{}); v.Proven || !probed {
		t.Errorf("a changed address: %+v probed %v, want probed and refused", v, probed)
	}
}

func ptr[T any](v T) *T { return &v }
