package gateway

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/prefixindex"
	"github.com/macfleet/macfleet/gateway/prefixindex/prefixindextest"
)

// BenchmarkPrefixIndexFleet measures the gateway's prefix index at fleet scale: Macs
// simulated agents (loopback HTTP servers, no runners), each serving the prefix events
// of replicas model replicas by the wire contract, polled by the gateway's own poller,
// fetch and transport into one index. It reports the time a restarted gateway takes to
// rebuild the whole index (every replica's first poll is a reset), the index's heap,
// and then, under a steady seeded stream of events (stores, moves to the SSD tier,
// evictions), the events applied per second, the bytes the agents write per event and
// per poll, the polls per second, the goroutines and the CPU per event. Run it with
//
//	go test ./gateway -run '^$' -bench PrefixIndexFleet -benchtime 1x
//
// (-fleet.macs, -fleet.replicas, -fleet.digests, -fleet.rate, -fleet.seconds size it).
func BenchmarkPrefixIndexFleet(b *testing.B) {
	for b.Loop() {
		runFleetIndex(b)
	}
}

var (
	fleetMacs     = flag.Int("fleet.macs", 100, "simulated Macs (agents) of BenchmarkPrefixIndexFleet")
	fleetReplicas = flag.Int("fleet.replicas", 8, "model replicas per simulated Mac")
	fleetDigests  = flag.Int("fleet.digests", 4096, "prefix digests each replica holds (the runner's bound is 16384)")
	fleetRate     = flag.Int("fleet.rate", 4000, "prefix events per second over the whole fleet in the steady phase")
	fleetSeconds  = flag.Duration("fleet.seconds", 20*time.Second, "length of the steady phase")
)

// fleetReplica is one simulated replica: its agent endpoint and the digests its runner
// holds, oldest first, for the event generator.
type fleetReplica struct {
	key   string
	agent *prefixindextest.Agent
	held  []string
	hot   map[string]bool
}

// wireCount counts what the agents write on their connections and the polls they answer.
type wireCount struct{ bytes, polls atomic.Int64 }

type countingListener struct {
	net.Listener
	c *wireCount
}

func (l countingListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: conn, c: l.c}, nil
}

type countingConn struct {
	net.Conn
	c *wireCount
}

func (c countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.c.bytes.Add(int64(n))
	return n, err
}

// fleetPopulation is a replica's held digests: tenants × conversations × turns, the
// deeper turns of a conversation hot, the shallower on the SSD.
func fleetPopulation(rng *rand.Rand, n int) []runnerapi.PrefixEvent {
	const turns = 8
	out := make([]runnerapi.PrefixEvent, 0, n)
	for i := 0; len(out) < n; i++ {
		turn := i % turns
		tier := runnerapi.TierSSD
		if turn >= turns/2 {
			tier = runnerapi.TierHot
		}
		out = append(out, runnerapi.PrefixEvent{Digest: fmt.Sprintf("%016x", rng.Uint64()), Tier: tier, Tokens: 4096 + 300*turn})
	}
	return out
}

// startFleetAgents starts macs loopback agents of replicas replicas each, every
// replica holding digests digests.
func startFleetAgents(b *testing.B, rng *rand.Rand, macs, replicas, digests int, wire *wireCount) ([]*fleetReplica, []prefixindex.Target) {
	var reps []*fleetReplica
	var targets []prefixindex.Target
	for m := range macs {
		byKey := map[string]*prefixindextest.Agent{}
		for r := range replicas {
			key := fmt.Sprintf("team-%d/model-%d-%d", r, m, r)
			rep := &fleetReplica{key: key, agent: prefixindextest.New(key, "epoch-"+key), hot: map[string]bool{}}
			pop := fleetPopulation(rng, digests)
			for _, e := range pop {
				rep.held = append(rep.held, e.Digest)
				rep.hot[e.Digest] = e.Tier == runnerapi.TierHot
			}
			rep.agent.Restart("epoch-"+key, pop...)
			byKey[key] = rep.agent
			reps = append(reps, rep)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /api/models/{id}/prefixes", func(w http.ResponseWriter, r *http.Request) {
			wire.polls.Add(1)
			if a := byKey[r.PathValue("id")]; a != nil {
				a.ServeHTTP(w, r)
				return
			}
			http.NotFound(w, r)
		})
		srv := httptest.NewUnstartedServer(mux)
		srv.Listener = countingListener{Listener: srv.Listener, c: wire}
		srv.Start()
		b.Cleanup(srv.Close)
		for _, rep := range reps[len(reps)-replicas:] {
			targets = append(targets, prefixindex.Target{Key: rep.key, Endpoint: srv.Listener.Addr().String(), Node: fmt.Sprintf("mac-%d", m)})
		}
	}
	return reps, targets
}

