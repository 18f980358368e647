//go:build cgo && !race

package server

// Fillers: one micro-batch for a step whose busy slots have idle ones between them.
//
// The runner's context keeps a KV stream a slot, and llama.cpp computes a batch of
// several streams as micro-batches of consecutive sequences that hold the same
// number of tokens each. An idle slot between two busy ones ends a micro-batch: with
// slots 2, 6, 10 and 14 of sixteen idle, a plain step ran as five graphs (counted on
// the trained model), each of them a pass over the weights on an accelerator and a
// round of the CPU's threads. So each idle slot between the step's first and last
// busy slot gets a filler: one token that is no output, at the position after its
// cells, removed again once the step is decoded. Its stream then holds what it held.
// A filler costs a row of the layers (no logits); where a slot's stream is full or
// the batch has no room left, its gap stays.
//
// Where the layers run decides whether that pays. On an accelerator (Metal, CUDA, a
// split runner's workers) a step's rows cost about one pass over the weights and a
// micro-batch more costs another pass (or a round trip). On a CPU each row costs its
// own work: the synthesized mid model with four streams on every fourth of sixteen
// slots ran at 132 tok/s with fillers (thirteen rows) and 153 without (four one-row
// micro-batches), where the trained model, whose rows are cheap beside its
// vocabulary's logits, ran a step 1.5 times as fast with them. So fillers are on
// where the model has weights on an accelerator, and MACFLEET_FILLERS=1 or 0 sets
// them either way.

// filler is a filler token's sequence and position.
type filler struct{ seq, pos int }

// fillerToken is what a filler holds: any token of the vocabulary (its row is never
// read and its cell is removed after the step).
const fillerToken = 0

// envFillers is the environment variable that sets fillers on (1) or off (0)
// whatever the model's device, for measuring what they save on a machine.
const envFillers = "MACFLEET_FILLERS"

// fillersOn is whether an engine whose model has deviceBytes of weights on
// accelerators gets fillers, given env (envFillers' value).
func fillersOn(env string, deviceBytes uint64) bool {
	switch env {
	case "1":
		return true
	case "0":
		return false
	}
	return deviceBytes > 0
}

// mayFill reports whether this step may get fillers: a context of several streams
// whose cells can be removed again (no recurrent state, which a filler would advance
// for good: specOff), with fillers on (fillersOn).
func (e *engine) mayFill() bool {
	return e.fillersOn && len(e.slots) > 1 && e.specOff == ""
}

// busyRange is the first and last slot with tokens in this step (-1, -1 for none).
func (e *engine) busyRange() (lo, hi int) {
	lo, hi = -1, -1
	for _, s := range e.slots {
		if s.take > 0 {
			if lo < 0 {
				lo = s.id
			}
			hi = s.id
		}
	}
	return lo, hi
}

// fillerRoom is how many fillers this step's batch has room for: nBatch less the
// tokens the slots take.
func (e *engine) fillerRoom() int {
	room := e.nBatch
	for _, s := range e.slots {
		room -= s.take
	}
	return max(0, room)
}

// addFillers puts n fillers for sequence seq into the batch, at positions from pos
// on, as far as its stream has room.
func (e *engine) addFillers(seq, pos, n int) {
	for k := range n {
		if pos+k >= e.nCtxSeq {
			return
		}
		e.batch.Add(fillerToken, pos+k, seq, false)
		e.fillers = append(e.fillers, filler{seq: seq, pos: pos + k})
	}
}

// maxPadRows bounds a padded step's rows (padTo): on the card the steps of up to 64
// tokens run as recorded graphs (MACFLEET_CUDA_GRAPH_MAX_TOKENS), and it is under
// that bound that padding was measured (docs/benchmarks.md#drafts-padded-to-one-micro-batch-2026-11-29).
const maxPadRows = 64

// padTo is how many tokens each slot from lo to hi holds in this decode step with its
// fillers (padding), counting the steps it pads.
func (e *engine) padTo(lo, hi int) int {
	if lo < 0 || e.mixed {
		return 1
	}
	takes, ends := e.padTakes[:0], e.padEnds[:0]
	for _, s := range e.slots[lo : hi+1] {
		end := e.ctx.SeqPosMax(s.id) + 1
		if s.take > 0 {
			end = len(s.cached)
		}
		takes, ends = append(takes, s.take), append(ends, end)
	}
	e.padTakes, e.padEnds = takes, ends
	t := padding(takes, ends, e.nBatch, e.nCtxSeq)
	if t > 1 {
		e.padded.Add(1)
	}
	return t
}

// padding is how many tokens each of a run of slots holds in a decode step with its
// fillers, where slot i takes takes[i] tokens (0 for an idle one) and its stream's
// cells end at ends[i]. Where a slot drafts it is the most any slot takes: every
// other busy slot gets fillers after its tokens, every idle one that many, and the
// step stays one micro-batch, where a drafting slot would otherwise split it in two
// or three (the slots before it, its own tokens, the slots after it). It is 1 (an
// idle slot's one filler) where no slot takes more than one token, or padding would
// pass maxPadRows, the batch (nBatch) or a slot's stream of nCtxSeq cells.
func padding(takes, ends []int, nBatch, nCtxSeq int) int {
	t := 1
	for _, n := range takes {
		t = max(t, n)
	}
	rows := len(takes) * t
	if t == 1 || rows > maxPadRows || rows > nBatch {
		return 1
	}
	for _, end := range ends {
		if end+t > nCtxSeq {
			return 1
		}
	}
	return t
}

// unfill removes the step's fillers' cells (after its decode, failed or not).
func (e *engine) unfill() {
	e.filled.Add(int64(len(e.fillers)))
	for _, f := range e.fillers {
		e.ctx.SeqRm(f.seq, f.pos, -1)
	}
	e.fillers = e.fillers[:0]
}
