//go:build cgo && !race

package server

import (
	"crypto/rand"
	"encoding/hex"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
)

// The runner's side of the prefix index (runnerapi.HeaderPrefixDigests,
// GET /cache/prefixes): a generation's digests are associated with the state its slot
// saves; a tracker recomputes where those states are after every change of the tiers
// the runner makes (a save, a budget, a clear, a dropped entry) and every
// prefixRefreshInterval (the SSD tier evicts on its own writer); the endpoint answers
// from the table's event log.

// prefixRefreshInterval bounds how late an eviction the runner did not cause itself
// (the SSD tier's quota) is reported.
const prefixRefreshInterval = time.Second

// maxPrefixWait bounds a long poll on /cache/prefixes (wait=<seconds>).
const maxPrefixWait = 30 * time.Second

// newEpoch names one runner process's prefix table: 16 random hex digits.
func newEpoch() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// where is the tier a state is in now: hot, else the SSD (stored or queued), else
// none.
func (pc *promptCache) where(k promptcache.Key) promptcache.Tier {
	switch {
	case pc.c.Hot.Has(k):
		return promptcache.TierHot
	case pc.c.SSD != nil && pc.c.SSD.Holds(k):
		return promptcache.TierSSD
	}
	return promptcache.TierNone
}

// changed asks the tracker for a refresh (coalesced: one pending at most).
func (pc *promptCache) changed() {
	select {
	case pc.refresh <- struct{}{}:
	default:
	}
}

// noteSaved associates digests with the state saved under full, of stateBytes for
// stateTokens (the prefix table reports its bytes per token).
func (pc *promptCache) noteSaved(digests []string, full promptcache.Key, promptTokens int, stateBytes int64, stateTokens int) {
	pc.prefixes.NoteStateSize(stateBytes, stateTokens)
	if len(digests) > 0 {
		pc.prefixes.Associate(digests, promptcache.Backing{State: full, Tokens: promptTokens})
	}
	pc.changed()
}

// trackPrefixes refreshes the prefix table until stop is closed.
func (pc *promptCache) trackPrefixes(stop <-chan struct{}) {
	t := time.NewTicker(prefixRefreshInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-pc.refresh:
		case <-t.C:
		}
		pc.prefixes.Refresh(pc.where)
	}
}

// handlePrefixes is GET /cache/prefixes?epoch=E&after=N&wait=S (runnerapi.PrefixEvents).
// It answers at once with a reset or events; otherwise it waits up to S seconds (at
// most maxPrefixWait) for the next event, the client leaving or the runner stopping.
func (cs *cacheStore) handlePrefixes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var after uint64
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "after", "after must be an event number, got %q", v))
			return
		}
		after = n
	}
	var wait time.Duration
	if v := q.Get("wait"); v != "" {
		sec, err := strconv.ParseFloat(v, 64)
		if err != nil || sec < 0 || math.IsNaN(sec) {
			writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "wait", "wait must be a number of seconds, got %q", v))
			return
		}
		wait = time.Duration(min(sec, maxPrefixWait.Seconds()) * float64(time.Second))
	}
	epoch := q.Get("epoch")
	ans, next := cs.prefixes.Answer(epoch, after)
	if !ans.Reset && len(ans.Events) == 0 && wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-next:
			ans, _ = cs.prefixes.Answer(epoch, after)
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	writeJSON(w, http.StatusOK, ans)
}
