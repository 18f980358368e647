//go:build cgo && !race

package server

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/runner/llama"
	"github.com/macfleet/macfleet/metal/runner/speculate"
)

// A draft model (--draft, docs/speculative-decoding.md): a smaller model of the
// target's vocabulary, loaded in the same runner with a context of its own that has
// one sequence per slot. Where prompt lookup finds no draft for a slot, the draft
// model proposes its greedy next tokens: its sequence is first synced to the slot's
// tokens (the common prefix kept, the rest removed, the missing tokens decoded), then
// it decodes one token at a time, every drafting slot in one batch. A greedy draft is
// deterministic, so the target's sample-then-compare verify stays lossless.

// drafter is an engine's draft model (engine goroutine only, but for the counts
// /status reads).
type drafter struct {
	log   logr.Logger
	model *llama.Model
	ctx   *llama.Context
	batch *llama.Batch
	// held is, per sequence, the tokens whose cells the draft's sequence holds.
	held [][]int32

	path    string
	size    int64
	drafted atomic.Int64
	kept    atomic.Int64
}

// draftAsk is one slot's request for a draft: up to n tokens after hist (its tokens
// so far, the one about to be decoded last); out receives them.
type draftAsk struct {
	seq  int
	hist []int32
	n    int
	out  []int32
	last int // batch index of hist's last token in the decode that holds it
}

// loadDraft loads the draft model at path for target m (nil without a path) with a
// context shaped as the target's lctx: refused unless its vocabulary is m's, for a
// split runner, and for a draft with a recurrent state; not loaded for a target that
// never drafts (a recurrent state: speculationOff), which /status reports.
func loadDraft(path string, m *llama.Model, lctx *llama.Context, cfg Config) (*drafter, error) {
	if path == "" {
		return nil, nil
	}
	if !m.HasKVCells() {
		cfg.Log.Info("Not loading the draft model: speculative decoding is off for this model", "draft", path)
		return nil, nil
	}
	if len(cfg.Split) > 0 {
		return nil, errors.New("--draft: a split runner does not load a draft model; serve the model unsplit")
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--draft: %w", err)
	}
	dm, err := llama.LoadModel(path, llama.ModelParams{GPULayers: cfg.GPULayers, Mmap: cfg.Mmap})
	if err != nil {
		return nil, fmt.Errorf("--draft %s: %w", path, err)
	}
	why := speculate.VocabMismatch(m, dm)
	if why == "" && !dm.HasKVCells() {
		why = "the draft model keeps a recurrent state, which cannot be cut back past the tokens the model rejects"
	}
	if why != "" {
		dm.Free()
		return nil, fmt.Errorf("--draft %s: %s", path, why)
	}
	dctx, err := llama.NewContext(dm, llama.ContextParams{
		NCtx: lctx.NCtxSeq() * lctx.NSeqMax(), NBatch: lctx.NBatch(), NSeqMax: lctx.NSeqMax(),
		Threads: cfg.Threads, KVType: cfg.KVType, ThreadsOf: lctx, // the engine drafts, then decodes
	})
	if err != nil {
		dm.Free()
		return nil, fmt.Errorf("--draft %s: %w", path, err)
	}
	return &drafter{log: cfg.Log.WithName("draft"), model: dm, ctx: dctx, batch: llama.NewBatch(dctx.NBatch()),
		held: make([][]int32, dctx.NSeqMax()), path: path, size: st.Size()}, nil
}

// free releases the draft's context and model.
func (d *drafter) free() {
	if d == nil {
		return
	}
	d.batch.Free()
	d.ctx.Free()
	d.model.Free()
}

// deviceBytes is the draft's weights, KV cache and compute buffers on accelerators.
func (d *drafter) deviceBytes() int64 {
	if d == nil {
		return 0
	}
	return int64(d.model.DeviceBytes() + d.ctx.DeviceBytes())
}

// status is the draft's /status entry (nil without one).
func (d *drafter) status() *runnerapi.DraftStatus {
	if d == nil {
		return nil
	}
	return &runnerapi.DraftStatus{Path: d.path, SizeBytes: d.size, Drafted: d.drafted.Load(), Kept: d.kept.Load()}
}

// note counts a verified draft of the model's: drafted tokens, kept of them.
func (d *drafter) note(drafted, kept int) {
	d.drafted.Add(int64(drafted))
	d.kept.Add(int64(kept))
}

// draft fills each ask's out with up to n greedy tokens of the draft model (fewer
// after an end of generation). On a failed decode the asks get nothing and the
// draft's sequences are dropped (they are synced again next time).
func (d *drafter) draft(asks []*draftAsk) {
	if len(asks) == 0 {
		return
	}
	if err := d.sync(asks); err != nil {
		d.reset(err, asks)
		return
	}
	for {
		d.batch.Clear()
		for _, a := range asks {
			k := len(a.out)
			if k == 0 || k >= a.n || d.model.IsEOG(a.out[k-1]) {
				continue
			}
			a.last = d.batch.Add(a.out[k-1], len(a.hist)+k-1, a.seq, true)
			d.held[a.seq] = append(d.held[a.seq], a.out[k-1])
		}
		if d.batch.N() == 0 {
			return
		}
		if err := d.ctx.Decode(d.batch); err != nil {
			d.reset(err, asks)
			return
		}
		for _, a := range asks {
			if k := len(a.out); k > 0 && k < a.n && !d.model.IsEOG(a.out[k-1]) {
				a.out = append(a.out, d.ctx.Logits(a.last).Argmax(d.model))
			}
		}
	}
}

// sync brings each ask's draft sequence to its hist, in batches: the common prefix is
// kept (but for hist's last token, whose row the first draft token is read from), the
// rest removed, hist's rest decoded; each ask's first greedy token goes in out.
func (d *drafter) sync(asks []*draftAsk) error {
	next := make([]int, len(asks)) // the next token of hist to decode
	for i, a := range asks {
		a.out, a.last = a.out[:0], -1
		keep := min(commonPrefix(d.held[a.seq], a.hist), len(a.hist)-1)
		if !d.ctx.SeqRm(a.seq, keep, -1) {
			d.ctx.SeqRm(a.seq, -1, -1)
			keep = 0
		}
		d.held[a.seq] = append(d.held[a.seq][:keep], a.hist[keep:]...)
		next[i] = keep
	}
	for pending := true; pending; {
		d.batch.Clear()
		pending = false
		for i, a := range asks {
			for next[i] < len(a.hist) && d.batch.N() < d.batch.Cap() {
				last := next[i] == len(a.hist)-1
				idx := d.batch.Add(a.hist[next[i]], next[i], a.seq, last)
				if last {
					a.last = idx
				}
				next[i]++
			}
			pending = pending || next[i] < len(a.hist)
		}
		if err := d.ctx.Decode(d.batch); err != nil {
			return err
		}
		for _, a := range asks {
			if a.last >= 0 {
				a.out = append(a.out, d.ctx.Logits(a.last).Argmax(d.model))
				a.last = -1
			}
		}
	}
	return nil
}

// reset drops every draft sequence, and the asks' drafts, after a failed decode.
func (d *drafter) reset(err error, asks []*draftAsk) {
	d.log.Error(err, "Drafting failed; the draft's sequences are dropped")
	for _, a := range asks {
		a.out = a.out[:0]
	}
	for seq := range d.held {
		d.ctx.SeqRm(seq, -1, -1)
		d.held[seq] = nil
	}
}
