//go:build cgo && !race

package server

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

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
//
// A draft model on the CPU with a q8_0 output matrix takes its greedy tokens from a
// greedy head (llama.GreedyHead): its context stops each decode at the final norm and
// the head scores the vocabulary from the hidden state in one fused pass, where
// llama.cpp would write a row of logits for the runner to scan. A draft sharing a
// target's vocabulary of 128k tokens spent most of its step there.

// drafter is an engine's draft model (engine goroutine only, but for the counts
// /status reads).
type drafter struct {
	log   logr.Logger
	model *llama.Model
	ctx   *llama.Context
	batch *llama.Batch
	// head is the greedy head (nil: the rows' logits are read instead).
	head *llama.GreedyHead
	// held is, per sequence, the tokens whose cells the draft's sequence holds.
	held [][]int32

	path string
	size int64
	// device is where the draft computes (CPU, or the accelerator's name), placement
	// why, times the steps timed at load to choose it.
	device    string
	placement string
	times     draftTimes
	// unused is the draft's slower copy on an accelerator, left to the process exit.
	unused  *draftCandidate
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
// context shaped as the target's lctx, on the device placeDraft chooses: refused
// unless its vocabulary is m's, for a split runner, and for a draft with a recurrent
// state; not loaded for a target that never drafts (a recurrent state:
// speculationOff), which /status reports.
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
	accel := cfg.GPULayers > 0 && len(llama.Devices()) > 0
	plan, err := placeDraft(cfg.DraftDevice, accel, draftTimes{})
	if err != nil {
		return nil, err
	}
	log := cfg.Log.WithName("draft")
	var times draftTimes
	var c, kept *draftCandidate
	if plan.Measure {
		if c, kept, times, err = timeDrafts(path, m, lctx, cfg); err != nil {
			return nil, err
		}
		plan, _ = placeDraft(cfg.DraftDevice, accel, times) // accel and auto: no error
	} else if c, err = loadCandidate(path, m, plan.OnCPU, cfg); err != nil {
		return nil, err
	}
	if c.ctx == nil {
		if c.ctx, err = draftContext(c, lctx, cfg); err != nil {
			c.free()
			kept.free()
			return nil, fmt.Errorf("--draft %s: %w", path, err)
		}
	}
	d := &drafter{log: log, model: c.model, ctx: c.ctx, batch: llama.NewBatch(c.ctx.NBatch()),
		held: make([][]int32, c.ctx.NSeqMax()), path: path, size: st.Size(), head: c.head,
		device: c.device(), placement: plan.Why, times: times, unused: kept}
	if c.head != nil {
		if why := d.checkHead(); why != "" {
			log.Info("Not using the greedy head: it disagrees with the model's logits", "why", why)
			d.head = nil
			c.head.Free()
		} else {
			c.ctx.SetStopAtNorm(true)
		}
	}
	log.Info("Draft model loaded", "device", d.device, "why", plan.Why, "greedyHead", d.head != nil)
	if kept != nil {
		log.Info("The draft's copy on the accelerator stays allocated until the runner exits: "+
			"freeing a context of a loaded accelerator backend crashed it (docs/gpu.md, Open)",
			"deviceBytes", kept.deviceBytes())
	}
	return d, nil
}

// draftContext is candidate c's drafting context (draftParams).
func draftContext(c *draftCandidate, lctx *llama.Context, cfg Config) (*llama.Context, error) {
	return llama.NewContext(c.model, draftParams(c, lctx, cfg))
}

// draftParams shape c's context as the target's lctx: its slots, context per slot, KV
// type and batch, on lctx's thread pool (the engine drafts, then decodes, never both
// at once), stopping at the norm where c has a greedy head.
func draftParams(c *draftCandidate, lctx *llama.Context, cfg Config) llama.ContextParams {
	return llama.ContextParams{
		NCtx: lctx.NCtxSeq() * lctx.NSeqMax(), NBatch: lctx.NBatch(), NSeqMax: lctx.NSeqMax(),
		Threads: cfg.Threads, KVType: cfg.KVType, ThreadsOf: lctx, StopAtNorm: c.head != nil,
	}
}

// draftCandidate is the draft model loaded on one device, with its greedy head on the
// CPU where it has one, and its drafting context once made.
type draftCandidate struct {
	model *llama.Model
	head  *llama.GreedyHead
	ctx   *llama.Context
	onCPU bool
}

