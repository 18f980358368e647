package prefixindex

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/prefixindex/prefixindextest"
)

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPollerFollowsAgent: the poller rebuilds a backend's set from its agent's first
// answer, follows its events, replaces it when the runner restarts, backs off over
// failed polls, and forgets the backend when it leaves.
func TestPollerFollowsAgent(t *testing.T) {
	ag := prefixindextest.New("ns/r1", "e1")
	ag.Publish(ev("a", runnerapi.TierHot, 100))
	mux := http.NewServeMux()
	mux.Handle("GET /api/models/{id}/prefixes", ag)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	x, err := New(0, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	p := &Poller{Index: x, Wait: 2 * time.Second, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		Log: testr.New(t), Fetch: HTTPFetch{Transport: http.DefaultTransport, Scheme: "http://"}.Fetch}
	defer p.Close()
	target := Target{Key: "ns/r1", Endpoint: strings.TrimPrefix(srv.URL, "http://"), Node: "mac-1"}
	chain := []string{"a", "b", "c"}
	depth := func() int { return x.Deepest("ns/r1", chain).Depth }

	p.Sync([]Target{target})
	eventually(t, "the first answer (a reset) is applied", func() bool { return depth() == 1 })
	if got := ag.Polls()[0]; got != "/0" {
		t.Errorf("the first poll asked %q, want no epoch and after 0", got)
	}
	ag.Publish(ev("b", runnerapi.TierSSD, 300))
	eventually(t, "b is applied", func() bool { return depth() == 2 })
	if got := x.Deepest("ns/r1", chain).Tier; got != runnerapi.TierSSD {
		t.Errorf("b's tier %q, want ssd", got)
	}
	if polls := ag.Polls(); !strings.HasPrefix(polls[len(polls)-1], "e1/") || polls[len(polls)-1] == "e1/0" {
		t.Errorf("later polls ask after the events applied: %v", polls)
	}

	ag.Restart("e2", ev("c", runnerapi.TierHot, 400))
	eventually(t, "the new runner's set replaces the old", func() bool { return depth() == 3 && x.Len("ns/r1") == 1 })
	if got := testutil.ToFloat64(x.m.resets); got != 2 {
		t.Errorf("%v resets, want 2 (first poll, new epoch)", got)
	}

	ag.FailNext(2)
	ag.Publish(ev("c", "", 0))
	eventually(t, "polls resume after failing", func() bool { return depth() == 0 })
	ag.Publish(ev("b", runnerapi.TierHot, 300))
	eventually(t, "the event after the failures is applied", func() bool { return depth() == 2 })
	if got := testutil.ToFloat64(x.m.pollErrors); got != 2 {
		t.Errorf("%v poll errors, want 2", got)
	}

	p.Sync(nil)
	eventually(t, "a backend that left is forgotten", func() bool { return x.Len("ns/r1") == 0 && testutil.ToFloat64(x.m.entries) == 0 })
	p.Sync([]Target{target})
	eventually(t, "a backend back again is rebuilt from its agent", func() bool { return depth() == 2 })
}

// TestPollerUnknownModel: an agent that does not know the replica (or predates the
// endpoint) is a poll error, retried with backoff, never an entry.
func TestPollerUnknownModel(t *testing.T) {
	ag := prefixindextest.New("ns/other", "e1")
	ag.Publish(ev("a", runnerapi.TierHot, 1))
	mux := http.NewServeMux()
	mux.Handle("GET /api/models/{id}/prefixes", ag)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	x, err := New(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &Poller{Index: x, Wait: time.Second, MinBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond,
		Fetch: HTTPFetch{Transport: http.DefaultTransport, Scheme: "http://"}.Fetch}
	p.Sync([]Target{{Key: "ns/r1", Endpoint: strings.TrimPrefix(srv.URL, "http://")}})
	eventually(t, "three failed polls", func() bool { return testutil.ToFloat64(x.m.pollErrors) >= 3 })
	p.Close()
	if x.Len("ns/r1") != 0 {
		t.Error("an unknown replica has entries")
	}
}