// next is the replica's next event batch: a store of a new digest in the hot tier
// (with the eviction of its oldest digest, keeping the population), or a move of a
// hot digest to the SSD tier.
func (r *fleetReplica) next(rng *rand.Rand) []runnerapi.PrefixEvent {
	if rng.IntN(3) == 0 {
		d := r.held[rng.IntN(len(r.held))]
		if r.hot[d] {
			r.hot[d] = false
			return []runnerapi.PrefixEvent{{Digest: d, Tier: runnerapi.TierSSD, Tokens: 4096}}
		}
	}
	oldest := r.held[0]
	delete(r.hot, oldest)
	d := fmt.Sprintf("%016x", rng.Uint64())
	r.held = append(r.held[1:], d)
	r.hot[d] = true
	return []runnerapi.PrefixEvent{{Digest: oldest}, {Digest: d, Tier: runnerapi.TierHot, Tokens: 6000}}
}

func heapNow() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// counterValue reads a counter of reg by name.
func counterValue(b *testing.B, reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	b.Fatalf("no metric %s", name)
	return 0
}

// waitFor polls cond until it holds or limit passes.
func waitFor(b *testing.B, limit time.Duration, what string, cond func() bool) time.Duration {
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Since(start) > limit {
			b.Fatalf("%s: not within %s", what, limit)
		}
		<-tick.C
	}
	return time.Since(start)
}

