package server

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// TestGatewayQueues: the latest report of each gateway is kept per model; reports
// without both headers or with a value that is not a count are ignored; a report
// older than GatewayQueueTTL is dropped; a model keeps at most maxGatewaysPerModel
// gateways, the oldest going first.
func TestGatewayQueues(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)
	var q gatewayQueues
	send := func(model, gw, queued string, at time.Time, seconds ...string) {
		r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
		for _, s := range seconds {
			r.Header.Set(v1alpha1.HeaderQueuedSeconds, s)
		}
		if gw != "" {
			r.Header.Set(v1alpha1.HeaderGateway, gw)
		}
		if queued != "" {
			r.Header.Set(v1alpha1.HeaderQueued, queued)
		}
		q.observe(r, model, at)
	}
	send("ns/a-0", "g1", "4", t0)
	send("ns/a-0", "g1", "2", t0.Add(time.Second), "12.5") // newer: replaces
	send("ns/a-0", "g2", "0", t0.Add(time.Second), "NaN")  // not a number of seconds: the count stays
	send("ns/d-0", "g1", "1", t0, "-3")
	send("ns/d-0", "g2", "1", t0, "+Inf")
	send("ns/a-0", "g3", "-1", t0)   // not a count
	send("ns/a-0", "g3", "many", t0) // not a count
	send("ns/a-0", "", "5", t0)      // no gateway
	send("ns/b-0", "g1", "", t0)     // no count
	send("ns/b-0", "g1", "9", t0.Add(-GatewayQueueTTL))
	want := map[string][]GatewayQueue{"ns/a-0": {
		{Gateway: "g1", Queued: 2, QueuedSeconds: ptr.To(12.5), At: t0.Add(time.Second)},
		{Gateway: "g2", Queued: 0, At: t0.Add(time.Second)}},
		"ns/d-0": {{Gateway: "g1", Queued: 1, At: t0}, {Gateway: "g2", Queued: 1, At: t0}}}
	sortQ := cmp.Transformer("sort", func(in []GatewayQueue) map[string]GatewayQueue {
		out := map[string]GatewayQueue{}
		for _, e := range in {
			out[e.Gateway] = e
		}
		return out
	})
	if d := cmp.Diff(want, q.snapshot(t0.Add(time.Second)), sortQ); d != "" {
		t.Errorf("snapshot (-want +got):\n%s", d)
	}
	if got := q.snapshot(t0.Add(time.Second + GatewayQueueTTL)); got != nil {
		t.Errorf("snapshot after the TTL = %v, want nothing", got)
	}
	for i := range maxGatewaysPerModel + 1 {
		send("ns/c-0", string(rune('A'+i%26))+string(rune('a'+i/26)), "1", t0.Add(time.Duration(i)*time.Millisecond))
	}
	got := q.snapshot(t0)["ns/c-0"]
	if len(got) != maxGatewaysPerModel {
		t.Fatalf("%d gateways kept, want %d", len(got), maxGatewaysPerModel)
	}
	for _, e := range got {
		if e.Gateway == "Aa" {
			t.Errorf("the oldest gateway's report was kept over a newer one's")
		}
	}
}
