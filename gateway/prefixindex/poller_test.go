package prefixindex

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
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

// TestPollerCallsOnCold: OnCold is called for a replica whose first answer holds
// nothing and for each new epoch of its runner that holds nothing, once each; not for
// later events, nor for a new epoch that holds something already.
func TestPollerCallsOnCold(t *testing.T) {
	ag := prefixindextest.New("ns/r1", "e1")
	srv := httptest.NewServer(ag.Handler())
	defer srv.Close()
	x, err := New(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var cold []string
	colds := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(cold)
	}
	p := &Poller{Index: x, Wait: time.Second, MinBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond,
		Fetch: HTTPFetch{Transport: http.DefaultTransport, Scheme: "http://"}.Fetch,
		OnCold: func(tg Target, epoch string) {
			mu.Lock()
			defer mu.Unlock()
			cold = append(cold, tg.Key+"@"+epoch)
		}}
	defer p.Close()
	p.Sync([]Target{{Key: "ns/r1", Endpoint: strings.TrimPrefix(srv.URL, "http://"), Node: "mac-1"}})
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return len(colds()) == 1, fmt.Sprintf("cold calls %v, want the first answer's", colds())
	})
	ag.Publish(ev("a", runnerapi.TierHot, 100))
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return x.Len("ns/r1") == 1, "not yet: a is applied"
	})
	ag.Restart("e2")
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return len(colds()) == 2, fmt.Sprintf("cold calls %v, want e2's too", colds())
	})
	ag.Restart("e3", ev("b", runnerapi.TierHot, 100))
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return x.Len("ns/r1") == 1, "not yet: e3's set is applied"
	})
	ag.Publish(ev("b", "", 0))
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return x.Len("ns/r1") == 0, "not yet: b's eviction is applied"
	})
	if got, want := colds(), []string{"ns/r1@e1", "ns/r1@e2"}; !slices.Equal(got, want) {
		t.Fatalf("cold calls %v, want %v", got, want)
	}
}