// loadCandidate loads the draft model at path on the CPU or as the model m is (its
// accelerator), checking that it may draft for m.
func loadCandidate(path string, m *llama.Model, onCPU bool, cfg Config) (*draftCandidate, error) {
	p := llama.ModelParams{GPULayers: cfg.GPULayers, Mmap: cfg.Mmap, CPUOnly: onCPU}
	if onCPU {
		p.GPULayers = 0
	}
	dm, err := llama.LoadModel(path, p)
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
	c := &draftCandidate{model: dm, onCPU: onCPU}
	if onCPU {
		c.head = greedyHead(cfg.Log.WithName("draft"), path, dm)
		// The head scans on the cores the thread pool leaves idle (its spinning
		// threads would only slow a split head down).
		c.head.SetThreads(runtime.NumCPU() - max(cfg.Threads, 1) + 1)
	}
	return c, nil
}

// device names where c computes: CPU, or the first accelerator ggml registered.
func (c *draftCandidate) device() string {
	if ds := llama.Devices(); !c.onCPU && len(ds) > 0 {
		return ds[0].Name
	}
	return "CPU"
}

// deviceBytes is c's weights, KV cache and compute buffers on accelerators.
func (c *draftCandidate) deviceBytes() int64 {
	if c == nil {
		return 0
	}
	n := int64(c.model.DeviceBytes())
	if c.ctx != nil {
		n += int64(c.ctx.DeviceBytes())
	}
	return n
}

func (c *draftCandidate) free() {
	if c == nil {
		return
	}
	if c.ctx != nil {
		c.ctx.Free()
	}
	c.head.Free()
	c.model.Free()
}

// timeDrafts times a one-token step of the draft at path on the CPU (on a small
// context, then freed) and on the model's accelerator (on its drafting context) and
// returns the faster. The slower copy is freed, but for the accelerator's where an
// accelerator backend is loaded as a library (CUDA), whose contexts crashed the
// runner when freed (docs/gpu.md, Open): that copy is returned as kept, for the
// process exit to free.
func timeDrafts(path string, m *llama.Model, lctx *llama.Context, cfg Config) (use, kept *draftCandidate, t draftTimes, err error) {
	cpu, err := loadCandidate(path, m, true, cfg)
	if err != nil {
		return nil, nil, t, err
	}
	p := draftParams(cpu, lctx, cfg)
	p.NCtx, p.NBatch, p.NSeqMax = 256, 32, 1 // one sequence, enough for stepTime's steps
	small, err := llama.NewContext(cpu.model, p)
	if err == nil {
		t.CPU, err = stepTime(small, cpu)
		small.Free()
	}
	if err != nil {
		cpu.free()
		return nil, nil, t, fmt.Errorf("--draft %s: timing a step on the CPU: %w", path, err)
	}
	accel, err := loadCandidate(path, m, false, cfg)
	if err == nil {
		if accel.ctx, err = draftContext(accel, lctx, cfg); err == nil {
			t.Accel, err = stepTime(accel.ctx, accel)
		}
	}
	if err != nil {
		cpu.free()
		if backendsReport.Loaded() == 0 {
			accel.free()
		}
		return nil, nil, t, fmt.Errorf("--draft %s: timing a step on the accelerator: %w", path, err)
	}
	if t.Accel <= t.CPU {
		cpu.free()
		return accel, nil, t, nil
	}
	if backendsReport.Loaded() > 0 {
		return cpu, accel, t, nil
	}
	accel.free()
	return cpu, nil, t, nil
}

// stepTimes is how many one-token steps stepTime times, after stepWarmup untimed.
const stepTimes, stepWarmup = 16, 4

