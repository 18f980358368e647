package gateway_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestAttackForgedTokensOfOneNamespaceStarveEveryone: twelve sources
// (127.0.0.1-12) send forged tokens, all claiming one namespace ("team"), as fast as
// the gateway answers. Before, each source's own limit (5 reviews a second) let them
// together drain the bucket of every source (50 a second), and every
// ServiceAccount caller whose cached answer had expired — a known caller of another
// namespace past its TTL, or a new one — was answered 429. Now tokens claiming one
// namespace share that namespace's bucket, so the flood takes a fifth of the
// reviews, and an accepted token is answered from its acceptance until its expiry
// when reviews are limited: both callers of the other namespace are served.
func TestAttackForgedTokensOfOneNamespaceStarveEveryone(t *testing.T) {
	const sources, perSource = 12, 400
	e := cluster(t)
	g := startGateway(t, e, gateway.Config{TenantKeys: true, GatewayID: "gw-ns-flood", TokenCacheTTL: time.Millisecond})
	ns := testenv.NewNamespace(t, e.Client)
	known, issuer := testenv.ServiceAccountToken(t, e.Config, ns, "ci", satoken.DefaultAudience)
	fresh, _ := testenv.ServiceAccountToken(t, e.Config, ns, "ci2", satoken.DefaultAudience)
	victim := from("127.0.0.20")
	if code, body := sendWith(victim, g.url+"/v1/models", known); code != http.StatusOK {
		t.Fatalf("the known caller before the flood: %d %s", code, body)
	}

	var limited atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for s := 1; s <= sources; s++ {
		attacker := from(fmt.Sprintf("127.0.0.%d", s))
		wg.Go(func() {
			for range perSource {
				select {
				case <-stop:
					return
				default:
				}
				code, body := sendWith(attacker, g.url+"/v1/models", testenv.ForgedToken(satoken.DefaultAudience, issuer))
				if code == http.StatusTooManyRequests && strings.Contains(body, "token_review_limited") {
					limited.Add(1)
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for limited.Load() < 4*sources {
		if time.Now().After(deadline) {
			t.Fatalf("the flood was limited %d times in 30 s; want it limited before the check", limited.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := range 5 {
		for name, tok := range map[string]string{"a known caller past its TTL": known, "a new caller": fresh} {
			if code, body := sendWith(victim, g.url+"/v1/models", tok); code != http.StatusOK {
				t.Errorf("try %d, %s of namespace %s during a flood of forged tokens claiming another: %d %s, want 200",
					i, name, ns, code, body)
			}
		}
	}
}
