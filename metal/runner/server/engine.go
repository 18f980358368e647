//go:build cgo && !race

package server

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/runner/llama"
	"github.com/macfleet/macfleet/metal/runner/textstream"
)

// embedChunk bounds the tokens of an embedding input decoded per step (see
// runnerapi.EmbedChunk).
const embedChunk = runnerapi.EmbedChunk

// engine owns the llama.cpp context and runs the continuous-batching loop on one
// goroutine: every step it decodes one llama_batch holding the next token of every
// generating slot plus prefill chunks of the others, bounded by n_batch. Requests join
// between steps. Nothing else touches the context.
type engine struct {
	log   logr.Logger
	model *llama.Model
	ctx   *llama.Context
	batch *llama.Batch

	nBatch, nCtxSeq int
	slots           []*slot
	sampling        []*slot        // scratch: the slots that sample in a step
	rows            []llama.Logits // scratch: their rows of logits
	tick            uint64
	// guard refuses a prefill chunk of n tokens that would exceed the ceiling.
	guard func(n int) *runnerapi.Error
	// pc is the prompt cache (nil: none). Set before run starts.
	pc *promptCache
	// linkLost, for a split model, returns the error of a lost split worker (and fails
	// the runner), nil while every link works. Set before run starts.
	linkLost func() *runnerapi.Error
	// link measures a split model's steps (nil: not split). Set before run starts.
	link *linkMeter
	// perToken is the measured decode time per batch token (EWMA), what prefilling a
	// token costs: it bounds a wait for an in-flight prefix (engine goroutine only).
	perToken time.Duration

	wake chan struct{}
	cmds chan func()
	quit chan struct{}
	done chan struct{}

	mu       sync.Mutex // guards the fields below
	pending  []*job
	active   map[*job]struct{} // pending or in a slot, until the engine lets go of it
	closed   bool
	closeErr *runnerapi.Error
	busy     int
	kvUsed   int
}

type slotPhase int

const (
	phaseIdle slotPhase = iota
	phasePrefill
	phaseGenerate
)

// slot is one sequence of the context (its id is the sequence id). cached mirrors the
// tokens whose KV the sequence holds at positions 0..len-1; it outlives the job so the
// next prompt with the same prefix skips that part of the prefill.
type slot struct {
	id     int
	cached []int32
	// partition is the prompt cache partition of the job that filled cached: only a
	// job of the same partition reuses them.
	partition string
	lastUsed  uint64
	admitted  uint64

	job     *job
	phase   slotPhase
	fed     int // prompt tokens in the cache
	sampler *llama.Sampler
	stream  *textstream.Stream
	next    int32 // sampled token to decode next
	emb     []float32

	take   int // tokens in this step's batch
	first  int // batch index of the first of them
	outIdx int // batch index whose logits are sampled, -1 for none
	// The token sampled from this step's logits (sampleAll), or why none was.
	sampled   int32
	sampleErr error
}

func newEngine(log logr.Logger, model *llama.Model, ctx *llama.Context, guard func(int) *runnerapi.Error) *engine {
	e := &engine{
		log: log, model: model, ctx: ctx,
		nBatch: ctx.NBatch(), nCtxSeq: ctx.NCtxSeq(),
		batch:  llama.NewBatch(ctx.NBatch()),
		guard:  guard,
		wake:   make(chan struct{}, 1),
		cmds:   make(chan func()),
		quit:   make(chan struct{}),
		done:   make(chan struct{}),
		active: map[*job]struct{}{},
	}
	for i := range ctx.NSeqMax() {
		e.slots = append(e.slots, &slot{id: i})
	}
	return e
}

// submit queues a job; it fails once the engine is closing.
func (e *engine) submit(j *job) *runnerapi.Error {
	e.mu.Lock()
	if e.closed {
		err := e.closeErr
		e.mu.Unlock()
		return err
	}
	e.pending = append(e.pending, j)
	e.active[j] = struct{}{}
	e.mu.Unlock()
	e.poke()
	return nil
}

