//go:build cgo && !race

package server

import (
	"fmt"
	"slices"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/runner/llama"
	"github.com/macfleet/macfleet/metal/runner/speculate"
)

// Speculative decoding by prompt lookup (docs/speculative-decoding.md): a generating
// slot drafts the tokens that followed the last earlier occurrence of its last few
// tokens (speculate.Lookup), decodes them after its next token in the same batch as
// the other slots, and keeps the drafted tokens its own sampler agrees with
// (speculate.Verify). The answer is the one the slot gives without drafting, token
// for token, at any temperature: the sampler sees the same rows in the same order.

// Lookup's n-gram lengths: the last maxGram tokens are looked for first, down to one.
const minGram, maxGram = 1, 3

// speculationOff is why a model of architecture arch is served without speculative
// decoding ("" when it is not): a rejected draft's cells are removed from the
// sequence, and a recurrent state cannot be cut back.
func speculationOff(arch string, recurrent, hybrid bool) string {
	switch {
	case hybrid:
		return fmt.Sprintf("off: the model keeps a recurrent state beside its attention cache, which cannot be cut back past a rejected draft (%s)", arch)
	case recurrent:
		return fmt.Sprintf("off: the model keeps a recurrent state, which cannot be cut back past a rejected draft (%s)", arch)
	}
	return ""
}

// planDrafts gives the generating slots that may draft the batch's room left
// after every slot's next token and the prefills (budget): each drafts what its policy
// allows within that room, its context, its max_tokens and the memory guard. A slot
// drafts from its prediction, else by prompt lookup, else, with a draft model, the
// draft model's greedy tokens (draft.go: every such slot in one batch a token).
func (e *engine) planDrafts(budget int) {
	asks := e.asks[:0]
	plan := speculate.Plan{Base: e.nBatch - budget}
	// One draft a step may be let through to learn from it (Gate.Tries: a source the
	// runner has not tried enough to judge, or an exploring step): sixteen slots
	// trying at once cost a step of sixteen drafts.
	explore := true
	for _, s := range e.slots {
		s.draft, s.byModel = s.draft[:0], false
		if budget <= 0 || s.take != 1 || s.phase != phaseGenerate || e.specOff != "" || !s.job.mayDraft() {
			continue
		}
		hist := append(s.cached, s.next) // where absorb puts next
		draft, gram := speculate.Follow(s.job.predicted, hist, minGram, maxGram, s.policy.Max)
		s.src = speculate.FromPrediction
		if len(draft) == 0 {
			draft, gram = speculate.Lookup(hist, minGram, maxGram, s.policy.Max)
			s.src = speculate.FromLookup(gram)
		}
		if len(draft) == 0 {
			if e.drafter == nil {
				continue
			}
			s.src = speculate.FromModel
		}
		n := s.policy.Size(s.draftRoom(budget, e.nCtxSeq), gram == maxGram)
		if len(draft) > 0 {
			n = min(n, len(draft))
		}
		expect := s.rates.Expect(s.src, n)
		try := explore && e.gate.Tries(s.src)
		if n == 0 || !s.job.forceSpec && !e.gate.Allows(plan, n, expect, try) || e.guard(n) != nil {
			continue
		}
		explore = explore && !try
		e.gate.Add(&plan, n, expect)
		if len(draft) > 0 {
			s.draft = append(s.draft, draft[:n]...)
		} else {
			s.ask = draftAsk{seq: s.id, hist: hist, n: n, out: s.ask.out}
			s.byModel = true
			asks = append(asks, &s.ask)
		}
		s.take += n
		budget -= n
	}
	e.asks = asks
	if len(asks) == 0 {
		return
	}
	e.drafter.draft(asks)
	for _, a := range asks {
		s := e.slots[a.seq]
		s.draft = append(s.draft, a.out...)
		s.take -= a.n - len(a.out)
	}
}

// draftRoom is the most tokens slot s may draft at this step: within the batch's
// room left (budget), its context of nCtxSeq cells and its max_tokens.
func (s *slot) draftRoom(budget, nCtxSeq int) int {
	room := min(budget, nCtxSeq-1-len(s.cached))
	if m := s.job.opts.MaxTokens; m > 0 {
		s.job.mu.Lock()
		room = min(room, m-s.job.generated-1)
		s.job.mu.Unlock()
	}
	return room
}

