package server

import (
	"encoding/binary"
	"fmt"
)

// checkStateCells checks the cells of a sequence state's KV caches before llama.cpp
// restores it. llama.cpp checks the state's shape and sizes, but takes each cell's
// position as written: a position below 0 (other than an empty cell's -1, which a
// written cell never has) is restored, and the next decode ends the process on one
// of the cache's assertions; positions with a gap or a repeat are restored, and the
// next decode fails (its batch does not follow the sequence's last position). A
// state from the prompt cache's SSD tier or a peer is bytes a crafted file or a
// compromised Mac chose (docs/security.md), so every cell table in it must be what
// the runner saves.
//
// A state holds one KV cache, or for a model with sliding-window layers two: the full
// layers' cache, then the window layers' (llama.cpp writes them in that order). Each
// is a stream count, then per stream a cell count and, for a stream with cells, each
// cell's position, its count of sequences and their ids, then the cells' K and V
// data, which the check skips by the sizes written before it (their values are
// llama.cpp's to check). The first cache's cells must be a prompt's prefix, which
// the runner never shifts: one a position from 0 to their count − 1, each of the one
// sequence a sequence state holds. A later cache's (the window's) are of that
// sequence too, at distinct positions within it.
func checkStateCells(state []byte) error {
	r := stateReader{b: state}
	var length uint32 // the sequence's length: the first cache's cells
	for c := 0; c == 0 || len(r.b) > 0; c++ {
		n, err := r.cache(c, length)
		if err != nil {
			return err
		}
		if c == 0 {
			length = n
		}
	}
	return nil
}

// cache reads KV cache c of a state and checks its cells; length is the sequence's
// (for c > 0). It returns the count of cells of its last stream that holds any.
func (r *stateReader) cache(c int, length uint32) (uint32, error) {
	var held uint32
	streams := r.u32()
	for s := uint32(0); s < streams && r.err == nil; s++ {
		cells := r.u32()
		if r.err != nil || cells == 0 {
			continue
		}
		if uint64(cells)*12 > uint64(len(r.b)) {
			return 0, fmt.Errorf("stream %d of cache %d claims %d cells in %d bytes", s, c, cells, len(r.b))
		}
		limit := cells
		if c > 0 {
			limit = length
		}
		if err := r.cells(c, s, cells, limit); err != nil {
			return 0, err
		}
		r.skipData(cells)
		held = cells
	}
	return held, r.err
}

// cells reads the n cells of stream s of cache c: each of one sequence, at a distinct
// position from 0 to limit − 1; the first cache's (limit n) are every one of them.
func (r *stateReader) cells(c int, s, n, limit uint32) error {
	if n > limit {
		return fmt.Errorf("stream %d of cache %d holds %d cells of a sequence of %d", s, c, n, limit)
	}
	seen := make([]bool, limit)
	for i := uint32(0); i < n && r.err == nil; i++ {
		pos, seqs := int32(r.u32()), r.u32()
		r.u32() // the sequence's id, which llama.cpp replaces by the slot's
		switch {
		case r.err != nil:
		case seqs != 1:
			return fmt.Errorf("cell %d of stream %d of cache %d is of %d sequences; a sequence state's are of one", i, s, c, seqs)
		case pos < 0 || uint32(pos) >= limit:
			return fmt.Errorf("cell %d of stream %d of cache %d is at position %d; a sequence of %d holds positions 0 to %d",
				i, s, c, pos, limit, limit-1)
		case seen[pos]:
			return fmt.Errorf("cell %d of stream %d of cache %d repeats position %d", i, s, c, pos)
		default:
			seen[pos] = true
		}
	}
	return r.err
}

// skipData skips the K and V data of a stream's n cells: whether V is transposed, the
// layer count, then per layer K's type, row size and rows; then V's, per layer a type,
// a row size and rows, or (transposed) a type, an element size, the row count and the
// elements.
func (r *stateReader) skipData(n uint32) {
	transposed, layers := r.u32(), r.u32()
	for l := uint32(0); l < layers && r.err == nil; l++ {
		r.u32()
		r.skip(uint64(n), r.u64())
	}
	for l := uint32(0); l < layers && r.err == nil; l++ {
		r.u32()
		if transposed == 0 {
			r.skip(uint64(n), r.u64())
			continue
		}
		el, rows := r.u32(), r.u32()
		r.skip(uint64(n)*uint64(rows), uint64(el))
	}
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

func (r *stateReader) u64() uint64 {
	lo := r.u32()
	return uint64(r.u32())<<32 | uint64(lo)
}

// skip passes count items of size bytes each.
func (r *stateReader) skip(count, size uint64) {
	if r.err != nil {
		return
	}
	if size != 0 && count > uint64(len(r.b))/size {
		r.err = fmt.Errorf("the state claims %d items of %d bytes in %d", count, size, len(r.b))
		return
	}
	r.b = r.b[count*size:]
}
