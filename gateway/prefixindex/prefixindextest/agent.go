// Package prefixindextest is an agent's prefix events endpoint for tests: the wire
// contract of runnerapi.PrefixEvents over a scripted event log.
package prefixindextest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// Agent serves GET /api/models/{id}/prefixes as the wire contract says, for one model:
// a reset when the caller's epoch differs or its after is older than the event log,
// the events after it otherwise, held up to wait until there are some.
type Agent struct {
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

// New is an agent of model whose runner is at epoch, holding nothing.
func New(model, epoch string) *Agent {
	return &Agent{model: model, epoch: epoch, first: 1, held: map[string]runnerapi.PrefixEvent{}, changed: make(chan struct{})}
}

func (a *Agent) seq() uint64 { return a.first + uint64(len(a.log)) - 1 }

// Publish appends events to the runner's log and wakes the polls waiting for them.
func (a *Agent) Publish(events ...runnerapi.PrefixEvent) {
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

// Restart is a new runner process: a new epoch, holding nothing but held.
func (a *Agent) Restart(epoch string, held ...runnerapi.PrefixEvent) {
	a.mu.Lock()
	a.epoch, a.first, a.log, a.held = epoch, 1, nil, map[string]runnerapi.PrefixEvent{}
	a.mu.Unlock()
	a.Publish(held...)
}

// FailNext answers the next n polls 500.
func (a *Agent) FailNext(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fail = n
}

// Polls are the "epoch/after" each poll asked.
func (a *Agent) Polls() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.asked...)
}

// ServeHTTP answers a poll; mount it at "GET /api/models/{id}/prefixes".
func (a *Agent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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

// Handler serves the agent at "GET /api/models/{id}/prefixes".
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /api/models/{id}/prefixes", a)
	return mux
}
