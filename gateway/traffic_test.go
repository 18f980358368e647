package gateway

import (
	"fmt"
	"testing"
	"time"

	"github.com/macfleet/macfleet/gateway/fairqueue"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestTraffic: the console's figures of a deployment's recent requests, on a fake
// clock: requests per second over the rate window, TTFT percentiles of the recent
// requests only, in flight now.
func TestTraffic(t *testing.T) {
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	tr := newTraffic()
	tr.now = func() time.Time { return now }
	if got := tr.of("a/m"); got != (Traffic{}) {
		t.Fatalf("no requests yet: %+v", got)
	}
	held := tr.started("a/m")
	for i := range 100 {
		done := tr.started("a/m")
		tr.firstByte("a/m", time.Duration(i+1)*time.Millisecond)
		done()
	}
	got := tr.of("a/m")
	want := Traffic{RequestsPerSecond: 100 / fairqueue.RateWindow.Seconds(), TTFTp50: 50 * time.Millisecond,
		TTFTp99: 99 * time.Millisecond, TTFTSamples: 100, InFlight: 1}
	if got != want {
		t.Errorf("after 100 requests: %+v, want %+v", got, want)
	}
	held()
	// Older samples leave the percentiles; the ring keeps the newest ttftSamples.
	now = now.Add(ttftMaxAge + time.Second)
	for range ttftSamples + 10 {
		tr.firstByte("a/m", 7*time.Millisecond)
	}
	got = tr.of("a/m")
	if got.TTFTp99 != 7*time.Millisecond || got.TTFTSamples != ttftSamples || got.InFlight != 0 || got.RequestsPerSecond != 0 {
		t.Errorf("a minute later: %+v", got)
	}
}

// TestTrafficThroughGateway: requests through the gateway show in its Traffic,
// queued ones included.
func TestTrafficThroughGateway(t *testing.T) {
	g := newTestGateway(t, Options{})
	rep := newGatedReplica(t)
	g.serveReplicas(rep.host())
	first := sendAsync(t, g.url, "/v1/chat/completions", chatBody)
	rep.waitArrived(t, 1)
	second := sendAsync(t, g.url, "/v1/chat/completions", chatBody)
	g.waitQueued(t, fairqueue.Interactive, 1)
	if got := g.Traffic("a/m"); got.InFlight != 2 || got.Queued != 1 {
		t.Errorf("one proxied, one queued: %+v", got)
	}
	rep.gate <- struct{}{}
	rep.gate <- struct{}{}
	wantOK(t, map[string]<-chan answer{"first": first, "second": second})
	// The handler ends just after the client has its answer.
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		got := g.Traffic("a/m")
		return got.InFlight == 0 && got.Queued == 0 && got.TTFTSamples == 2 && got.RequestsPerSecond > 0,
			fmt.Sprintf("after both: %+v", got)
	})
}
