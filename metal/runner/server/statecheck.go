package server

import (
	"encoding/binary"
	"fmt"
)

// checkStateCells checks the cells of a KV cache's sequence state before llama.cpp
// restores it. llama.cpp checks the state's shape and sizes, but takes each cell's
// position as written: a position below 0 (other than an empty cell's -1, which a
// written cell never has) is restored, and the next decode ends the process on one
// of the cache's assertions; positions with a gap or a repeat are restored, and the
// next decode fails (its batch does not follow the sequence's last position). A
// state from the prompt cache's SSD tier or a peer is bytes a crafted file or a
// compromised Mac chose (docs/security.md), so the cells of the first stream that
// holds any must be what the runner saves: one a position from 0 to their count − 1
// (a prompt's prefix, which the runner never shifts), each of the one sequence a
// sequence state holds. The layout read (per stream: a cell count, then each cell's
// position, its count of sequences and their ids) is llama.cpp's sequence state of
// an attention KV cache; what follows the first such cells (their K and V data) is
// llama.cpp's to check.
func checkStateCells(state []byte) error {
	r := stateReader{b: state}
	streams := r.u32()
	for s := uint32(0); s < streams && r.err == nil; s++ {
		cells := r.u32()
		if r.err != nil || cells == 0 {
			continue
		}
		if uint64(cells)*12 > uint64(len(r.b)) {
			return fmt.Errorf("stream %d claims %d cells in %d bytes", s, cells, len(r.b))
		}
		seen := make([]bool, cells)
		for i := uint32(0); i < cells && r.err == nil; i++ {
			pos, seqs := int32(r.u32()), r.u32()
			r.u32() // the sequence's id, which llama.cpp replaces by the slot's
			switch {
			case r.err != nil:
			case seqs != 1:
				return fmt.Errorf("cell %d of stream %d is of %d sequences; a sequence state's are of one", i, s, seqs)
			case pos < 0 || uint32(pos) >= cells:
				return fmt.Errorf("cell %d of stream %d is at position %d; a state of %d cells holds positions 0 to %d", i, s, pos, cells, cells-1)
			case seen[pos]:
				return fmt.Errorf("cell %d of stream %d repeats position %d", i, s, pos)
			default:
				seen[pos] = true
			}
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
