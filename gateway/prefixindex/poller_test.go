package prefixindex

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// agent serves GET /api/models/{id}/prefixes as the wire contract says, for one model:
// a reset when the caller's epoch differs or its after is older than the event log,
// the events after it otherwise, held up to wait until there are some.
type agent struct {
	model string

	mu      sync.Mutex
	epoch   string
	first   uint64 // seq of log[0]
	log     []runnerapi.PrefixEvent
	held    map[string]runnerapi.PrefixEvent
	changed chan struct{}
	fail    int
	asked   []string // "epoch/after" of each poll
}

func newAgent(model, epoch string) *agent {
	return &agent{model: model, epoch: epoch, first: 1, held: map[string]runnerapi.PrefixEvent{}, changed: make(chan struct{})}
}

func (a *agent) seq() uint64 { return a.first + uint64(len(a.log)) - 1 }

func (a *agent) publish(events ...runnerapi.PrefixEvent) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range events {
		a.log = append(a.log, e)
		if e.Tier == "" {
			delete(a.held, e.Digest)
		} else {
			a.held[e.Digest] = e
		}
	}
	close(a.changed)
	a.changed = make(chan struct{})
}

// restart is a new runner process: a new epoch, holding nothing but held.
func (a *agent) restart(epoch string, held ...runnerapi.PrefixEvent) {
	a.mu.Lock()
	a.epoch, a.first, a.log, a.held = epoch, 1, nil, map[string]runnerapi.PrefixEvent{}
	a.mu.Unlock()
	a.publish(held...)
}

func (a *agent) failNext(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fail = n
}

func (a *agent) polls() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.asked...)
}

func (a *agent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("id") != a.model {
		http.Error(w, `{"error":{"code":"model_not_found"}}`, http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	after, _ := strconv.ParseUint(q.Get("after"), 10, 64)
	wait, _ := strconv.Atoi(q.Get("wait"))
	deadline := time.NewTimer(time.Duration(min(wait, 30)) * time.Second)
	defer deadline.Stop()
	a.mu.Lock()
	a.asked = append(a.asked, q.Get("epoch")+"/"+q.Get("after"))
	if a.fail > 0 {
		a.fail--
		a.mu.Unlock()
		http.Error(w, "busy", http.StatusInternalServerError)
		return
	}
	for {
		out := runnerapi.PrefixEvents{Epoch: a.epoch, Seq: a.seq(), Events: []runnerapi.PrefixEvent{}}
		switch {
		case q.Get("epoch") != a.epoch || after+1 < a.first:
			out.Reset = true
			for _, e := range a.held {
				out.Events = append(out.Events, e)
			}
		case after < a.seq():
			out.Events = a.log[after+1-a.first:]
		}
		ch := a.changed
		if out.Reset || len(out.Events) > 0 {
			a.mu.Unlock()
			_ = json.NewEncoder(w).Encode(out)
			return
		}
		a.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			_ = json.NewEncoder(w).Encode(out)
			return
		case <-r.Context().Done():
			return
		}
		a.mu.Lock()
	}
}

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
	ag := newAgent("ns/r1", "e1")
	ag.publish(ev("a", runnerapi.TierHot, 100))
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
	if got := ag.polls()[0]; got != "/0" {
		t.Errorf("the first poll asked %q, want no epoch and after 0", got)
	}
	ag.publish(ev("b", runnerapi.TierSSD, 300))
	eventually(t, "b is applied", func() bool { return depth() == 2 })
	if got := x.Deepest("ns/r1", chain).Tier; got != runnerapi.TierSSD {
		t.Errorf("b's tier %q, want ssd", got)
	}
	if polls := ag.polls(); !strings.HasPrefix(polls[len(polls)-1], "e1/") || polls[len(polls)-1] == "e1/0" {
		t.Errorf("later polls ask after the events applied: %v", polls)
	}

	ag.restart("e2", ev("c", runnerapi.TierHot, 400))
	eventually(t, "the new runner's set replaces the old", func() bool { return depth() == 3 && x.Len("ns/r1") == 1 })
	if got := testutil.ToFloat64(x.m.resets); got != 2 {
		t.Errorf("%v resets, want 2 (first poll, new epoch)", got)
	}

	ag.failNext(2)
	ag.publish(ev("c", "", 0))
	eventually(t, "polls resume after failing", func() bool { return depth() == 0 })
	ag.publish(ev("b", runnerapi.TierHot, 300))
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
	ag := newAgent("ns/other", "e1")
	ag.publish(ev("a", runnerapi.TierHot, 1))
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
