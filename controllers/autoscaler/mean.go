package autoscaler

import (
	"math"
	"slices"
	"time"
)

// A load read at one instant misses what short requests do between two reads: a
// small model answers a request in milliseconds, so a replica serving sixteen clients
// can show one lease, and a gateway queue that is never empty for long can show none,
// whenever it is read. The agents and gateways therefore also report integrals over
// time — lease-seconds (enginepool.ModelSnapshot.LeaseSeconds) and queued seconds
// (v1alpha1.HeaderQueuedSeconds) — and a sample is their mean since the previous
// read, which catches every request however short. Where no integral is at hand (the
// first read, an engine reloaded, a component that does not report one) the count at
// the instant stands in.

// leaseReading is one replica's lease integral as its agent reported it.
type leaseReading struct {
	// at is the agent's time of the report (its snapshot's time).
	at time.Time
	// loadedAt identifies the engine: a reload starts a new integral.
	loadedAt time.Time
	seconds  float64
}

// meanLeases is the mean number of leases between prev and cur; ok is false when
// they are not two reports of one engine's integral, in order.
func meanLeases(prev, cur leaseReading) (mean float64, ok bool) {
	if prev.at.IsZero() || !prev.loadedAt.Equal(cur.loadedAt) {
		return 0, false
	}
	return meanOver(prev.at, prev.seconds, cur.at, cur.seconds)
}

// meanOver is the mean of what an integral over time integrates between two
// readings of it: v0 at t0 and v1 at t1. ok is false unless t1 is later and the
// integral did not shrink (a restarted counter).
func meanOver(t0 time.Time, v0 float64, t1 time.Time, v1 float64) (mean float64, ok bool) {
	if !t1.After(t0) || v1 < v0 {
		return 0, false
	}
	return (v1 - v0) / t1.Sub(t0).Seconds(), true
}

// queueHeld is the queue a gateway's report q stands for, given the agent's previous
// read's reports for the same model (prev, each with its held). The same report again
// stands for what it stood for; a later one of the same gateway with an integral that
// grew gives the mean queue between the two reports; anything else (no integral, no
// report of that gateway before, a report older than the one before) gives the
// report's count.
func queueHeld(prev []gatewayQueue, q gatewayQueue) float64 {
	held := float64(max(q.Queued, 0))
	i := slices.IndexFunc(prev, func(p gatewayQueue) bool { return p.Gateway == q.Gateway })
	if i < 0 || q.QueuedSeconds == nil || prev[i].QueuedSeconds == nil {
		return held
	}
	p := prev[i]
	if q.At.Equal(p.At) && *q.QueuedSeconds == *p.QueuedSeconds {
		return p.held
	}
	if mean, ok := meanOver(p.At, *p.QueuedSeconds, q.At, *q.QueuedSeconds); ok {
		return mean
	}
	return held
}

// loadOf rounds means up to whole requests: the load is the requests in flight and
// held together, rounded up, so that any request in the interval counts; of it,
// InFlight is the in-flight mean rounded up. A float error of a part per million is
// not a request.
func loadOf(inFlight, held float64) Load {
	up := func(x float64) int32 {
		return int32(min(max(math.Ceil(x-1e-6), 0), math.MaxInt32))
	}
	in, total := up(inFlight), up(inFlight+held)
	return Load{InFlight: in, Held: max(total-in, 0)}
}
