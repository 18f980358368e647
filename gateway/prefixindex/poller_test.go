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
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestPollerFollowsAgent: the poller rebuilds a backend's set from its agent's first
// answer, follows its events, replaces it when the runner restarts, backs off over
// failed polls, and forgets the backend when it leaves.
func TestPollerFollowsAgent(t *testing.T) {
	ag := prefixindextest.New("ns/r1", "e1")
	ag.Publish(ev("a", runnerapi.TierHot, 100))
	srv := httptest.NewServer(ag.Handler())
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
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return depth() == 1, "not yet: the first answer (a reset) is applied"
	})
	if got := ag.Polls()[0]; got != "/0" {
		t.Errorf("the first poll asked %q, want no epoch and after 0", got)
	}
	ag.Publish(ev("b", runnerapi.TierSSD, 300))
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return depth() == 2, "not yet: b is applied"
	})
	if got := x.Deepest("ns/r1", chain).Tier; got != runnerapi.TierSSD {
		t.Errorf("b's tier %q, want ssd", got)
	}
	if polls := ag.Polls(); !strings.HasPrefix(polls[len(polls)-1], "e1/") || polls[len(polls)-1] == "e1/0" {
		t.Errorf("later polls ask after the events applied: %v", polls)
	}

	ag.Restart("e2", ev("c", runnerapi.TierHot, 400))
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return depth() == 3 && x.Len("ns/r1") == 1, "not yet: the new runner's set replaces the old"
	})
	if got := testutil.ToFloat64(x.m.resets); got != 2 {
		t.Errorf("%v resets, want 2 (first poll, new epoch)", got)
	}

	ag.FailNext(2)
	ag.Publish(ev("c", "", 0))
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return depth() == 0, "not yet: polls resume after failing"
	})
	ag.Publish(ev("b", runnerapi.TierHot, 300))
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return depth() == 2, "not yet: the event after the failures is applied"
	})
	if got := testutil.ToFloat64(x.m.pollErrors); got != 2 {
		t.Errorf("%v poll errors, want 2", got)
	}

	p.Sync(nil)
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return x.Len("ns/r1") == 0 && testutil.ToFloat64(x.m.entries) == 0, "not yet: a backend that left is forgotten"
	})
	p.Sync([]Target{target})
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return depth() == 2, "not yet: a backend back again is rebuilt from its agent"
	})
}

// TestPollerUnknownModel: an agent that does not know the replica (or predates the
// endpoint) is a poll error, retried with backoff, never an entry.
func TestPollerUnknownModel(t *testing.T) {
	ag := prefixindextest.New("ns/other", "e1")
	ag.Publish(ev("a", runnerapi.TierHot, 1))
	srv := httptest.NewServer(ag.Handler())
	defer srv.Close()
	x, err := New(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &Poller{Index: x, Wait: time.Second, MinBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond,
		Fetch: HTTPFetch{Transport: http.DefaultTransport, Scheme: "http://"}.Fetch}
	p.Sync([]Target{{Key: "ns/r1", Endpoint: strings.TrimPrefix(srv.URL, "http://")}})
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return testutil.ToFloat64(x.m.pollErrors) >= 3, "not yet: three failed polls"
	})
	p.Close()
	if x.Len("ns/r1") != 0 {
		t.Error("an unknown replica has entries")
	}
}
