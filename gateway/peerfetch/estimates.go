package peerfetch

import (
	"sync"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// alpha is the weight of a new sample in the estimates' moving averages.
const alpha = 0.3

// MinPrefillSample: a prefill of fewer tokens says little about the rate (the time
// to the first token is then mostly fixed costs) and is not sampled.
const MinPrefillSample = 256

// LinkKey names a link: the Mac that serves a state and the Mac that fetches it.
type LinkKey struct{ Source, Target string }

type ewma struct {
	v float64
	n int
}

func (e *ewma) add(x float64) {
	if e.n == 0 {
		e.v = x
	} else {
		e.v = alpha*x + (1-alpha)*e.v
	}
	e.n++
}

func (e ewma) or(def float64) float64 {
	if e.n == 0 {
		return def
	}
	return e.v
}

type linkEst struct{ throughput, rtt ewma }

type modelEst struct{ prefill, bytesPerToken ewma }

// Estimates are the measurements decisions are made on: per deployment its prefill
// rate and its states' bytes per token, per link its throughput and round trip, each
// an exponentially weighted moving average of the samples. It is safe for concurrent
// use.
type Estimates struct {
	mu     sync.Mutex
	links  map[LinkKey]*linkEst
	models map[string]*modelEst
}

// NewEstimates is empty Estimates.
func NewEstimates() *Estimates {
	return &Estimates{links: map[LinkKey]*linkEst{}, models: map[string]*modelEst{}}
}

// entry is m's value for k, made when there is none.
func entry[K comparable, V any](m map[K]*V, k K) *V {
	v := m[k]
	if v == nil {
		v = new(V)
		m[k] = v
	}
	return v
}

// Inputs are the decision's inputs for a state of tokens of deployment model over
// link: measured values, or the defaults where nothing was measured yet (the prefill
// rate has none: 0).
func (e *Estimates) Inputs(model string, link LinkKey, tokens int, margin float64) Inputs {
	e.mu.Lock()
	defer e.mu.Unlock()
	in := Inputs{Tokens: tokens, Margin: margin, BytesPerToken: DefaultBytesPerToken,
		Link: Link{Throughput: DefaultThroughput, RTT: DefaultRTT}}
	if me := e.models[model]; me != nil {
		in.PrefillRate = me.prefill.or(0)
		in.BytesPerToken = me.bytesPerToken.or(DefaultBytesPerToken)
	}
	if le := e.links[link]; le != nil {
		in.Link = Link{Throughput: le.throughput.or(DefaultThroughput), RTT: time.Duration(le.rtt.or(float64(DefaultRTT)))}
	}
	return in
}

// ObservePrefill samples deployment model's prefill rate: tokens prefilled (prompt
// tokens less those restored) before the first token came, d after the request was
// sent. Fewer than MinPrefillSample tokens are not a sample.
func (e *Estimates) ObservePrefill(model string, tokens int, d time.Duration) {
	if tokens < MinPrefillSample || d <= 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	entry(e.models, model).prefill.add(float64(tokens) / d.Seconds())
}

// ObserveFetch samples a fetch's outcome as the fetching agent reported it: a fetch
// that moved bytes samples the link's throughput (bytes over its time less the
// link's round trip) and, when imported, the deployment's bytes per token; one that
// moved nothing because the peer answered at once (not found, refused) samples the
// round trip.
func (e *Estimates) ObserveFetch(model string, link LinkKey, res runnerapi.PeerStateResult) {
	if res.Millis < 0 {
		return
	}
	d := time.Duration(res.Millis) * time.Millisecond
	e.mu.Lock()
	defer e.mu.Unlock()
	le := entry(e.links, link)
	switch {
	case res.Bytes > 0:
		rtt := time.Duration(le.rtt.or(float64(DefaultRTT)))
		moving := max(d-rtt, time.Millisecond)
		le.throughput.add(float64(res.Bytes) / moving.Seconds())
		if res.Imported && res.Tokens > 0 {
			entry(e.models, model).bytesPerToken.add(float64(res.Bytes) / float64(res.Tokens))
		}
	case res.Reason == runnerapi.PeerMissNotFound || res.Reason == runnerapi.PeerMissRefused:
		le.rtt.add(float64(d))
	}
}
