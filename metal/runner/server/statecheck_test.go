package server

import (
	"encoding/binary"
	"strings"
	"testing"
)

// words is a state of little-endian 32-bit words, then the K and V data's bytes.
func words(ws ...int64) []byte {
	var b []byte
	for _, w := range ws {
		b = binary.LittleEndian.AppendUint32(b, uint32(w))
	}
	return append(b, 0xde, 0xad) // data, which the check does not read
}

func TestCheckStateCells(t *testing.T) {
	for _, tc := range []struct {
		name  string
		state []byte
		want  string // in the error; "" for none
	}{
		{"one stream, cells at 0 and 1", words(1, 2, 0, 1, 0, 1, 1, 0), ""},
		{"cells out of order", words(1, 3, 2, 1, 0, 0, 1, 0, 1, 1, 0), ""},
		{"the second stream holds the cells", words(2, 0, 1, 0, 1, 1), ""},
		{"no cells", words(1, 0)[:8], ""},
		{"a cell at -5", words(1, 2, 0, 1, 0, -5, 1, 0), "cell 1 of stream 0 is at position -5"},
		{"a cell at -1", words(1, 1, -1, 1, 0), "at position -1"},
		{"a gap", words(1, 2, 0, 1, 0, 2, 1, 0), "cell 1 of stream 0 is at position 2; a state of 2 cells holds positions 0 to 1"},
		{"a repeat", words(1, 2, 1, 1, 0, 1, 1, 0), "cell 1 of stream 0 repeats position 1"},
		{"a cell of two sequences", words(1, 1, 0, 2, 0, 1), "is of 2 sequences"},
		{"a cell of none", words(2, 0, 1, 0, 0, 0), "cell 0 of stream 1 is of 0 sequences"},
		{"more cells than bytes", words(1, 1<<30, 0, 1, 0), "claims 1073741824 cells"},
		{"cut in a cell", words(1, 3, 0, 1, 0, 1)[:22], "claims 3 cells in 14 bytes"},
		{"cut in the last cell", words(1, 2, 0, 1, 0, 1, 1)[:30], "claims 2 cells in 22 bytes"},
		{"cut before a stream's count", words(3, 0)[:8], "the state ends"},
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
