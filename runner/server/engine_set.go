//go:build cgo && !race

package server

import (
	"sync"

	"github.com/macfleet/macfleet/api/runnerapi"
)

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
		return es.engs[0].submit(j)
	}
	es.mu.Lock()
	defer es.mu.Unlock()
	loads := make([]engineLoad, len(es.engs))
	for i, e := range es.engs {
		e.mu.Lock()
		loads[i] = engineLoad{slots: len(e.slots), jobs: len(e.active)}
		e.mu.Unlock()
	}
	return es.engs[pickEngine(loads)].submit(j)
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
		n += e.abortAll(err)
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
		b, k, r := e.stats()
		busy, kvUsed, requests = busy+b, kvUsed+k, requests+r
	}
	return busy, kvUsed, requests
}

// headSeconds is the runner's own compute time so far on a split runner.
func (es *engineSet) headSeconds() float64 {
	t := 0.0
	for _, e := range es.engs {
		t += e.link.headSeconds()
	}
	return t
}
