//go:build cgo && !race

package server

// The runner's memory guard: its footprint, and the refusal of a prefill that would
// take it over the ceiling the agent pushes with /limits.

import (
	"runtime/debug"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/runner/llama"
	"github.com/macfleet/macfleet/metal/runner/procmem"
)

// footprint is the runner's memory footprint, sampled at most every maxAge.
func (s *Server) footprint(maxAge time.Duration) int64 {
	s.fpMu.Lock()
	defer s.fpMu.Unlock()
	if maxAge > 0 && time.Since(s.fpAt) < maxAge {
		return s.fp
	}
	if fp, err := procmem.Self(); err == nil {
		s.fp, s.fpAt = fp, time.Now()
	}
	return s.fp
}

// guardSlack is how far under the ceiling a prefill must land, by the constant-time
// reading (procmem.Quick), for the guard to admit it without the exact one: far more
// than that reading can lag the exact figure.
const guardSlack = 64 << 20

// guard refuses a prefill of n tokens whose KV would take the footprint (on a card
// with memory of its own, the runner's device memory) over the ceiling pushed with
// /limits. A prefill clearly under the ceiling is admitted on the
// constant-time reading; near it the guard reads the footprint exactly (at most every
// 50 ms), which on Linux walks every mapping, about a millisecond per few hundred MiB.
func (s *Server) guard(n int) *runnerapi.Error {
	c := s.ceiling.Load()
	if c <= 0 {
		return nil
	}
	est := int64(n) * s.kvPerToken
	// On a card with its own memory the ceiling bounds what is offloaded: the weights,
	// KV cache and compute buffers the estimate counts live there, allocated whole at
	// load (device memory is committed when allocated, not as the KV fills), so a
	// prefill adds nothing there; the host holds the GPU runtime's own memory
	// (hundreds of MiB no estimate knows), which the pool measures and counts against
	// the machine (docs/architecture.md, "Two memory domains").
	if dev := s.separateDeviceBytes(); dev > 0 {
		if dev > c {
			return runnerapi.PrefillTooLarge(est, dev, c)
		}
		return nil
	}
	if q, err := procmem.Quick(); err == nil && q+est+guardSlack <= c {
		return nil
	}
	fp := s.footprint(50 * time.Millisecond)
	if fp+est > c && s.reclaim() {
		fp = s.footprint(0)
	}
	if fp+est > c {
		return runnerapi.PrefillTooLarge(est, fp, c)
	}
	return nil
}

// reclaimEvery bounds how often the guard collects the runner's garbage before a
// refusal: a runner that is really over its ceiling does not collect on every request.
const reclaimEvery = time.Second

// reclaim returns the Go heap's garbage and the C heap's free pages to the system (a
// refused request's body, a template's strings), which the footprint counts until the runtime returns it on its
// own, and reports whether it ran: at most once every reclaimEvery.
func (s *Server) reclaim() bool {
	now := time.Now().UnixNano()
	last := s.reclaimedAt.Load()
	if now-last < int64(reclaimEvery) || !s.reclaimedAt.CompareAndSwap(last, now) {
		return false
	}
	debug.FreeOSMemory()
	llama.TrimHeap()
	return true
}
