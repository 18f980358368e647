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

// filler is a filler token's sequence and position.
type filler struct{ seq, pos int }

// fillerToken is what a filler holds: any token of the vocabulary (its row is never
// read and its cell is removed after the step).
const fillerToken = 0

// noFillers is the environment variable that turns fillers off (MACFLEET_FILLERS=0),
// for measuring what they save on a machine.
const noFillers = "MACFLEET_FILLERS"

// mayFill reports whether the engine's steps get fillers: a context of several
// streams whose cells can be removed again (no recurrent state, which a filler would
// advance for good: specOff), unless MACFLEET_FILLERS=0.
func (e *engine) mayFill() bool {
	return len(e.slots) > 1 && e.specOff == "" && !e.fillersOff
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

// addFiller puts a filler for idle slot s into the batch, where its stream has room.
func (e *engine) addFiller(s *slot) {
	pos := e.ctx.SeqPosMax(s.id) + 1
	if pos >= e.nCtxSeq {
		return
	}
	e.batch.Add(fillerToken, pos, s.id, false)
	e.fillers = append(e.fillers, filler{seq: s.id, pos: pos})
}

// unfill removes the step's fillers' cells (after its decode, failed or not).
func (e *engine) unfill() {
	e.filled.Add(int64(len(e.fillers)))
	for _, f := range e.fillers {
		e.ctx.SeqRm(f.seq, f.pos, -1)
	}
	e.fillers = e.fillers[:0]
}