func runFleetIndex(b *testing.B) {
	rng := rand.New(rand.NewPCG(26, 100))
	macs, replicas, digests := *fleetMacs, *fleetReplicas, *fleetDigests
	var wire wireCount
	reps, targets := startFleetAgents(b, rng, macs, replicas, digests, &wire)
	total := len(reps) * digests

	// The index alone: every replica's listing applied as a reset, no HTTP.
	base := heapNow()
	alone, err := prefixindex.New(0, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range reps {
		alone.Apply(r.key, fleetListing(r))
	}
	indexBytes := heapNow() - base
	runtime.KeepAlive(alone)
	alone = nil
	baseline := stringMapBytes(reps)

	// A restarted gateway: a fresh index, every replica polled from nothing.
	reg := prometheus.NewRegistry()
	index, err := prefixindex.New(0, reg)
	if err != nil {
		b.Fatal(err)
	}
	tr := NewTransport()
	b.Cleanup(tr.CloseIdleConnections)
	poller := &prefixindex.Poller{Index: index, Log: logr.Discard(),
		Fetch: prefixindex.HTTPFetch{Transport: tr, Scheme: "http://"}.Fetch}
	b.Cleanup(poller.Close)
	base, goBefore := heapNow(), runtime.NumGoroutine()
	wireBefore := wire.bytes.Load()
	poller.Sync(targets)
	rebuild := waitFor(b, 2*time.Minute, "the index rebuilt", func() bool {
		for _, r := range reps {
			if index.Len(r.key) != digests {
				return false
			}
		}
		return true
	})
	rebuildWire := wire.bytes.Load() - wireBefore
	pipelineBytes := heapNow() - base
	goroutines := runtime.NumGoroutine() - goBefore

	// The steady phase: events at fleetRate for fleetSeconds, published in 10 ms ticks.
	applied0 := counterValue(b, reg, "macfleet_gateway_prefix_index_events_total")
	wire0, polls0, cpu0 := wire.bytes.Load(), wire.polls.Load(), cpuNow()
	published := publishSteady(rng, reps, *fleetRate, *fleetSeconds)
	steadyStart := time.Now().Add(-*fleetSeconds)
	waitFor(b, time.Minute, "the index caught up", func() bool {
		return counterValue(b, reg, "macfleet_gateway_prefix_index_events_total")-applied0 >= float64(published)
	})
	elapsed := time.Since(steadyStart)
	cpu := cpuNow() - cpu0
	wireN, polls := wire.bytes.Load()-wire0, wire.polls.Load()-polls0

	b.ReportMetric(float64(total), "digests")
	b.ReportMetric(rebuild.Seconds(), "s-rebuild")
	b.ReportMetric(float64(rebuildWire)/float64(total), "wire-B/digest-reset")
	b.ReportMetric(float64(indexBytes)/float64(total), "index-B/digest")
	b.ReportMetric(float64(indexBytes)/(1<<20), "index-MiB")
	b.ReportMetric(float64(baseline)/float64(total), "string-map-B/digest")
	b.ReportMetric(float64(pipelineBytes)/(1<<20), "pipeline-MiB")
	b.ReportMetric(float64(goroutines), "goroutines")
	b.ReportMetric(float64(published)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(polls)/elapsed.Seconds(), "polls/s")
	b.ReportMetric(float64(wireN)/float64(published), "wire-B/event")
	b.ReportMetric(float64(wireN)/float64(max(polls, 1)), "wire-B/poll")
	b.ReportMetric(float64(cpu.Microseconds())/float64(published), "cpu-us/event")
}

// fleetListing is r's full listing as a reset answer.
func fleetListing(r *fleetReplica) runnerapi.PrefixEvents {
	ev := runnerapi.PrefixEvents{Epoch: "epoch-" + r.key, Reset: true}
	for _, d := range r.held {
		tier := runnerapi.TierSSD
		if r.hot[d] {
			tier = runnerapi.TierHot
		}
		ev.Events = append(ev.Events, runnerapi.PrefixEvent{Digest: d, Tier: tier, Tokens: 4096})
	}
	return ev
}

// publishSteady publishes about rate events per second over d to random replicas, in
// 10 ms ticks, and returns how many it published.
func publishSteady(rng *rand.Rand, reps []*fleetReplica, rate int, d time.Duration) int {
	const tick = 10 * time.Millisecond
	perTick := max(rate*int(tick)/int(time.Second), 1)
	t := time.NewTicker(tick)
	defer t.Stop()
	end := time.Now().Add(d)
	published := 0
	for time.Now().Before(end) {
		<-t.C
		for n := 0; n < perTick; {
			r := reps[rng.IntN(len(reps))]
			ev := r.next(rng)
			r.agent.Publish(ev...)
			n += len(ev)
			published += len(ev)
		}
	}
	return published
}

// stringMapBytes is the heap the same digests take in the baseline, the index's earlier
// shape: per backend a map from the digest string to its tier string and tokens, the
// strings allocated apart as a JSON decoder leaves them.
func stringMapBytes(reps []*fleetReplica) uint64 {
	type held struct {
		tier   string
		tokens int
	}
	base := heapNow()
	sets := make(map[string]map[string]held, len(reps))
	for _, r := range reps {
		m := map[string]held{}
		for _, e := range fleetListing(r).Events {
			m[strings.Clone(e.Digest)] = held{tier: strings.Clone(e.Tier), tokens: e.Tokens}
		}
		sets[r.key] = m
	}
	n := heapNow() - base
	runtime.KeepAlive(sets)
	return n
}
