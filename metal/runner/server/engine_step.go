//go:build cgo && !race

package server

import (
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// One decode step of the engine: plan what each slot puts in the batch, fill it,
// decode it (engine.go), take its outputs back into the slots, sample.

// step decodes one batch and handles its outputs.
func (e *engine) step() {
	feedImages(e.slots, imageEval{ctx: e.ctx, nBatch: e.nBatch, guard: e.guard, log: e.log}, e.release)
	start := time.Now()
	b := e.batch
	b.Clear()
	e.planTakes()
	e.fillBatch()
	if b.N() == 0 {
		return
	}
	if b.N() > e.nBatch || b.N() > b.Cap() {
		// Unreachable by construction; decoding it would abort the process.
		e.log.Error(nil, "Refusing an oversize batch", "tokens", b.N(), "nBatch", e.nBatch)
		e.fill.remove(e.ctx)
		e.failStep(runnerapi.Internal("internal error: oversize batch"))
		return
	}
	drafted, drafters := drafts(e.slots)
	ok := e.decode(b)
	n := b.N() - len(e.fill.step)
	e.fill.remove(e.ctx)
	if !ok {
		return
	}
	e.sampling = e.absorb(e.sampling[:0])
	e.sampleAll(e.sampling)
	e.gate.Stepped(n, drafted, time.Since(start), e.mixed, drafters)
}

// planTakes sets how many tokens each slot puts in this step's batch: one for each
// generating slot, then the rest of the batch to prefills in admission order (so an
// early long prompt is not starved), each checked against memory first.
func (e *engine) planTakes() {
	budget := e.nBatch
	var prefill []*slot
	e.mixed = false
	for _, s := range e.slots {
		s.take, s.outIdx = 0, -1
		switch {
		case s.job == nil:
		case s.phase == phaseGenerate:
			s.take = 1
			budget--
		case s.phase == phasePrefill:
			prefill = append(prefill, s)
		}
	}
	sortByAdmission(prefill)
	for _, s := range prefill {
		if budget <= 0 {
			break
		}
		// Up to the next image, which feedImages evaluates on its own.
		n := min(budget, s.job.textEnd(s.fed)-s.fed)
		if n == 0 {
			continue
		}
		if s.job.embed {
			n = min(n, embedChunk)
		}
		if err := e.guard(n); err != nil {
			s.job.fail(err)
			e.release(s)
			continue
		}
		s.take = n
		budget -= n
		e.mixed = true
	}
	e.planDrafts(budget)
}

// fillBatch adds each slot's tokens to the batch in sequence-id order: llama.cpp
// splits a batch over per-sequence KV streams into micro-batches of consecutive
// sequence ids.
func (e *engine) fillBatch() {
	b := e.batch
	p := e.fill.plan(e.slots, e.ctx, e.nBatch, e.nCtxSeq, e.mixed, e.specOff == "") // engine_fillers.go
	for _, s := range e.slots {
		if s.take == 0 {
			if s.id > p.lo && s.id < p.hi && len(e.fill.step)+p.pad <= p.room {
				e.fill.add(b, s.id, e.ctx.SeqPosMax(s.id)+1, p.pad, e.nCtxSeq)
			}
			continue
		}
		pos := len(s.cached)
		if s.phase == phaseGenerate {
			s.first = b.Add(s.next, pos, s.id, true)
			s.outIdx = s.first
			for i, d := range s.draft {
				b.Add(d, pos+1+i, s.id, true)
			}
			e.fill.add(b, s.id, pos+s.take, p.pad-s.take, e.nCtxSeq)
			continue
		}
		for k := range s.take {
			i := s.fed + k
			last := i == len(s.job.tokens)-1
			idx := b.Add(s.job.tokens[i], pos+k, s.id, s.job.embed || last)
			if k == 0 {
				s.first = idx
			}
			if last && !s.job.embed {
				s.outIdx = idx
			}
		}
	}
}

// absorb takes a decoded batch's outputs into the slots: the tokens are cached, an
// embedding is read, and a slot whose prompt is in enters generation. It returns
// sampling with the slots to sample now appended.
func (e *engine) absorb(sampling []*slot) []*slot {
	for _, s := range e.slots {
		if s.take == 0 {
			continue
		}
		switch {
		case s.phase == phaseGenerate:
			s.cached = append(s.cached, s.next)
			s.ahead = len(s.draft) > 0
			sampling = append(sampling, s)
		case s.job.embed:
			for k := range s.take {
				e.ctx.AddEmbedding(s.emb, s.first+k)
			}
			s.cached = append(s.cached, s.job.tokens[s.fed:s.fed+s.take]...)
			s.fed += s.take
			if s.fed == len(s.job.tokens) {
				e.finishEmbedding(s)
			}
		default:
			s.cached = append(s.cached, s.job.tokens[s.fed:s.fed+s.take]...)
			s.fed += s.take
			if s.fed == len(s.job.tokens) {
				s.phase = phaseGenerate
				sampling = append(sampling, s)
			}
		}
	}
	return sampling
}

// drafts is the drafted tokens in this step of slots and the slots they belong to.
func drafts(slots []*slot) (tokens, drafters int) {
	for _, s := range slots {
		if s.take > 0 && len(s.draft) > 0 {
			tokens += len(s.draft)
			drafters++
		}
	}
	return tokens, drafters
}