func (e *engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// abortAll ends every job with err at once (their handlers send it); the engine frees
// their slots at its next step. It returns how many jobs it ended.
func (e *engine) abortAll(err *runnerapi.Error) int {
	e.mu.Lock()
	n := 0
	for j := range e.active {
		if j.fail(err) {
			n++
		}
	}
	e.mu.Unlock()
	e.poke()
	return n
}

// close refuses new jobs with err, aborts the current ones and waits for the loop to
// exit.
func (e *engine) close(err *runnerapi.Error) {
	e.mu.Lock()
	already := e.closed
	e.closed, e.closeErr = true, err
	e.mu.Unlock()
	e.abortAll(err)
	if !already {
		close(e.quit)
	}
	<-e.done
	e.batch.Free()
}

// do runs fn on the engine goroutine between steps and waits for it.
func (e *engine) do(fn func()) bool {
	ran := make(chan struct{})
	select {
	case e.cmds <- func() { fn(); close(ran) }:
		<-ran
		return true
	case <-e.done:
		return false
	}
}

// stats returns the slots in use, the KV cells holding tokens and the live jobs.
func (e *engine) stats() (busy, kvUsed, requests int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.busy, e.kvUsed, len(e.active)
}

func (e *engine) run() {
	defer close(e.done)
	// One thread for the context's decodes: a split runner's link figures are the
	// thread's (linkMeter).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for {
		e.reap()
		e.admit()
		e.publish()
		if !e.anyBusy() {
			select {
			case <-e.wake:
			case fn := <-e.cmds:
				fn()
			case <-e.quit:
				e.shutdown()
				return
			}
			continue
		}
		select {
		case fn := <-e.cmds:
			fn()
		case <-e.quit:
			e.shutdown()
			return
		default:
		}
		e.step()
	}
}

func (e *engine) shutdown() {
	for _, s := range e.slots {
		if s.job != nil {
			s.job.fail(e.closeErr)
			e.release(s)
		}
	}
	e.mu.Lock()
	for _, j := range e.pending {
		j.fail(e.closeErr)
		delete(e.active, j)
	}
	e.pending = nil
	e.mu.Unlock()
	e.publish()
}

func (e *engine) anyBusy() bool {
	for _, s := range e.slots {
		if s.job != nil {
			return true
		}
	}
	return false
}

// reap frees the slots of jobs that ended outside the engine (client gone, aborted).
func (e *engine) reap() {
	for _, s := range e.slots {
		if s.job != nil && s.job.finished() {
			e.release(s)
		}
	}
}

func (e *engine) release(s *slot) {
	j := s.job
	if s.sampler != nil {
		s.sampler.Free()
		s.sampler = nil
	}
	s.job, s.phase, s.stream, s.emb = nil, phaseIdle, nil, nil
	e.tick++
	s.lastUsed = e.tick
	e.mu.Lock()
	delete(e.active, j)
	e.mu.Unlock()
}

// publish refreshes the figures /status reports.
func (e *engine) publish() {
	busy, kv := 0, 0
	for _, s := range e.slots {
		if s.job != nil {
			busy++
		}
		kv += len(s.cached)
	}
	e.mu.Lock()
	e.busy, e.kvUsed = busy, kv
	e.mu.Unlock()
}

// admit drops queued jobs that ended (client gone, aborted) and moves the others into
// free slots in arrival order, choosing for each the free slot whose cached tokens
// share the longest prefix with its prompt.
func (e *engine) admit() {
	e.mu.Lock()
	live := e.pending[:0]
	for _, j := range e.pending {
		if j.finished() {
			delete(e.active, j)
			continue
		}
		live = append(live, j)
	}
	clear(e.pending[len(live):])
	e.pending = live
	e.mu.Unlock()
	now := time.Now()
	for i := 0; ; {
		e.mu.Lock()
		if i >= len(e.pending) {
			e.mu.Unlock()
			return
		}
		j := e.pending[i]
		e.mu.Unlock()
		if !e.anyFree() {
			return
		}
		// A job waiting for a prefix another slot is prefilling stays queued; the
		// jobs behind it may take the free slots meanwhile.
		if e.holdOrShare(j, now) {
			i++
			continue
		}
		e.mu.Lock()
		s, keep := e.pickSlot(j)
		if s == nil {
			e.mu.Unlock()
			return
		}
		e.pending = slices.Delete(e.pending, i, i+1)
		e.mu.Unlock()
		e.assign(s, j, keep)
	}
}

// slotReuseMin is the shortest cached prefix worth taking a job out of the lowest
// free slot for. llama.cpp decodes only slots of consecutive ids in one pass over the
// weights (each slot has its own KV cache): busy slots scattered over the ids cost a
// pass per block. Measured on an H100 with 16 streams of the 8B-shaped model: one
// block 933 tok/s, two 708, sixteen 217 (docs/gpu-runs/perf-notes.txt). Every used
// slot holds the chat template's first tokens, so without a bound any earlier job
// draws the next one away from the low ids.
const slotReuseMin = 32

// pickSlot is the free slot for j and how many of its prompt tokens that slot keeps:
// the one with the longest reusable prefix when that is at least slotReuseMin tokens
// (ties to the least recently used), else the free slot of the lowest id, which keeps
// the busy slots in one block. A cached state deeper than every slot's prefix is
// restored into the lowest free slot as well.
func (e *engine) pickSlot(j *job) (*slot, int) {
	var best, low *slot
	bestKeep := -1
	for _, s := range e.slots {
		if s.job != nil {
			continue
		}
		if low == nil || s.id < low.id {
			low = s
		}
		keep := reusable(s, j)
		if keep > bestKeep || (keep == bestKeep && s.lastUsed < best.lastUsed) {
			best, bestKeep = s, keep
		}
	}
	if low == nil {
		return nil, -1
	}
	if r := j.restore; (r != nil && r.n > bestKeep) || bestKeep < slotReuseMin {
		return low, reusable(low, j)
	}
	return best, bestKeep
}

