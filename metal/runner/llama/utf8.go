package llama

import "unicode/utf8"

// UTF-8 classes of token pieces, so that output under a grammar stays valid UTF-8:
// llama.cpp's grammar decodes a piece that ends inside a character without checking
// that the next piece continues it validly, so a byte-level vocabulary could put
// broken characters into a JSON string that a schema bounds by length.
//
// A class packs: the continuation bytes at the start of the piece (they finish the
// character the output ended inside), the continuation bytes the piece's own last
// character still needs, whether the piece is only continuation bytes, whether it can
// never be valid, and — when the piece ends right after a lead byte — the range the
// next byte must be in. grammar.cpp's mf_utf8_next reads the same bits.
const (
	utf8LeadMask   = 0x003 // continuation bytes at the start of the piece (0..3)
	utf8NeedMask   = 0x00c // continuation bytes its last character still needs, << 2
	utf8ContOnly   = 0x010 // the piece is continuation bytes only (count in the lead bits)
	utf8Invalid    = 0x020 // the piece can never be part of valid UTF-8
	utf8RangeShift = 6     // range of the byte after a trailing lead byte (utf8Ranges), 3 bits
)

// utf8Ranges are the allowed second bytes of a sequence by its lead byte; 0 is the
// ordinary continuation range.
var utf8Ranges = [...][2]byte{{0x80, 0xBF}, {0xA0, 0xBF}, {0x80, 0x9F}, {0x90, 0xBF}, {0x80, 0x8F}}

// leadInfo returns a lead byte's sequence length and second-byte range (0 length for
// a byte that starts no valid sequence).
func leadInfo(b byte) (n int, rng uint16) {
	switch {
	case b >= 0xC2 && b <= 0xDF:
		return 2, 0
	case b == 0xE0:
		return 3, 1
	case b == 0xED:
		return 3, 2
	case b >= 0xE1 && b <= 0xEF:
		return 3, 0
	case b == 0xF0:
		return 4, 3
	case b == 0xF4:
		return 4, 4
	case b >= 0xF1 && b <= 0xF3:
		return 4, 0
	}
	return 0, 0
}

func inRange(b byte, rng uint16) bool {
	r := utf8Ranges[rng]
	return b >= r[0] && b <= r[1]
}

// utf8Class classifies a token piece.
func utf8Class(p []byte) uint16 {
	lead := 0
	for lead < len(p) && p[lead]&0xC0 == 0x80 {
		lead++
	}
	switch {
	case lead > 3:
		return utf8Invalid
	case len(p) == 0:
		return 0
	case lead == len(p):
		return utf8ContOnly | uint16(lead)
	}
	rest := p[lead:]
	for len(rest) > 0 {
		r, size := utf8.DecodeRune(rest)
		if r != utf8.RuneError || size > 1 {
			rest = rest[size:]
			continue
		}
		// Either a bad sequence or a character cut short by the end of the piece.
		n, rng := leadInfo(rest[0])
		if n == 0 || len(rest) >= n {
			return utf8Invalid
		}
		for i, b := range rest[1:] {
			if i == 0 && !inRange(b, rng) || b&0xC0 != 0x80 {
				return utf8Invalid
			}
		}
		c := uint16(lead) | uint16(n-len(rest))<<2
		if len(rest) == 1 {
			c |= rng << utf8RangeShift
		}
		return c
	}
	return uint16(lead)
}

// utf8State is what the output so far needs next: continuation bytes, and the range
// of the first of them when the output ends right after a lead byte.
type utf8State struct {
	pending int
	rng     uint16
}

// utf8Next reports whether a piece of class c starting with byte first may follow,
// and the state after it.
func utf8Next(c uint16, first byte, s utf8State) (utf8State, bool) {
	lead := int(c & utf8LeadMask)
	switch {
	case c&utf8Invalid != 0:
		return s, false
	case c&utf8ContOnly != 0:
		if lead > s.pending || !inRange(first, s.rng) {
			return s, false
		}
		return utf8State{pending: s.pending - lead}, true
	case lead != s.pending || lead > 0 && !inRange(first, s.rng):
		return s, false
	}
	return utf8State{pending: int(c&utf8NeedMask) >> 2, rng: c >> utf8RangeShift & 7}, true
}

// utf8Table has the class and first byte of each token piece of a vocabulary.
type utf8Table struct {
	class []uint16
	first []uint8
}

func newUTF8Table(pieces [][]byte) *utf8Table {
	t := &utf8Table{class: make([]uint16, len(pieces)), first: make([]uint8, len(pieces))}
	for i, p := range pieces {
		t.class[i] = utf8Class(p)
		if len(p) > 0 {
			t.first[i] = p[0]
		}
	}
	return t
}
