package server

import (
	"encoding/binary"
	"strings"
	"testing"
)

// le appends little-endian 32-bit words.
func le(b []byte, ws ...int64) []byte {
	for _, w := range ws {
		b = binary.LittleEndian.AppendUint32(b, uint32(w))
	}
	return b
}

// cells appends a stream's cells at positions, each of one sequence (id 0).
func cells(b []byte, positions []int32) []byte {
	b = le(b, int64(len(positions)))
	for _, p := range positions {
		b = le(b, int64(p), 1, 0)
	}
	return b
}

// kvData appends the K and V data of n cells as llama.cpp writes them: 2 layers, K
// rows of 4 bytes; V rows of 4 bytes, or transposed 3 rows of n elements of 2 bytes.
func kvData(b []byte, n int, transposed bool) []byte {
	t := int64(0)
	if transposed {
		t = 1
	}
	b = le(b, t, 2)
	for range 2 {
		b = le(b, 1)
		b = binary.LittleEndian.AppendUint64(b, 4)
		b = append(b, make([]byte, 4*n)...)
	}
	for range 2 {
		if transposed {
			b = le(b, 1, 2, 3)
			b = append(b, make([]byte, 3*2*n)...)
			continue
		}
		b = le(b, 1)
		b = binary.LittleEndian.AppendUint64(b, 4)
		b = append(b, make([]byte, 4*n)...)
	}
	return b
}

// kv is one KV cache: per stream, its cells' positions (none: an empty stream), with
// their data.
func kv(transposed bool, streams ...[]int32) []byte {
	b := le(nil, int64(len(streams)))
	for _, s := range streams {
		if len(s) == 0 {
			b = le(b, 0)
			continue
		}
		b = kvData(cells(b, s), len(s), transposed)
	}
	return b
}

func join(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func TestCheckStateCells(t *testing.T) {
	full := kv(false, []int32{0, 1, 2, 3, 4})
	for _, tc := range []struct {
		name  string
		state []byte
		want  string // in the error; "" for none
	}{
		{"one stream, cells at 0 and 1", kv(false, []int32{0, 1}), ""},
		{"cells out of order", kv(false, []int32{2, 0, 1}), ""},
		{"the second stream holds the cells", kv(false, nil, []int32{0}), ""},
		{"V transposed", kv(true, []int32{0, 1, 2}), ""},
		{"no cells", kv(false, nil), ""},
		{"a window's cache after the full one", join(full, kv(false, []int32{2, 3, 4})), ""},
		{"a window's cache holding the whole sequence", join(full, kv(true, []int32{4, 3, 2, 1, 0})), ""},
		{"a cell at -5", kv(false, []int32{0, -5}), "cell 1 of stream 0 of cache 0 is at position -5"},
		{"a cell at -1", kv(false, []int32{-1}), "at position -1"},
		{"a gap", kv(false, []int32{0, 2}), "cell 1 of stream 0 of cache 0 is at position 2; a sequence of 2 holds positions 0 to 1"},
		{"a repeat", kv(false, []int32{1, 1}), "cell 1 of stream 0 of cache 0 repeats position 1"},
		{"a window cell at -5", join(full, kv(false, []int32{3, -5})), "cell 1 of stream 0 of cache 1 is at position -5"},
		{"a window cell past the sequence", join(full, kv(false, []int32{5})), "cache 1 is at position 5; a sequence of 5"},
		{"a window cell repeated", join(full, kv(false, []int32{4, 4})), "cache 1 repeats position 4"},
		{"a window longer than the sequence", join(full, kv(false, []int32{0, 1, 2, 3, 4, 5})), "holds 6 cells of a sequence of 5"},
		{"a cell of two sequences", le(nil, 1, 1, 0, 2, 0, 1), "is of 2 sequences"},
		{"a cell of none", le(nil, 2, 0, 1, 0, 0, 0, 0, 0), "cell 0 of stream 1 of cache 0 is of 0 sequences"},
		{"more cells than bytes", le(nil, 1, 1<<30, 0, 1, 0), "claims 1073741824 cells"},
		{"cut in a cell", kv(false, []int32{0, 1, 2})[:22], "claims 3 cells in 14 bytes"},
		{"cut in the data", kv(false, []int32{0, 1})[:74], "the state claims 2 items of 4 bytes"},
		{"rows too large to count", join(le(cells(le(nil, 1), []int32{0}), 0, 1, 1), le(nil, 0, 1<<30)), "claims 1 items of 4611686018427387904 bytes"},
		{"bytes after the caches", join(full, []byte{0xde, 0xad}), "the state ends 2 bytes into a word"},
		{"cut before a stream's count", le(nil, 3, 0), "the state ends"},
		{"empty", nil, "the state ends"},
	} {
		err := checkStateCells(tc.state)
		if got := ""; err != nil {
			got = err.Error()
			if tc.want == "" || !strings.Contains(got, tc.want) {
				t.Errorf("%s: %q, want %q in it", tc.name, got, tc.want)
			}
		} else if tc.want != "" {
			t.Errorf("%s: no error, want %q", tc.name, tc.want)
		}
	}
}
