//go:build cgo && !race

package server

import "sync/atomic"

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
// own work, and a filler's row is the layers' work alone (it has no logits): the
// synthesized mid model, whose layers are most of a token's work, with four streams
// on every fourth of sixteen slots ran at 132 tok/s with fillers (thirteen rows) and
// 153 without (four one-row micro-batches), where the trained model, whose rows are
// cheap beside its vocabulary's logits, ran a step 1.5 times as fast with them and
// sixteen streams half quoting 1.3–2.2 times as fast (paired runs) (docs/benchmarks.md). So
// fillers are on where the model has weights on an accelerator, or where its logits
// are more of a token's work than its layers (modelShape), and MACFLEET_FILLERS=1 or
// 0 sets them either way.

// filler is a filler token's sequence and position.
type filler struct{ seq, pos int }

// fillerToken is what a filler holds: any token of the vocabulary (its row is never
// read and its cell is removed after the step).
const fillerToken = 0

// envFillers is the environment variable that sets fillers on (1) or off (0)
// whatever the model's device, for measuring what they save on a machine.
const envFillers = "MACFLEET_FILLERS"

// fillersOn is whether an engine whose model has deviceBytes of weights on
// accelerators, and the shape m, gets fillers, given env (envFillers' value).
func fillersOn(env string, deviceBytes uint64, m modelShape) bool {
	switch env {
	case "1":
		return true
	case "0":
		return false
	}
	return deviceBytes > 0 || m.logitsOutweighLayers()
}

// modelShape is what decides fillers on a CPU: the model's parameters, vocabulary
// and embedding sizes.
type modelShape struct{ params, vocab, embd uint64 }

// logitsOutweighLayers reports whether a token's logits (vocab × embd multiply-adds)
// are more of its work than its layers: the parameters besides the token embedding,
// counted as if the output projection were the embedding (tied), so that an untied
// one counts as layers and the answer errs toward no fillers.
func (m modelShape) logitsOutweighLayers() bool {
	logits := m.vocab * m.embd
	return logits > 0 && m.params >= logits && logits > m.params-logits
}

// fillerSet is an engine's fillers: whether it makes them, this step's, and the
// counts /status reads. It reaches the engine's context and batch only through its
// methods' arguments.
type fillerSet struct {
	on bool
	// step is this step's fillers, removed after its decode (remove).
	step []filler
	// filled counts every filler decoded, padded the steps whose drafts they padded.
	filled, padded atomic.Int64
	// takes and ends are plan's scratch (padding's arguments).
	takes, ends []int
}

// seqCells is what fillers need of a context: where a sequence's cells end, and removing
// a sequence's cells from a position on.
type seqCells interface {
	SeqPosMax(seq int) int
	SeqRm(seq, p0, p1 int) bool
}

// batchAdder is what fillers need of a batch.
type batchAdder interface {
	Add(tok int32, pos, seq int, output bool) int
}

// fillPlan is a step's fillers: the run of busy slots from lo to hi (-1, -1 for
// none: no fillers), the batch's room left for fillers, and how many tokens each
// slot of the run holds with its fillers (pad: 1 but where a slot drafts, padding).
type fillPlan struct{ lo, hi, room, pad int }

// plan is this step's fillPlan for slots, whose context is kv: none where fillers are
// off, the engine has one slot, or its sequences cannot be cut back (cutBack false:
// a recurrent state, which a filler would advance for good).
func (f *fillerSet) plan(slots []*slot, kv seqCells, nBatch, nCtxSeq int, mixed, cutBack bool) fillPlan {
	p := fillPlan{lo: -1, hi: -1, pad: 1}
	if !f.on || len(slots) < 2 || !cutBack {
		return p
	}
	p.room = nBatch
	most := 0
	for _, s := range slots {
		p.room -= s.take
		most = max(most, s.take)
		if s.take > 0 {
			if p.lo < 0 {
				p.lo = s.id
			}
			p.hi = s.id
		}
	}
	p.room = max(0, p.room)
	if most <= 1 || mixed {
		return p // no draft: nothing to pad (and no stream's end to read each step)
	}
	takes, ends := f.takes[:0], f.ends[:0]
	for _, s := range slots[p.lo : p.hi+1] {
		end := kv.SeqPosMax(s.id) + 1
		if s.take > 0 {
			end = len(s.cached)
		}
		takes, ends = append(takes, s.take), append(ends, end)
	}
	f.takes, f.ends = takes, ends
	if p.pad = padding(takes, ends, nBatch, nCtxSeq); p.pad > 1 {
		f.padded.Add(1)
	}
	return p
}

// add puts n fillers for sequence seq into the batch b, at positions from pos on, as
// far as its stream of nCtxSeq cells has room.
func (f *fillerSet) add(b batchAdder, seq, pos, n, nCtxSeq int) {
	for k := range n {
		if pos+k >= nCtxSeq {
			return
		}
		b.Add(fillerToken, pos+k, seq, false)
		f.step = append(f.step, filler{seq: seq, pos: pos + k})
	}
}

// remove removes the step's fillers' cells from kv (after its decode, failed or not):
// a sequence's fillers lie at consecutive positions after its other cells, so one
// removal from its first filler on takes them all.
func (f *fillerSet) remove(kv seqCells) {
	f.filled.Add(int64(len(f.step)))
	for i, fl := range f.step {
		if i == 0 || f.step[i-1].seq != fl.seq {
			kv.SeqRm(fl.seq, fl.pos, -1)
		}
	}
	f.step = f.step[:0]
}

// maxPadRows bounds a padded step's rows (padding): on the card the steps of up to 64
// tokens run as recorded graphs (MACFLEET_CUDA_GRAPH_MAX_TOKENS), and it is under
// that bound that padding was measured (docs/benchmarks.md#drafts-padded-to-one-micro-batch-2026-11-29).
const maxPadRows = 64

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
