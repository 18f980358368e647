//go:build cgo && !race

package server

import (
	"fmt"
	"sync"

	apiengine "github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/runner/llama"
)

// newContexts creates the llama contexts the slots are divided among: one, or
// --split-pipeline of them on a split runner (pipelineSlots).
func (s *Server) newContexts(m *llama.Model) error {
	cfg := s.cfg
	ctxTotal := cfg.Ctx
	if ctxTotal <= 0 {
		ctxTotal = m.NCtxTrain() * cfg.Parallel
	}
	groups, err := pipelineSlots(cfg.Parallel, max(cfg.SplitPipeline, 1), len(s.split.devs) > 0)
	if err != nil {
		return err
	}
	// With every layer on an accelerator the CPU threads only spin beside the sampling.
	offloaded := len(s.split.devs) == 0 && cfg.GPULayers > m.NLayer() && len(llama.Devices()) > 0
	threads := apiengine.StepThreads(cfg.Threads, offloaded)
	if threads != cfg.Threads {
		s.log.Info("Every layer is on an accelerator: fewer CPU threads", "threads", threads, "requested", cfg.Threads)
	}
	for _, n := range groups {
		// Every slot gets the context it would get in one context.
		nctx := ctxTotal
		if len(groups) > 1 {
			nctx = ctxTotal / cfg.Parallel * n
		}
		lctx, err := llama.NewContext(m, llama.ContextParams{
			NCtx: nctx, NBatch: cfg.Batch, NSeqMax: n, Threads: threads,
			KVType: cfg.KVType, Embeddings: true,
		})
		if err != nil {
			return err
		}
		s.lctxs = append(s.lctxs, lctx)
		if lctx.NBatch() < n {
			return fmt.Errorf("n_batch %d is below the %d slots", lctx.NBatch(), n)
		}
	}
	s.nSeqCtx = groups[0]
	return nil
}

// newEngineSet makes an engine for each context.
func (s *Server) newEngineSet(m *llama.Model) *engineSet {
	es := &engineSet{}
	for i, c := range s.lctxs {
		log := s.log.WithName("engine")
		if len(s.lctxs) > 1 {
			log = log.WithValues("context", i)
		}
		e := newEngine(log, m, c, s.mem.guard)
		if len(s.split.devs) > 0 {
			e.linkLost = func() *runnerapi.Error {
				if err := s.split.lostLink(); err != nil {
					return s.run.lose(err)
				}
				return nil
			}
			e.link = newLinkMeter(s.split.devs)
		}
		es.engs = append(es.engs, e)
	}
	return es
}

// engineSet is the runner's engines: one, or on a pipelined split runner one per
// llama context (pipeline.go), each with its own slots, KV cache and goroutine. The
// prompt cache's tiers and the prefix table are shared; a slot's cached prefix and
// an in-flight prefix are reused within its engine only.
type engineSet struct {
	engs []*engine
	// mu makes choosing an engine and queueing on it one step, so that concurrent
	// requests do not all pick the same free slot.
	mu sync.Mutex
}

func (es *engineSet) start() {
	for _, e := range es.engs {
		go e.run()
	}
}

// submit queues j on the engine with the most free slots.
func (es *engineSet) submit(j *job) *runnerapi.Error {
	if len(es.engs) == 1 {
		return es.engs[0].queue.submit(j)
	}
	es.mu.Lock()
	defer es.mu.Unlock()
	loads := make([]engineLoad, len(es.engs))
	for i, e := range es.engs {
		loads[i] = engineLoad{slots: len(e.slots), jobs: e.queue.live()}
	}
	return es.engs[pickEngine(loads)].queue.submit(j)
}

// slotCount is the slots of every engine: a request's choices are spread over them.
func (es *engineSet) slotCount() int {
	n := 0
	for _, e := range es.engs {
		n += len(e.slots)
	}
	return n
}

func (es *engineSet) abortAll(err *runnerapi.Error) int {
	n := 0
	for _, e := range es.engs {
		n += e.queue.abortAll(err)
	}
	return n
}

func (es *engineSet) close(err *runnerapi.Error) {
	for _, e := range es.engs {
		e.close(err)
	}
}

// clearIdle drops the idle slots' cached prefixes on every engine.
func (es *engineSet) clearIdle() int {
	n := 0
	for _, e := range es.engs {
		e.do(func() { n += e.clearIdle() })
	}
	return n
}

func (es *engineSet) stats() (busy, kvUsed, requests int) {
	for _, e := range es.engs {
		b, k, r := e.queue.stats()
		busy, kvUsed, requests = busy+b, kvUsed+k, requests+r
	}
	return busy, kvUsed, requests
}

// fillers is the filler tokens the engines decoded so far and the steps whose
// drafts they padded (engine_fillers.go).
func (es *engineSet) fillers() (tokens, padded int64) {
	for _, e := range es.engs {
		tokens += e.fill.filled.Load()
		padded += e.fill.padded.Load()
	}
	return tokens, padded
}

// headSeconds is the runner's own compute time so far on a split runner.
func (es *engineSet) headSeconds() float64 {
	t := 0.0
	for _, e := range es.engs {
		t += e.link.headSeconds()
	}
	return t
}