// stepTime is the median time of a one-token decode and greedy choice of c's model on
// ctx's sequence 0, over headProbe's tokens and the draft's own greedy tokens after
// them; the sequence is emptied after.
func stepTime(ctx *llama.Context, c *draftCandidate) (time.Duration, error) {
	defer ctx.SeqRm(0, -1, -1)
	ctx.SetStopAtNorm(c.head != nil)
	defer ctx.SetStopAtNorm(false)
	b := llama.NewBatch(1)
	defer b.Free()
	toks, err := c.model.Tokenize(headProbe, true, false)
	if err != nil || len(toks) == 0 {
		return 0, fmt.Errorf("the probe could not be tokenized (%d tokens, %v)", len(toks), err)
	}
	took := make([]time.Duration, 0, stepTimes)
	tok := toks[0]
	for pos := 0; pos < stepWarmup+stepTimes; pos++ {
		start := time.Now()
		b.Clear()
		b.Add(tok, pos, 0, true)
		if err := ctx.Decode(b); err != nil {
			return 0, err
		}
		var next int32 // the draft's choice, taken as a draft step takes it
		if c.head != nil {
			next = c.head.Argmax(ctx, 0)
		} else {
			next = ctx.Logits(0).Argmax(c.model)
		}
		if next < 0 {
			return 0, errors.New("the step gave no token")
		}
		if pos >= stepWarmup {
			took = append(took, time.Since(start))
		}
		if tok = next; pos+1 < len(toks) {
			tok = toks[pos+1]
		}
	}
	slices.Sort(took)
	return took[len(took)/2], nil
}

// greedyHead is the draft model dm's greedy head (loaded from path), nil where its
// output matrix is not q8_0 (dm is on the CPU).
func greedyHead(log logr.Logger, path string, dm *llama.Model) *llama.GreedyHead {
	head, err := llama.LoadGreedyHead(path, dm)
	if err != nil {
		log.V(1).Info("No greedy head for the draft model", "why", err.Error())
		return nil
	}
	return head
}

// headProbe is the text checkHead decodes.
const headProbe = "The runner checks that the greedy head chooses what the logits choose, token by token."

// checkHead decodes headProbe with the logits computed and compares, at every token,
// the head's choice with the logits' greedy token: the same token, or one whose logit
// is as large to within rounding (a tie the head's quantization of the hidden state
// may break the other way). It returns what disagreed ("" when nothing did).
func (d *drafter) checkHead() string {
	toks, err := d.model.Tokenize(headProbe, true, false)
	if err != nil || len(toks) < 2 || len(toks) > d.batch.Cap() {
		return fmt.Sprintf("the probe could not be tokenized (%d tokens, %v)", len(toks), err)
	}
	defer d.ctx.SeqRm(0, -1, -1)
	d.batch.Clear()
	for i, tok := range toks {
		d.batch.Add(tok, i, 0, true)
	}
	if err := d.ctx.Decode(d.batch); err != nil {
		return err.Error()
	}
	for i := range toks {
		l := d.ctx.Logits(i)
		want, got := l.Argmax(d.model), d.head.Argmax(d.ctx, i)
		if got == want {
			continue
		}
		if w, g := float64(l.At(d.model, want)), float64(l.At(d.model, got)); got < 0 || g < w-1e-3*max(1, math.Abs(w)) {
			return fmt.Sprintf("at token %d the head chose %d where the logits choose %d", i, got, want)
		}
	}
	return ""
}

// choice is the draft's greedy token at output row i (batch index) of its last decode.
func (d *drafter) choice(i int) int32 {
	if d.head != nil {
		return d.head.Argmax(d.ctx, i)
	}
	return d.ctx.Logits(i).Argmax(d.model)
}

// free releases the draft's context and model.
func (d *drafter) free() {
	if d == nil {
		return
	}
	d.batch.Free()
	d.ctx.Free()
	d.head.Free()
	d.model.Free()
	d.unused.free()
}

// deviceBytes is the draft's weights, KV cache and compute buffers on accelerators.
func (d *drafter) deviceBytes() int64 {
	if d == nil {
		return 0
	}
	return int64(d.model.DeviceBytes()+d.ctx.DeviceBytes()) + d.unused.deviceBytes()
}

// status is the draft's /status entry (nil without one).
func (d *drafter) status() *runnerapi.DraftStatus {
	if d == nil {
		return nil
	}
	return &runnerapi.DraftStatus{Path: d.path, SizeBytes: d.size, Drafted: d.drafted.Load(), Kept: d.kept.Load(),
		HeadBytes: d.head.Bytes(), Device: d.device, Placement: d.placement,
		CPUStepSeconds: d.times.CPU.Seconds(), AcceleratorStepSeconds: d.times.Accel.Seconds()}
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
				a.out = append(a.out, d.choice(a.last))
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
				a.out = append(a.out, d.choice(a.last))
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
