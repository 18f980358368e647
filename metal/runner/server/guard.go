//go:build cgo && !race

package server

// The runner's memory guard: its footprint, and the refusal of a prefill that would
// take it over the ceiling the agent pushes with /limits.

import (
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/runner/llama"
	"github.com/macfleet/macfleet/metal/runner/procmem"
)

// memGuard is the runner's memory against its ceiling: the ceiling the agent pushes,
// the footprint (sampled), what the runner holds on accelerators with memory of their
// own, and what a token of KV costs.
type memGuard struct {
	ceiling atomic.Int64
	// kvPerToken and devBytes are set by load (loaded), before the state becomes ready.
	kvPerToken int64
	// devBytes is the runner's own allocation on accelerators, read once the model
	// and its contexts are loaded (llama.cpp allocates them whole at load).
	devBytes atomic.Int64

	fpMu sync.Mutex
	fpAt time.Time
	fp   int64
	// reclaimedAt is when the guard last returned the heap's garbage (unix ns).
	reclaimedAt atomic.Int64
}

func newMemGuard(ceiling int64) *memGuard {
	g := &memGuard{}
	g.ceiling.Store(ceiling)
	return g
}

// loaded records what the loaded model costs: a token's KV and the device bytes.
func (g *memGuard) loaded(kvPerToken, devBytes int64) {
	g.kvPerToken = kvPerToken
	g.devBytes.Store(devBytes)
}

// footprint is the runner's memory footprint, sampled at most every maxAge.
func (g *memGuard) footprint(maxAge time.Duration) int64 {
	g.fpMu.Lock()
	defer g.fpMu.Unlock()
	if maxAge > 0 && time.Since(g.fpAt) < maxAge {
		return g.fp
	}
	if fp, err := procmem.Self(); err == nil {
		g.fp, g.fpAt = fp, time.Now()
	}
	return g.fp
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
func (g *memGuard) guard(n int) *runnerapi.Error {
	c := g.ceiling.Load()
	if c <= 0 {
		return nil
	}
	est := int64(n) * g.kvPerToken
	// On a card with its own memory the ceiling bounds what is offloaded: the weights,
	// KV cache and compute buffers the estimate counts live there, allocated whole at
	// load (device memory is committed when allocated, not as the KV fills), so a
	// prefill adds nothing there; the host holds the GPU runtime's own memory
	// (hundreds of MiB no estimate knows), which the pool measures and counts against
	// the machine (docs/architecture.md, "Two memory domains").
	if dev := g.separateDeviceBytes(); dev > 0 {
		if dev > c {
			return runnerapi.PrefillTooLarge(est, dev, c)
		}
		return nil
	}
	if q, err := procmem.Quick(); err == nil && q+est+guardSlack <= c {
		return nil
	}
	fp := g.footprint(50 * time.Millisecond)
	if fp+est > c && g.reclaim() {
		fp = g.footprint(0)
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
func (g *memGuard) reclaim() bool {
	now := time.Now().UnixNano()
	last := g.reclaimedAt.Load()
	if now-last < int64(reclaimEvery) || !g.reclaimedAt.CompareAndSwap(last, now) {
		return false
	}
	debug.FreeOSMemory()
	llama.TrimHeap()
	return true
}

// separateDeviceBytes is what the runner holds on accelerators with memory of their
// own: what its ceiling counts beside the footprint (zero on a Mac, whose footprint
// holds it).
func (g *memGuard) separateDeviceBytes() int64 {
	if !deviceMemorySeparate {
		return 0
	}
	return g.devBytes.Load()
}

// fillDevices sets the accelerator fields of a loaded runner's status.
func (g *memGuard) fillDevices(st *runnerapi.Status) {
	st.DeviceBytes = g.devBytes.Load()
	st.DeviceMemorySeparate = deviceMemorySeparate && st.DeviceBytes > 0
	st.Backends = backendsReport.Summary()
	st.Accelerators = accelerators(time.Now())
}

// handleLimits is POST /limits: the ceiling the guard holds prefills under.
func (g *memGuard) handleLimits(w http.ResponseWriter, r *http.Request) {
	var l runnerapi.Limits
	if err := readJSON(w, r, &l); err != nil {
		writeError(w, err)
		return
	}
	if l.CeilingBytes < 0 || l.HardLimitBytes < 0 || l.HostUsedBytes < 0 {
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "ceiling_bytes", "limits must not be negative"))
		return
	}
	g.ceiling.Store(l.CeilingBytes)
	writeJSON(w, http.StatusOK, l)
}
