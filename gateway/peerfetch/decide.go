// Package peerfetch is the gateway's side of peer fetch (api/runnerapi/peerstate.go):
// whether a replica that misses a prefix another Mac's replica holds should fetch that
// prefix's state instead of prefilling it (Decide, a pure function), and the
// measurements it decides on (Estimates): bytes per token and prefill rate per
// deployment, throughput and round trip per link between two Macs.
package peerfetch

import (
	"math"
	"time"
)

// Defaults before anything is measured, chosen so that an unmeasured link does not
// look better than a slow real one.
const (
	// DefaultBytesPerToken is a state's size per token before a fetch of the
	// deployment measured it: the f16 KV cache of an 8 B-parameter model with grouped
	// query attention (32 layers × 8 KV heads × 128 × 2 × 2 bytes = 128 KiB). Smaller
	// models need less; a measured fetch replaces it.
	DefaultBytesPerToken = 128 << 10
	// DefaultThroughput is a link's end-to-end throughput (fetch, stream and checked
	// import, bytes/s) before a fetch over it was measured: 50 MB/s, under half of
	// gigabit Ethernet.
	DefaultThroughput = 50e6
	// DefaultRTT is a link's fixed cost per fetch (round trips: the TLS handshake if
	// the connection is new, the request, the runner's lookup) before measured.
	DefaultRTT = 20 * time.Millisecond
	// DefaultMargin: a fetch must be estimated this many times faster than the
	// prefill it replaces.
	DefaultMargin = 2.0
	// MinTokens: a state sparing fewer tokens is prefilled (a fetch's fixed costs,
	// and the estimates' error, dominate a short prefix).
	MinTokens = 128
)

// Link is what is known of the link from one Mac to another.
type Link struct {
	// Throughput is bytes/s, end to end (fetch and import).
	Throughput float64
	RTT        time.Duration
}

// Inputs are one decision's inputs.
type Inputs struct {
	// Tokens is how many prompt tokens the peer's state spares beyond what the
	// target replica holds.
	Tokens        int
	BytesPerToken float64
	Link          Link
	// PrefillRate is the deployment's measured prefill rate in tokens/s; 0: not
	// measured yet.
	PrefillRate float64
	// Margin is DefaultMargin when ≤ 0.
	Margin float64
}

// Why a decision went the way it did (the gateway's decisions metric).
const (
	ReasonFaster      = "faster"
	ReasonSlower      = "slower"
	ReasonFewTokens   = "few_tokens"
	ReasonNoPrefill   = "no_prefill_rate"
	ReasonNotMeasured = "not_measured"
)

// Decision is Decide's answer: fetch or not, the estimates and why.
type Decision struct {
	Fetch bool
	// Transfer is the fetch's estimated time (RTT + bytes / throughput), Prefill the
	// prefill's (tokens / rate).
	Transfer, Prefill time.Duration
	Reason            string
}

// Decide says whether to fetch: when RTT + tokens × bytes per token / throughput,
// times the margin, is under tokens / prefill rate. With no measured prefill rate
// there is nothing to compare with, and the state is prefilled.
func Decide(in Inputs) Decision {
	margin := in.Margin
	if margin <= 0 {
		margin = DefaultMargin
	}
	switch {
	case in.Tokens < MinTokens:
		return Decision{Reason: ReasonFewTokens}
	case in.PrefillRate <= 0 || math.IsNaN(in.PrefillRate) || math.IsInf(in.PrefillRate, 0):
		return Decision{Reason: ReasonNoPrefill}
	case in.Link.Throughput <= 0 || in.BytesPerToken <= 0:
		return Decision{Reason: ReasonNotMeasured}
	}
	bytes := float64(in.Tokens) * in.BytesPerToken
	transfer := in.Link.RTT + seconds(bytes/in.Link.Throughput)
	prefill := seconds(float64(in.Tokens) / in.PrefillRate)
	d := Decision{Transfer: transfer, Prefill: prefill, Reason: ReasonSlower}
	if float64(transfer)*margin < float64(prefill) {
		d.Fetch, d.Reason = true, ReasonFaster
	}
	return d
}

func seconds(s float64) time.Duration {
	if s >= math.MaxInt64/float64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}
