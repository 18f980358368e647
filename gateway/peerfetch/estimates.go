package peerfetch

import (
	"math"
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

// Prior is what is known of a decision's inputs before a fetch measured them: the
// bytes per token the source replica's runner reports with its prefix events
// (runnerapi.PrefixEvents.BytesPerToken) and the link its Macs declare. A field ≤ 0
// (or not finite) is unknown: the default.
type Prior struct {
	BytesPerToken float64
	Link          Link
}

// DeclaredShare is the share of a Mac's declared link bandwidth (MacNode spec.link,
// else status.link) a fetch is assumed to reach end to end before one is measured
// (the stream, the checks and the import cost their share; DefaultThroughput assumes
// under half of gigabit Ethernet).
const DeclaredShare = 0.5

// DeclaredLink is the prior of one Mac's link from its declared bandwidth in bits/s
// and round trip (0: not declared): DeclaredShare of the bandwidth, in bytes/s.
func DeclaredLink(bitsPerSecond float64, rtt time.Duration) Link {
	return Link{Throughput: max(bitsPerSecond, 0) / 8 * DeclaredShare, RTT: max(rtt, 0)}
}

// PairLink is the prior of the link between two Macs from what each declares: the
// slower throughput and the longer round trip of those declared (0 when neither
// declares it).
func PairLink(a, b Link) Link {
	out := Link{RTT: max(a.RTT, b.RTT)}
	switch {
	case a.Throughput > 0 && b.Throughput > 0:
		out.Throughput = min(a.Throughput, b.Throughput)
	default:
		out.Throughput = max(a.Throughput, b.Throughput, 0)
	}
	return out
}

// orPrior is v when it is a usable figure (positive, finite), else def.
func orPrior(v, def float64) float64 {
	if v > 0 && !math.IsInf(v, 0) {
		return v
	}
	return def
}

// Inputs are the decision's inputs for a state of tokens of deployment model over
// link: measured values; where nothing was measured yet, prior's, else the defaults
// (the prefill rate has none: 0).
func (e *Estimates) Inputs(model string, link LinkKey, tokens int, margin float64, prior Prior) Inputs {
	bpt := orPrior(prior.BytesPerToken, DefaultBytesPerToken)
	throughput := orPrior(prior.Link.Throughput, DefaultThroughput)
	rtt := orPrior(float64(prior.Link.RTT), float64(DefaultRTT))
	e.mu.Lock()
	defer e.mu.Unlock()
	in := Inputs{Tokens: tokens, Margin: margin, BytesPerToken: bpt, Link: Link{Throughput: throughput, RTT: time.Duration(rtt)}}
	if me := e.models[model]; me != nil {
		in.PrefillRate = me.prefill.or(0)
		in.BytesPerToken = me.bytesPerToken.or(bpt)
	}
	if le := e.links[link]; le != nil {
		in.Link = Link{Throughput: le.throughput.or(throughput), RTT: time.Duration(le.rtt.or(rtt))}
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
// link's round trip: the measured one, else the declared one of prior, else
// DefaultRTT) and, when imported, the deployment's bytes per token; one that moved
// nothing because the peer answered at once (not found, refused) samples the round
// trip.
func (e *Estimates) ObserveFetch(model string, link LinkKey, res runnerapi.PeerStateResult, prior Link) {
	if res.Millis < 0 {
		return
	}
	d := time.Duration(res.Millis) * time.Millisecond
	e.mu.Lock()
	defer e.mu.Unlock()
	le := entry(e.links, link)
	switch {
	case res.Bytes > 0:
		rtt := time.Duration(le.rtt.or(orPrior(float64(prior.RTT), float64(DefaultRTT))))
		moving := max(d-rtt, time.Millisecond)
		le.throughput.add(float64(res.Bytes) / moving.Seconds())
		if res.Imported && res.Tokens > 0 {
			entry(e.models, model).bytesPerToken.add(float64(res.Bytes) / float64(res.Tokens))
		}
	case res.Reason == runnerapi.PeerMissNotFound || res.Reason == runnerapi.PeerMissRefused:
		le.rtt.add(float64(d))
	}
}
