//go:build cgo && !race

package server

import (
	"slices"
	"time"

	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
)

// The engine's side of sharing an in-flight prefix (see inflight.go for the
// decisions).

// tierSlot names a state taken from another slot's sequence in logs.
const tierSlot promptcache.Tier = "slot"

// jobHold is a queued job's wait on a leader slot prefilling a prompt it shares.
type jobHold struct {
	holdState
	leader    *slot
	leaderJob *job
}

// holdOrShare applies the in-flight decisions to a queued job at admission: it
// reports true when the job keeps waiting for its leader. When the leader has fed
// the shared tokens, the job takes their KV (a copy of the leader's sequence state,
// restored at assign as a cached prefix); when the leader's job ended or the wait
// exceeded its limit, the job prefills normally.
func (e *engine) holdOrShare(j *job, now time.Time) bool {
	if j.embed || !e.pc.active() {
		return false
	}
	if j.hold == nil {
		if j.holdChecked {
			return false
		}
		j.holdChecked = true
		if !e.startHold(j, now) {
			return false
		}
	}
	h := j.hold
	live := h.leader.job == h.leaderJob && !h.leaderJob.finished()
	switch holdNext(h.holdState, live, h.leader.fed, now, e.rate.perToken) {
	case holdWait:
		return true
	case holdShare:
		e.share(j, h)
	case holdGive:
		e.pc.inflightGiveUps.Add(1)
	}
	j.hold = nil
	return false
}

// startHold looks for a busy slot (prefilling or generating) whose prompt j shares
// and makes j wait on it (for no time when it fed the shared tokens already).
func (e *engine) startHold(j *job, now time.Time) bool {
	keep := 0
	if j.restore != nil {
		keep = j.restore.n
	}
	var busy []prefilling
	for _, s := range e.slots {
		switch {
		case s.job == nil:
			keep = max(keep, reusable(s, j))
		case !s.job.embed && s.partition == j.partition:
			// Prefilling, or generating with its whole prompt fed: a copy of its
			// sequence is as good then, and saves the prefill the state saved at its
			// end would come too late for.
			busy = append(busy, prefilling{slot: s.id, keys: e.pc.blockKeys(s.job, len(s.job.tokens)), fed: s.fed})
		}
	}
	if len(busy) == 0 {
		return false
	}
	// The job's keys leave its last token out: it must prefill at least that one.
	c := chooseLeader(e.pc.blockKeys(j, len(j.tokens)-1), keep, e.pc.block, busy)
	if c.slot < 0 {
		return false
	}
	leader := e.slots[c.slot]
	j.hold = &jobHold{holdState: holdState{shared: c.shared, own: c.shared - keep, since: now},
		leader: leader, leaderJob: leader.job}
	e.pc.inflightWaits.Add(1)
	return true
}

// blockKeys returns the block keys of j's first n prompt tokens (computed once).
func (pc *promptCache) blockKeys(j *job, n int) []promptcache.Key {
	if j.keys == nil {
		j.keys = promptcache.BlockKeys(pc.id, j.partition, j.tokens[:n], pc.block)
	}
	return j.keys
}

// share hands j a copy of its leader's sequence state to restore its shared tokens
// from, unless the leader's KV does not hold them after all.
func (e *engine) share(j *job, h *jobHold) {
	s := h.leader
	if len(s.cached) < h.shared || !slices.Equal(s.cached[:h.shared], j.tokens[:h.shared]) {
		e.pc.inflightGiveUps.Add(1)
		return
	}
	if j.restore != nil && j.restore.n >= h.shared {
		return
	}
	state := e.ctx.SeqState(s.id, nil)
	j.restore = &restoreState{n: h.shared, tokens: j.tokens[:h.shared], state: state, tier: tierSlot}
	e.pc.inflightShares.Add(1)
	e.pc.inflightSharedTokens.Add(int64(h.shared))
}

// inflightMinSample is the smallest batch whose decode time notePerToken counts.
const inflightMinSample = 32

// prefillRate is the measured decode time per batch token (an EWMA of the steps that
// prefill), what prefilling a token costs.
type prefillRate struct{ perToken time.Duration }

// note folds one decode of n tokens that took d into the per-token estimate.
func (r *prefillRate) note(d time.Duration, n int) {
	if n < inflightMinSample {
		return // a generation step: its per-token time says little about prefill
	}
	x := d / time.Duration(n)
	if r.perToken == 0 {
		r.perToken = x
		return
	}
	r.perToken += (x - r.perToken) / 8
}
