package server

import (
	"encoding/binary"
	"fmt"
)

// checkStateCells checks the cells of a KV cache's sequence state before llama.cpp
// restores it. llama.cpp checks the state's shape and sizes, but takes each cell's
// position as written: a position below 0 (other than an empty cell's -1, which a
// written cell never has) is restored, and the next decode ends the process on one
// of the cache's assertions. A state from the prompt cache's SSD tier or a peer is
// bytes a crafted file or a compromised Mac chose (docs/security.md), so each cell of
// the first stream that holds any must be at a position of 0 or more and of the one
// sequence a sequence state holds. The layout read (per stream: a cell count, then
// each cell's position, its count of sequences and their ids) is llama.cpp's
// sequence state of an attention KV cache; what follows the first such cells (their
// K and V data) is llama.cpp's to check.
func checkStateCells(state []byte) error {
	r := stateReader{b: state}
	streams := r.u32()
	for s := uint32(0); s < streams && r.err == nil; s++ {
		cells := r.u32()
		if r.err != nil || cells == 0 {
			continue
		}
		for i := uint32(0); i < cells && r.err == nil; i++ {
			pos, seqs := int32(r.u32()), r.u32()
			if r.err != nil {
				break
			}
			if pos < 0 || seqs != 1 {
				return fmt.Errorf("cell %d of stream %d is at position %d of %d sequences; a sequence state's cells are at 0 or more, of one sequence", i, s, pos, seqs)
			}
			r.u32() // the sequence's id, which llama.cpp replaces by the slot's
		}
		return r.err
	}
	return r.err
}

// stateReader reads little-endian words of a state; err is set at its end.
type stateReader struct {
	b   []byte
	err error
}

func (r *stateReader) u32() uint32 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 4 {
		r.err = fmt.Errorf("the state ends %d bytes into a word", len(r.b))
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}
