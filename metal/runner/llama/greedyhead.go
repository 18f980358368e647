//go:build cgo && !race

package llama

// A greedy head (greedyhead.cpp): a draft model's greedy tokens from its rows' hidden
// states, on a context that stops each decode at the final norm (ContextParams
// StopAtNorm), so that the output projection and its rows of logits are never
// computed.

/*
#include <stdlib.h>
#include "llama.h"
#include "greedyhead.h"
*/
import "C"

import (
	"errors"
	"sync"
	"unsafe"
)

// GreedyHead holds a copy of a model's q8_0 output matrix and gives the greedy token
// of a hidden state (Argmax). Its methods are for one goroutine at a time.
type GreedyHead struct {
	h     *C.mf_head
	vocab int
	// ways is how many goroutines scan the vocabulary at once (SetThreads), with
	// each one's range's choice and score.
	ways   int
	args   []C.int32_t
	scores []C.float
}

// minHeadRows is the fewest rows a goroutine of a split head scans: below it, waking
// a thread costs more than the rows.
const minHeadRows = 16384

// LoadGreedyHead reads the output matrix of the model m loaded from path; it fails
// unless that matrix is q8_0 and of m's embedding by its vocabulary (the reason says
// which).
func LoadGreedyHead(path string, m *Model) (*GreedyHead, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var why [256]C.char
	h := C.mf_head_load(cpath, C.int64_t(m.NEmbd()), C.int64_t(m.NVocab()), &why[0], C.size_t(len(why)))
	if h == nil {
		return nil, errors.New(C.GoString(&why[0]))
	}
	return &GreedyHead{h: h, vocab: m.NVocab(), ways: 1}, nil
}

// SetThreads lets Argmax split the vocabulary among up to n threads (the calling one
// among them), each range at least minHeadRows: on a host whose cores are idle while
// the draft drafts (its model's layers on an accelerator) the head's pass is the
// draft's step.
func (g *GreedyHead) SetThreads(n int) {
	if g == nil {
		return
	}
	g.ways = max(1, min(n, g.vocab/minHeadRows))
	g.args = make([]C.int32_t, g.ways)
	g.scores = make([]C.float, g.ways)
}

// Free releases the head's copy of the matrix.
func (g *GreedyHead) Free() {
	if g != nil && g.h != nil {
		C.mf_head_free(g.h)
		g.h = nil
	}
}

// Bytes is the memory the head holds.
func (g *GreedyHead) Bytes() int64 {
	if g == nil {
		return 0
	}
	return int64(C.mf_head_bytes(g.h))
}

// Argmax is the token whose row of the output matrix has the largest product with
// output row i's hidden state of c's last decode (batch index i), -1 where the row has
// none (c has no StopAtNorm, or row i was not an output).
func (g *GreedyHead) Argmax(c *Context, i int) int32 {
	e := C.llama_get_embeddings_ith(c.c, C.int32_t(i))
	if e == nil {
		return -1
	}
	if g.ways <= 1 {
		return int32(C.mf_head_argmax(g.h, e))
	}
	return g.argmaxSplit(e)
}

// argmaxSplit scans the vocabulary in g.ways ranges at once, the first here, and
// keeps the best of the ranges' choices, the first among equals (what one pass over
// the whole vocabulary chooses: a row's score does not depend on its range).
func (g *GreedyHead) argmaxSplit(e *C.float) int32 {
	per := (g.vocab + g.ways - 1) / g.ways
	var wg sync.WaitGroup
	for w := 1; w < g.ways; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.args[w] = C.mf_head_argmax_rows(g.h, e, C.int64_t(w*per), C.int64_t(min((w+1)*per, g.vocab)), &g.scores[w])
		}()
	}
	g.args[0] = C.mf_head_argmax_rows(g.h, e, 0, C.int64_t(per), &g.scores[0])
	wg.Wait()
	best := 0
	for w := 1; w < g.ways; w++ {
		if g.args[w] >= 0 && (g.args[best] < 0 || g.scores[w] > g.scores[best]) {
			best = w
		}
	}
	return int32(g.args[best])
}

// SetStopAtNorm turns on or off, for c's later decodes, the stop at the final norm
// of a context created with StopAtNorm: while on, the output rows' logits are not
// computed (what Logits reads of them is stale).
func (c *Context) SetStopAtNorm(on bool) {
	if c.stop == nil {
		return
	}
	c.stop.on = 0
	if on {
		c.stop.on = 1
	}
}

// NormStops is how many graphs of c's decodes ended at the final norm.
func (c *Context) NormStops() int64 {
	if c.stop == nil {
		return 0
	}
	return int64(c.stop.stops)
}

// argmaxPortable is Argmax by the portable kernel (the one a machine without the
// vector kernel runs), for the tests.
func (g *GreedyHead) argmaxPortable(c *Context, i int) int32 {
	e := C.llama_get_embeddings_ith(c.c, C.int32_t(i))
	if e == nil {
		return -1
	}
	return int32(C.mf_head_argmax_with(g.h, e, true))
}
