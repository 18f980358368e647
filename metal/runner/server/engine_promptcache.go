//go:build cgo && !race

package server

import (
	"errors"
	"fmt"
	"time"
)

// The engine's side of the prompt cache and of cached prefixes: restoring a cached
// prompt state into a slot at admission, handing a finished slot's state to the
// cache, and dropping idle slots' prefixes.

// restore replaces the slot's sequence with a cached state trimmed to its first r.n
// tokens and returns how many prompt tokens the slot now holds (0 when llama.cpp
// refused the state: the slot is then empty and the prompt is prefilled in full).
func (e *engine) restore(s *slot, r *restoreState) int {
	start := time.Now()
	var err error
	if e.model.HasKVCells() {
		err = checkStateCells(r.state)
	}
	if err == nil {
		err = e.ctx.SetSeqState(s.id, r.state)
	}
	if err == nil && e.ctx.SeqPosMax(s.id) < r.n-1 {
		err = fmt.Errorf("the state holds %d tokens, not %d", e.ctx.SeqPosMax(s.id)+1, r.n)
	}
	if err == nil && !e.ctx.SeqRm(s.id, r.n, -1) {
		err = errors.New("could not trim the restored sequence")
	}
	if err != nil {
		e.ctx.SeqRm(s.id, -1, -1)
		s.cached = s.cached[:0]
		e.pc.restoreFailures.Add(1)
		e.log.Info("Restoring a cached prompt state failed; prefilling in full", "tokens", r.n, "tier", r.tier, "error", err.Error())
		return 0
	}
	s.cached = append(s.cached[:0], r.tokens...)
	e.pc.restores.Add(1)
	e.pc.restoredTokens.Add(int64(r.n))
	e.log.V(1).Info("Restored a cached prompt state", "tokens", r.n, "tier", r.tier, "slot", s.id, "bytes", len(r.state),
		"lookup", r.found.Round(time.Microsecond), "restore", time.Since(start).Round(time.Microsecond))
	return r.n
}

// saveState hands the slot's sequence state to the prompt cache.
func (e *engine) saveState(s *slot) {
	if !e.pc.active() || len(s.cached) < e.pc.block {
		return
	}
	size := e.ctx.SeqStateSize(s.id)
	full, ok := e.pc.save(s.cached, len(s.job.tokens), s.partition, size, func(header []byte) []byte {
		return e.ctx.SeqState(s.id, header)
	})
	if ok {
		e.pc.noteSaved(s.job.digests, full, len(s.job.tokens), int64(blobHeader+4*len(s.cached)+size), len(s.cached))
	}
}

// clearIdle drops the cached prefixes of idle slots and returns how many it dropped.
func (e *engine) clearIdle() int {
	n := 0
	for _, s := range e.slots {
		if s.job == nil && len(s.cached) > 0 {
			e.ctx.SeqRm(s.id, -1, -1)
			s.cached = nil
			n++
		}
	}
	e.queue.publish(e.slots.figures())
	return n
}