// reusable is how many of j's prompt tokens s already holds: none for an embedding,
// or for a job of another prompt cache partition.
func reusable(s *slot, j *job) int {
	if j.embed || s.partition != j.partition {
		return 0
	}
	return commonPrefix(s.cached, j.tokens)
}

func (e *engine) assign(s *slot, j *job, keep int) {
	// A generation must decode at least its last prompt token to get logits.
	if !j.embed && keep >= len(j.tokens) {
		keep = len(j.tokens) - 1
	}
	admitted := time.Now()
	var restoreTook time.Duration
	if r := j.restore; r != nil && !j.embed && r.n > keep && r.n < len(j.tokens) {
		keep = e.restore(s, r)
		restoreTook = time.Since(admitted)
	}
	j.restore = nil // the state may be large: let it go
	if keep < len(s.cached) {
		if !e.ctx.SeqRm(s.id, keep, -1) {
			e.ctx.SeqRm(s.id, -1, -1)
			keep = 0
		}
		s.cached = s.cached[:keep]
	}
	e.tick++
	s.job, s.phase, s.fed, s.admitted = j, phasePrefill, keep, e.tick
	s.partition = j.partition
	j.mu.Lock()
	j.cached = keep
	j.times.admitted, j.times.restoreTook = admitted, restoreTook
	if restoreTook > 0 {
		j.times.restored = keep
	}
	j.mu.Unlock()
	if j.embed {
		s.emb = make([]float32, e.model.NEmbd())
		return
	}
	o := j.opts
	seed := o.Seed
	if !o.SeedSet {
		seed = rand.Uint32()
	}
	s.sampler = llama.NewSampler(llama.SamplerParams{
		Temperature: o.Temperature, TopK: o.TopK, TopP: o.TopP, MinP: o.MinP, Seed: seed,
		PresencePenalty: o.PresencePenalty, FrequencyPenalty: o.FrequencyPenalty,
		PenaltyLastN: e.nCtxSeq,
	})
	if o.Grammar != "" {
		if err := s.sampler.Constrain(e.model, o.Grammar, o.GrammarTriggers); err != nil {
			// The handler checked the grammar; this is not the client's fault.
			j.fail(runnerapi.Internal("constraining the output: %v", err))
			e.release(s)
			return
		}
		if err := s.sampler.Advance(e.model, j.grammarPrefix); err != nil { // the handler checked it too
			j.fail(runnerapi.Internal("advancing the grammar past the continued answer: %v", err))
			e.release(s)
			return
		}
	}
	s.stream = textstream.New(o.Stop)
}

// decode runs the step's batch; on failure it fails the step's jobs and returns false.
func (e *engine) decode(b *llama.Batch) bool {
	start := time.Now()
	var before linkFigures
	if e.link != nil {
		before = e.link.totals()
	}
	err := e.ctx.Decode(b)
	if e.linkLost != nil {
		// The workers' answers are all read before the link is checked below.
		e.ctx.Synchronize()
	}
	took := time.Since(start)
	e.notePerToken(took, b.N())
	if e.link != nil {
		e.meterStep(before, took)
	}
	// A split worker lost in the middle of a step may leave a decode that looks
	// successful over zeroed activations: the link's state decides, not the result.
	if e.linkLost != nil {
		if lerr := e.linkLost(); lerr != nil {
			e.log.Error(err, "Decode failed: a split worker is lost", "tokens", b.N())
			e.failStep(lerr)
			return false
		}
	}
	if err != nil {
		e.log.Error(err, "Decode failed", "tokens", b.N())
		e.failStep(runnerapi.Internal("decode failed: %v", err))
		return false
	}
	return true
}

// failStep ends every job of the failed batch and drops their sequences' KV, whose
// state is unknown after a failed decode.
func (e *engine) failStep(err *runnerapi.Error) {
	for _, s := range e.slots {
		if s.take == 0 {
			continue
		}
		s.job.fail(err)
		e.ctx.SeqRm(s.id, -1, -1)
		s.cached = nil
		e.release(s)
	}
}

func sortByAdmission(ss []*slot) {
	for i := 1; i < len(ss); i++ {
		for k := i; k > 0 && ss[k].admitted < ss[k-1].admitted; k-- {
			ss[k], ss[k-1] = ss[k-1], ss[k]
		}
	}
}
