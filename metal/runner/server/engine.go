//go:build cgo && !race

package server

import (
	"math/rand/v2"
	"os"
	"runtime"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/runner/llama"
	"github.com/macfleet/macfleet/metal/runner/speculate"
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
	slots           slotSet
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
	// rate is the measured decode time per batch token, what prefilling a token
	// costs: it bounds a wait for an in-flight prefix (engine goroutine only).
	rate prefillRate
	// specOff is why the engine never drafts ("" when it may: engine_speculate.go).
	specOff string
	// drafter is the draft model (draft.go; nil: none), asks the scratch of its
	// requests in a step. Set before run starts.
	drafter *drafter
	asks    []*draftAsk
	// gate decides whether drafts pay, from the engine's own step times; mixed: this
	// step's batch holds a prefill, whose time is not a decode step's.
	gate  speculate.Gate
	mixed bool
	// fill is the fillers beside the busy slots (engine_fillers.go).
	fill fillerSet

	// queue is what the engine shares with the handlers (engine_queue.go).
	queue *jobQueue
	cmds  chan func()
	quit  chan struct{}
	done  chan struct{}
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
	// Speculative decoding (engine_speculate.go): the job's drafting policy, this
	// step's draft (decoded after next), its rows of logits, the tokens its verify
	// sampled, and whether the sequence holds drafted cells past cached.
	policy   speculate.Policy
	rates    speculate.Rates  // the job's shares of drafted tokens kept, by source (the gate's)
	src      speculate.Source // where this step's draft came from
	draft    []int32
	rows     []llama.Logits
	picks    []int32 // a greedy verify's argmax of each row (argmaxRows)
	verified []int32
	ahead    bool
	// byModel: this step's draft is the draft model's, which ask requested.
	byModel bool
	ask     draftAsk
}

// slotSet is an engine's slots, indexed by sequence id (engine goroutine only).
type slotSet []*slot

// anyBusy reports whether a slot holds a job.
func (ss slotSet) anyBusy() bool {
	for _, s := range ss {
		if s.job != nil {
			return true
		}
	}
	return false
}

// anyFree reports whether a slot is free.
func (ss slotSet) anyFree() bool {
	for _, s := range ss {
		if s.job == nil {
			return true
		}
	}
	return false
}

// figures are what /status reports of the slots: those holding a job, and the KV
// cells holding tokens.
func (ss slotSet) figures() (busy, kvUsed int) {
	for _, s := range ss {
		if s.job != nil {
			busy++
		}
		kvUsed += len(s.cached)
	}
	return busy, kvUsed
}

func newEngine(log logr.Logger, model *llama.Model, ctx *llama.Context, guard func(int) *runnerapi.Error) *engine {
	e := &engine{
		log: log, model: model, ctx: ctx,
		nBatch: ctx.NBatch(), nCtxSeq: ctx.NCtxSeq(),
		batch: llama.NewBatch(ctx.NBatch()),
		guard: guard,
		queue: newJobQueue(),
		cmds:  make(chan func()),
		quit:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	arch, _ := model.Meta("general.architecture")
	e.specOff = speculationOff(arch, model.IsRecurrent(), model.IsHybrid())
	env := os.Getenv(envFillers)
	if env != "" && env != "0" && env != "1" {
		log.Info("Ignoring "+envFillers+": want 1 (on) or 0 (off)", "value", env)
	}
	e.fill.on = fillersOn(env, model.DeviceBytes(), modelShape{params: model.NParams(), vocab: uint64(model.NVocab()), embd: uint64(model.NEmbd())})
	for i := range ctx.NSeqMax() {
		e.slots = append(e.slots, &slot{id: i})
	}
	return e
}

// close refuses new jobs with err, aborts the current ones and waits for the loop to
// exit.
func (e *engine) close(err *runnerapi.Error) {
	open := e.queue.close(err)
	e.queue.abortAll(err)
	if open {
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

func (e *engine) run() {
	defer close(e.done)
	// One thread for the context's decodes: a split runner's link figures are the
	// thread's (linkMeter).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for {
		e.reap()
		e.admit()
		e.queue.publish(e.slots.figures())
		if !e.slots.anyBusy() {
			select {
			case <-e.queue.wake:
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

// shutdown ends the queued jobs and those in slots with the close error.
func (e *engine) shutdown() {
	err := e.queue.drain()
	for _, s := range e.slots {
		if s.job != nil {
			s.job.fail(err)
			e.release(s)
		}
	}
	e.queue.publish(e.slots.figures())
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
	s.trimAhead(e.ctx)
	if s.sampler != nil {
		s.sampler.Free()
		s.sampler = nil
	}
	s.job, s.phase, s.stream, s.emb = nil, phaseIdle, nil, nil
	e.tick++
	s.lastUsed = e.tick
	e.queue.letGo(j)
}

// admit drops queued jobs that ended (client gone, aborted) and moves the others into
// free slots in arrival order, choosing for each the free slot whose cached tokens
// share the longest prefix with its prompt.
func (e *engine) admit() {
	e.queue.prune()
	now := time.Now()
	for i := 0; ; {
		j := e.queue.at(i)
		if j == nil || !e.slots.anyFree() {
			return
		}
		// A job waiting for a prefix another slot is prefilling stays queued; the
		// jobs behind it may take the free slots meanwhile.
		if e.holdOrShare(j, now) {
			i++
			continue
		}
		s, keep := e.slots.pick(j)
		if s == nil {
			return
		}
		e.queue.take(i)
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

// pick is the free slot for j and how many of its prompt tokens that slot keeps:
// the one with the longest reusable prefix when that is at least slotReuseMin tokens
// (ties to the least recently used), else the free slot of the lowest id, which keeps
// the busy slots in one block. A cached state deeper than every slot's prefix is
// restored into the lowest free slot as well.
func (ss slotSet) pick(j *job) (*slot, int) {
	var best, low *slot
	bestKeep := -1
	for _, s := range ss {
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
	keep = j.imageFloor(keep)
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
	s.policy, s.rates = speculate.NewPolicy(speculate.DefaultMax), e.gate.Prior()
	for _, tok := range j.held { // a continued answer's text its client never got
		if text, _ := s.stream.Push(outputPiece(e.model, j, tok)); text != "" {
			j.emit(text, noToken, nil)
		}
	}
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
	e.rate.note(took, b.N()-len(e.fill.step))
	if e.link != nil {
		e.link.meterStep(before, took, e.slots)
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
