package prefixindex

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// Polling defaults.
const (
	// DefaultWait is how long one poll lets the agent hold its answer until there are
	// events (the wire contract allows at most 30 s).
	DefaultWait = 25 * time.Second
	// DefaultMinBackoff and DefaultMaxBackoff bound the pause after a failed poll,
	// doubling from one to the other.
	DefaultMinBackoff = 500 * time.Millisecond
	DefaultMaxBackoff = 30 * time.Second
	// pollSlack is how much longer than its wait a poll may take before it is cut.
	pollSlack = 10 * time.Second
	// maxAnswerBytes bounds one answer (a reset at the cap is far smaller).
	maxAnswerBytes = 16 << 20
)

// Target is a backend whose agent is polled: the replica's key ("<namespace>/<name>",
// the agent's model id), the agent's host:port and its Mac.
type Target struct {
	Key, Endpoint, Node string
}

// Fetch asks t's agent for the prefix events after (epoch, after), letting it hold the
// answer up to wait.
type Fetch func(ctx context.Context, t Target, epoch string, after uint64, wait time.Duration) (runnerapi.PrefixEvents, error)

// Poller keeps one long-poll per target, feeding the index, and stops a target's when
// it leaves (forgetting what it held).
type Poller struct {
	Index *Index
	Fetch Fetch
	// Wait, MinBackoff, MaxBackoff: the defaults above when zero.
	Wait, MinBackoff, MaxBackoff time.Duration
	Log                          logr.Logger
	// OnCold, when set, is called (on the poll's goroutine: it must not block) when
	// a target's answer replaced what the index knew of it (its first answer, a
	// reset, a new epoch of its runner) and it holds nothing: a new or restarted
	// replica, which the gateway warms from its peers.
	OnCold func(t Target, epoch string)

	mu      sync.Mutex
	closed  bool
	running map[string]*poll
	// stopping are the polls stopped for targets that left, until they end: one
	// started again for the same key waits for its end (which forgets the key).
	stopping map[string]*poll
}

type poll struct {
	target Target
	cancel context.CancelFunc
	done   chan struct{}
}

// Sync polls exactly targets from now on: it starts a poll for a new target, stops
// the poll of one that is gone, and restarts one whose agent moved.
func (p *Poller) Sync(targets []Target) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	if p.running == nil {
		p.running, p.stopping = map[string]*poll{}, map[string]*poll{}
	}
	want := make(map[string]Target, len(targets))
	for _, t := range targets {
		want[t.Key] = t
	}
	for key, pl := range p.running {
		if t, ok := want[key]; !ok || t != pl.target {
			pl.cancel()
			if !ok {
				delete(p.running, key)
				p.stopping[key] = pl
			}
		}
	}
	for key, t := range want {
		prev := p.running[key]
		if prev != nil && prev.target == t {
			continue
		}
		if prev == nil {
			prev = p.stopping[key]
			delete(p.stopping, key)
		}
		ctx, cancel := context.WithCancel(context.Background())
		pl := &poll{target: t, cancel: cancel, done: make(chan struct{})}
		p.running[key] = pl
		go p.run(ctx, pl, prev)
	}
}

// Close stops every poll and waits for them to end.
func (p *Poller) Close() {
	p.mu.Lock()
	p.closed = true
	var polls []*poll
	for _, m := range []map[string]*poll{p.running, p.stopping} {
		for _, pl := range m {
			polls = append(polls, pl)
		}
	}
	p.running, p.stopping = nil, nil
	p.mu.Unlock()
	for _, pl := range polls {
		pl.cancel()
	}
	for _, pl := range polls {
		<-pl.done
	}
}

// run polls one target until its context ends, then forgets what it held. A poll
// that replaces prev (its agent moved) starts once prev has ended.
func (p *Poller) run(ctx context.Context, pl *poll, prev *poll) {
	defer close(pl.done)
	if prev != nil {
		<-prev.done
	}
	defer func() {
		p.Index.Remove(pl.target.Key)
		p.mu.Lock()
		if p.stopping[pl.target.Key] == pl {
			delete(p.stopping, pl.target.Key)
		}
		p.mu.Unlock()
	}()
	wait := orDefault(p.Wait, DefaultWait)
	minB, maxB := orDefault(p.MinBackoff, DefaultMinBackoff), orDefault(p.MaxBackoff, DefaultMaxBackoff)
	var backoff time.Duration
	for ctx.Err() == nil {
		epoch, seq := p.Index.Position(pl.target.Key)
		ev, err := p.Fetch(ctx, pl.target, epoch, seq, wait)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			p.Index.m.pollErrors.Inc()
			backoff = min(max(2*backoff, minB), maxB)
			p.Log.V(1).Info("Polling a replica's prefix events failed; backing off", "replica", pl.target.Key,
				"endpoint", pl.target.Endpoint, "backoff", backoff, "err", err.Error())
			if !sleep(ctx, backoff) {
				return
			}
			continue
		}
		backoff = 0
		p.Index.Apply(pl.target.Key, ev)
		if p.OnCold != nil && ev.Epoch != "" && (ev.Reset || ev.Epoch != epoch) && p.Index.Len(pl.target.Key) == 0 {
			p.OnCold(pl.target, ev.Epoch)
		}
		// An answer without events ended its wait (or the agent does not hold answers
		// back): pause, so that such an agent is not polled in a tight loop.
		if len(ev.Events) == 0 && !sleep(ctx, minB) {
			return
		}
	}
}

// sleep waits d, false when ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// HTTPFetch polls agents over HTTP: GET <scheme><endpoint>/api/models/{key}/prefixes.
type HTTPFetch struct {
	Transport http.RoundTripper
	// Scheme is "http://" or "https://".
	Scheme string
	// Prepare, when set, readies a request for t's agent (credentials, the Mac whose
	// certificate the connection must present) and returns it.
	Prepare func(r *http.Request, t Target) *http.Request
}

// Fetch is a Fetch.
func (h HTTPFetch) Fetch(ctx context.Context, t Target, epoch string, after uint64, wait time.Duration) (runnerapi.PrefixEvents, error) {
	ctx, cancel := context.WithTimeout(ctx, wait+pollSlack)
	defer cancel()
	q := url.Values{"epoch": {epoch}, "after": {strconv.FormatUint(after, 10)},
		"wait": {strconv.Itoa(int(wait.Seconds()))}}
	u := h.Scheme + t.Endpoint + "/api/models/" + url.PathEscape(t.Key) + "/prefixes?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return runnerapi.PrefixEvents{}, err
	}
	if h.Prepare != nil {
		req = h.Prepare(req, t)
	}
	resp, err := h.Transport.RoundTrip(req)
	if err != nil {
		return runnerapi.PrefixEvents{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return runnerapi.PrefixEvents{}, fmt.Errorf("agent answered %d: %s", resp.StatusCode, b)
	}
	var ev runnerapi.PrefixEvents
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswerBytes)).Decode(&ev); err != nil {
		return runnerapi.PrefixEvents{}, fmt.Errorf("reading the agent's prefix events: %w", err)
	}
	return ev, nil
}
