//go:build cgo && !race

package server

import (
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/macfleet/macfleet/metal/runner/netdevice"
)

// linkFigures are the split workers' link counters summed over the workers, or what
// they grew by over some decode steps, with the runner's own compute time (a step's
// decode time minus its link wait).
type linkFigures struct {
	sent, received, roundTrips uint64
	wait, compute, head        time.Duration
}

func (a linkFigures) minus(b linkFigures) linkFigures {
	return linkFigures{sent: a.sent - b.sent, received: a.received - b.received, roundTrips: a.roundTrips - b.roundTrips,
		wait: a.wait - b.wait, compute: a.compute - b.compute, head: a.head - b.head}
}

func (a *linkFigures) add(b linkFigures) {
	a.sent += b.sent
	a.received += b.received
	a.roundTrips += b.roundTrips
	a.wait += b.wait
	a.compute += b.compute
	a.head += b.head
}

// linkMeter measures a split runner's decode steps: what each step cost on the links
// and in the runner itself, given to the jobs of the step for their spans, and the
// runner's own compute time in total for /status. The engine has none when the runner
// holds every layer, and then does no work for it. Each engine has its own and reads
// the counters of its own thread (the engine keeps to one), so that on a pipelined
// runner a step counts its own context's commands, not the other's.
type linkMeter struct {
	// headNanos is the runner's own compute time so far (engine goroutine writes,
	// /status reads).
	headNanos atomic.Int64
}

func newLinkMeter(devs []*netdevice.Device) *linkMeter {
	if len(devs) == 0 {
		return nil
	}
	return &linkMeter{}
}

// totals sums the calling thread's link counters over the workers. Its wait includes
// the time the thread waited for a link another context's command held: that is not
// the runner's own compute either.
func (m *linkMeter) totals() linkFigures {
	st := netdevice.ThreadStats()
	return linkFigures{sent: st.BytesSent, received: st.BytesReceived, roundTrips: st.RoundTrips,
		wait: st.Wait + st.Queue, compute: st.Compute}
}

// headSeconds is the runner's own compute time so far; 0 on a runner that is not split.
func (m *linkMeter) headSeconds() float64 {
	if m == nil {
		return 0
	}
	return time.Duration(m.headNanos.Load()).Seconds()
}

// meterStep gives the decode step of slots that started at before and took took its
// link figures: every job in the step gets the whole step's (a step decodes the slots
// together, so its figures are shared by the requests in it), under prefill or decode
// by the slot's phase.
func (m *linkMeter) meterStep(before linkFigures, took time.Duration, slots slotSet) {
	step := m.totals().minus(before)
	step.head = max(took-step.wait, 0)
	m.headNanos.Add(int64(step.head))
	for _, s := range slots {
		if s.take > 0 && s.job != nil {
			s.job.addLink(s.phase == phaseGenerate, step)
		}
	}
}

// jobLink is what a job's decode steps cost on a split runner's links, split by the
// request's stages.
type jobLink struct{ prefill, decode linkFigures }

func (j *job) addLink(decode bool, step linkFigures) {
	j.mu.Lock()
	if j.link == nil {
		j.link = &jobLink{}
	}
	if decode {
		j.link.decode.add(step)
	} else {
		j.link.prefill.add(step)
	}
	j.mu.Unlock()
}

// linkAttrs are a stage's span attributes on a split runner, none otherwise.
func linkAttrs(l *jobLink, decode bool) []attribute.KeyValue {
	if l == nil {
		return nil
	}
	f := l.prefill
	if decode {
		f = l.decode
	}
	return []attribute.KeyValue{
		attribute.Int64("macfleet.split.sent_bytes", int64(f.sent)),
		attribute.Int64("macfleet.split.received_bytes", int64(f.received)),
		attribute.Int64("macfleet.split.round_trips", int64(f.roundTrips)),
		attribute.Float64("macfleet.split.link_wait_seconds", f.wait.Seconds()),
		attribute.Float64("macfleet.split.worker_compute_seconds", f.compute.Seconds()),
		attribute.Float64("macfleet.split.head_compute_seconds", f.head.Seconds()),
	}
}