// mayDraft reports whether job j's slot may draft, where the model allows it: not for
// a job that turned it off, or one with images (their stand-in ids are no tokens).
func (j *job) mayDraft() bool {
	return !j.noSpec && !j.embed && len(j.images) == 0
}

// readDraftRows reads the rows of logits of each drafting slot of ss, after its
// first row (sampleAll reads that): reading one waits for the decode and must not race.
func readDraftRows(lctx *llama.Context, ss []*slot) {
	for _, s := range ss {
		s.rows = s.rows[:0]
		for i := range s.draft {
			s.rows = append(s.rows, lctx.Logits(s.first+1+i))
		}
	}
}

// verifyDraft samples slot s's rows of model m (first the row of next, then its
// draft's) with its own sampler while they agree with the draft (speculate.Verify).
// A greedy sampler's choices are each row's argmax, which do not depend on the
// tokens before: with spare cores beside it (the step's other slots sampling on
// fewer), they are computed for every row at once first (argmaxRows).
func (s *slot) verifyDraft(m *llama.Model, first llama.Logits, spare int) {
	row := func(i int) llama.Logits {
		if i == 0 {
			return first
		}
		return s.rows[i-1]
	}
	s.picks = s.picks[:0]
	if spare > 1 && s.sampler.Greedy() {
		s.picks = argmaxRows(m, len(s.draft)+1, row, spare, s.picks)
	}
	s.verified, s.sampleErr = speculate.Verify(s.draft, func(i int) (int32, error) {
		if len(s.picks) > 0 {
			return s.sampler.SampleArgmax(m, row(i), s.picks[i])
		}
		return s.sampler.SampleLogits(m, row(i))
	})
}

// argmaxRows is the argmax of each of n rows of model m's logits (row(i)), computed on
// up to workers goroutines, into picks' storage.
func argmaxRows(m *llama.Model, n int, row func(int) llama.Logits, workers int, picks []int32) []int32 {
	picks = slices.Grow(picks[:0], n)[:n]
	eachOn(workers, n, func(i int) { picks[i] = row(i).Argmax(m) })
	return picks
}

// takeDraft hands the tokens verifyDraft sampled for slot s to sample one after
// another, as if each came from a step of its own: the accepted drafted tokens join
// cached (their cells are already decoded), an answer that ends stops there, and the
// rejected draft's cells are removed.
func (e *engine) takeDraft(s *slot) {
	j := s.job
	if s.sampleErr != nil {
		e.sample(s)
		return
	}
	toks := s.verified
	accepted := len(toks) - 1
	s.policy.Note(len(s.draft), accepted)
	s.rates.Note(s.src, len(s.draft), accepted)
	e.gate.Note(s.src, len(s.draft), accepted)
	if s.byModel {
		e.drafter.note(len(s.draft), accepted)
	}
	j.mu.Lock()
	j.accepted += accepted
	j.rejected += len(s.draft) - accepted
	j.mu.Unlock()
	for i, tok := range toks {
		s.sampled, s.outIdx = tok, s.first+i
		e.sample(s)
		if s.job != j {
			return // ended: finish and release trimmed the cells
		}
		if i < len(toks)-1 {
			s.cached = append(s.cached, tok)
		}
	}
	s.trimAhead(e.ctx)
}

// trimAhead removes slot s's drafted cells of lctx past its cached tokens, so the
// sequence holds exactly cached (what the prompt cache saves and the next prompt reuses).
func (s *slot) trimAhead(lctx *llama.Context) {
	if !s.ahead {
		return
	}
	s.ahead = false
	if !lctx.SeqRm(s.id, len(s.cached), -1) {
		// Unreachable where speculation is on (no recurrent state); drop the sequence
		// rather than keep cells the tokens do not spell.
		lctx.SeqRm(s.id, -1, -1)
		s.cached = nil
	}
}

// speculationPaths is the /status entry of speculative decoding when it is off for
// the model (specOff).
func speculationPaths(specOff string) []runnerapi.PathOff {
	if specOff == "" {
		return nil
	}
	return []runnerapi.PathOff{{Path: runnerapi.PathSpeculation, Reason: specOff}}
}

// offPaths is the /status entry of speculative decoding when the engines serve the
// model without it.
func (es *engineSet) offPaths() []runnerapi.PathOff {
	if len(es.engs) == 0 {
		return nil
	}
	return speculationPaths(es.engs[0].specOff)
}
