//go:build cgo && !race

package server

import (
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/runner/llama"
	"github.com/macfleet/macfleet/metal/runner/textstream"
)

// What a generating slot does with a step's logits: sample the next token, report
// its log-probabilities, and finish the answer (stop, length, embedding).

// sampleAll samples the next token of each slot in ss from this step's logits, then
// emits each in turn. The samplers run side by side, one goroutine a core: each is its
// slot's own and reads its own row, and a sampled token costs a pass or more over the
// vocabulary (about 0.3 ms for 32k tokens at a temperature), so one after another at
// 64 streams they took 70% as long as the step's decode on an NVIDIA H100
// (docs/gpu-runs/profile-notes.md). Rows are read first, here: reading one waits for
// the decode and must not race.
func (e *engine) sampleAll(ss []*slot) {
	rows := e.rows[:0]
	for _, s := range ss {
		rows = append(rows, e.ctx.Logits(s.outIdx))
	}
	e.rows = rows
	readDraftRows(e.ctx, ss)
	spare := runtime.GOMAXPROCS(0) / max(len(ss), 1) // cores for each slot's own rows
	one := func(i int) {
		if len(ss[i].draft) > 0 {
			ss[i].verifyDraft(e.model, rows[i], spare)
			return
		}
		ss[i].sampled, ss[i].sampleErr = ss[i].sampler.SampleLogits(e.model, rows[i])
	}
	eachOn(runtime.GOMAXPROCS(0), len(ss), one)
	for _, s := range ss {
		if len(s.draft) > 0 {
			e.takeDraft(s)
		} else {
			e.sample(s)
		}
	}
}

// eachOn calls fn(i) for every i below n, on up to workers goroutines taking the next
// i in turn (on the caller's alone with one worker or one i).
func eachOn(workers, n int, fn func(i int)) {
	if workers = min(workers, n); workers <= 1 {
		for i := range n {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				fn(i)
			}
		})
	}
	wg.Wait()
}

// sample takes the token sampled for a generating slot (sampleAll) and decides
// whether the generation ends.
func (e *engine) sample(s *slot) {
	j := s.job
	tok, err := s.sampled, s.sampleErr
	if err != nil {
		j.fail(runnerapi.Internal("sampling: %v", err))
		e.release(s)
		return
	}
	if e.model.IsEOG(tok) {
		j.emit(s.stream.Flush(), tok, nil)
		e.finish(s, "stop")
		return
	}
	piece := outputPiece(e.model, j, tok)
	var lp *runnerapi.TokenLogprob
	if j.opts.Logprobs {
		lp = logprob(e.ctx, e.model, s.outIdx, tok, j.opts.TopLogprobs)
	}
	text, stopped := s.stream.Push(piece)
	j.emit(text, tok, lp)
	j.mu.Lock()
	generated := j.generated
	j.mu.Unlock()
	switch {
	case stopped:
		j.mu.Lock()
		j.stopSeq = s.stream.Matched()
		j.mu.Unlock()
		e.finish(s, "stop")
	case j.opts.MaxTokens > 0 && generated >= j.opts.MaxTokens,
		len(s.cached) >= e.nCtxSeq: // no cell left to decode the token into
		j.emit(s.stream.Flush(), noToken, nil)
		e.finish(s, "length")
	default:
		s.next = tok
	}
}

// outputPiece is the text generated token tok of model m adds to j's output: its
// piece, a marker's text the output parser needs, or nothing for another control token.
func outputPiece(m *llama.Model, j *job, tok int32) []byte {
	if p, ok := j.special[tok]; ok {
		return p
	}
	return m.Piece(tok)
}

// spend ends job j, a continued answer that has all of its max_tokens, as the answer
// would have ended: finish reason length, with the text of its held tokens (whose
// text its client never got) flushed.
func spend(m *llama.Model, j *job) {
	ts := textstream.New(j.opts.Stop)
	var text strings.Builder
	for _, tok := range j.held {
		out, _ := ts.Push(outputPiece(m, j, tok))
		text.WriteString(out)
	}
	if text.WriteString(ts.Flush()); text.Len() > 0 {
		j.emit(text.String(), noToken, nil)
	}
	j.complete("length")
}

// logprob is the log-probability of tok at output row i of lctx with the top k
// alternatives.
func logprob(lctx *llama.Context, m *llama.Model, i int, tok int32, k int) *runnerapi.TokenLogprob {
	lp, top := lctx.Logprobs(i, tok, k)
	text, b := tokenBytes(m, tok)
	out := &runnerapi.TokenLogprob{Token: text, Logprob: float64(lp), Bytes: b, TopLogprobs: make([]runnerapi.TopLogprob, len(top))}
	for i, t := range top {
		text, b := tokenBytes(m, t.Token)
		out.TopLogprobs[i] = runnerapi.TopLogprob{Token: text, Logprob: float64(t.Logprob), Bytes: b}
	}
	return out
}

// tokenBytes is a token's text (a control token's own text) and its bytes.
func tokenBytes(m *llama.Model, tok int32) (string, []int) {
	p := m.Piece(tok)
	if len(p) == 0 {
		p = []byte(m.TokenText(tok))
	}
	b := make([]int, len(p))
	for i, c := range p {
		b[i] = int(c)
	}
	return string(p), b
}

func (e *engine) finish(s *slot, reason string) {
	s.trimAhead(e.ctx) // the state saved holds cached's tokens alone
	// Saved before the job completes, so a client's next turn, sent as soon as this
	// answer ends, finds the state.
	if !s.job.embed {
		e.saveState(s)
	}
	s.job.complete(reason)
	e.release(s)
}

func (e *engine) finishEmbedding(s *slot) {
	v := s.emb
	n := float32(len(s.job.tokens))
	var norm float64
	for i := range v {
		v[i] /= n
		norm += float64(v[i]) * float64(v[i])
	}
	if norm > 0 {
		inv := float32(1 / math.Sqrt(norm))
		for i := range v {
			v[i] *= inv
		}
	}
	j := s.job
	j.mu.Lock()
	j.embedding = v
	j.mu.Unlock()
	e.finish(s, "stop")
}
