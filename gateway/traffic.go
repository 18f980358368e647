package gateway

import (
	"slices"
	"sync"
	"time"

	"github.com/macfleet/macfleet/gateway/fairqueue"
)

// Recent traffic, as the console shows it: requests per second over the last
// fairqueue.RateWindow, and TTFT percentiles over the last ttftSamples requests that
// started answering within ttftMaxAge.
const (
	ttftSamples = 256
	ttftMaxAge  = time.Minute
)

// Traffic is one deployment's recent traffic through this gateway.
type Traffic struct {
	// RequestsPerSecond answered over the last 10 s.
	RequestsPerSecond float64
	// TTFTp50 and TTFTp99 of the recent requests (zero without any).
	TTFTp50, TTFTp99 time.Duration
	// TTFTSamples is how many requests the percentiles come from.
	TTFTSamples int
	// InFlight is the requests in the gateway now, waiting or proxied; Queued those of
	// them that wait in the fair queue.
	InFlight, Queued int
}

// traffic keeps each deployment's recent requests for Traffic. Its cost on the hot
// path is a lock and a few words per request.
type traffic struct {
	now func() time.Time

	mu     sync.Mutex
	models map[string]*modelTraffic
}

type modelTraffic struct {
	answered fairqueue.Rate
	inflight int
	// ttft is a ring of recent first-byte times.
	ttft []ttftSample
	next int
}

type ttftSample struct {
	at time.Time
	d  time.Duration
}

func newTraffic() *traffic { return &traffic{now: time.Now, models: map[string]*modelTraffic{}} }

func (t *traffic) model(id string) *modelTraffic {
	m := t.models[id]
	if m == nil {
		m = &modelTraffic{}
		t.models[id] = m
	}
	return m
}

// started counts a request for model in the gateway; the returned func ends it.
func (t *traffic) started(model string) (done func()) {
	t.mu.Lock()
	t.model(model).inflight++
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		m := t.model(model)
		m.inflight--
		m.answered.Observe(t.now())
		t.mu.Unlock()
	}
}

// firstByte records a request's time to its first byte.
func (t *traffic) firstByte(model string, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.model(model)
	s := ttftSample{at: t.now(), d: d}
	if len(m.ttft) < ttftSamples {
		m.ttft = append(m.ttft, s)
		return
	}
	m.ttft[m.next] = s
	m.next = (m.next + 1) % ttftSamples
}

// of is model's recent traffic (Queued is the caller's to fill).
func (t *traffic) of(model string) Traffic {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.models[model]
	if m == nil {
		return Traffic{}
	}
	now := t.now()
	out := Traffic{RequestsPerSecond: m.answered.PerSecond(now), InFlight: m.inflight}
	var ds []time.Duration
	for _, s := range m.ttft {
		if now.Sub(s.at) <= ttftMaxAge {
			ds = append(ds, s.d)
		}
	}
	if len(ds) > 0 {
		slices.Sort(ds)
		out.TTFTSamples = len(ds)
		out.TTFTp50 = percentileOf(ds, 0.50)
		out.TTFTp99 = percentileOf(ds, 0.99)
	}
	return out
}

// percentileOf is the nearest-rank percentile of sorted durations.
func percentileOf(sorted []time.Duration, p float64) time.Duration {
	i := int(p*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Traffic is the recent traffic of the deployment "<namespace>/<name>" through this
// gateway.
func (g *Gateway) Traffic(model string) Traffic {
	tr := g.traffic.of(model)
	tr.Queued, _ = g.adm.Queued(model)
	return tr
}
