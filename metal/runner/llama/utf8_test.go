package llama

import (
	"testing"
	"unicode/utf8"
)

func TestUTF8Class(t *testing.T) {
	cases := []struct {
		piece string
		lead  int
		need  int
		cont  bool
		bad   bool
	}{
		{piece: ""},
		{piece: "abc"},
		{piece: "é"},
		{piece: "\xc3", need: 1},
		{piece: "a\xe2\x80", need: 1},
		{piece: "\xa9", lead: 1, cont: true},
		{piece: "\x80\x99", lead: 2, cont: true},
		{piece: "\xa9abc", lead: 1},
		{piece: "\x82\xacx\xf0", lead: 2, need: 3},
		{piece: "\x80\x80\x80\x80", bad: true},
		{piece: "\xffa", bad: true},
		{piece: "\xc3a", bad: true},
		{piece: "\xe2\x80a", bad: true},
		{piece: "\xe0\x80", bad: true}, // overlong
		{piece: "\xed\xa0", bad: true}, // surrogate
		{piece: "\xc0", bad: true},
		{piece: "\xf5", bad: true},
	}
	for _, tc := range cases {
		c := utf8Class([]byte(tc.piece))
		if got := c&utf8Invalid != 0; got != tc.bad {
			t.Errorf("%q: invalid %v, want %v", tc.piece, got, tc.bad)
			continue
		}
		if tc.bad {
			continue
		}
		if int(c&utf8LeadMask) != tc.lead || int(c&utf8NeedMask)>>2 != tc.need || (c&utf8ContOnly != 0) != tc.cont {
			t.Errorf("%q: class %#x, want lead %d need %d cont %v", tc.piece, c, tc.lead, tc.need, tc.cont)
		}
	}
}

func accept(pieces ...string) (utf8State, bool) {
	var s utf8State
	for _, p := range pieces {
		if p == "" {
			continue // an empty piece is a control token: refused inside a character
		}
		next, ok := utf8Next(utf8Class([]byte(p)), p[0], s)
		if !ok {
			return s, false
		}
		s = next
	}
	return s, true
}

// TestUTF8Sequences feeds strings split at every pair of byte boundaries: every split
// of valid UTF-8 is accepted and ends complete; invalid joins are refused.
func TestUTF8Sequences(t *testing.T) {
	for _, s := range []string{"héllo", "日本語", "a😀b", "€", "\u0800\ud7ff\U00010000\U0010ffff"} {
		for i := 0; i <= len(s); i++ {
			for j := i; j <= len(s); j++ {
				if st, ok := accept(s[:i], s[i:j], s[j:]); !ok || st.pending != 0 {
					t.Errorf("%q split at %d,%d: ok %v state %+v", s, i, j, ok, st)
				}
			}
		}
	}
	for _, bad := range [][]string{{"\xe2\x82", "a"}, {"\xe2", "\x82\xac\x80"}, {"a", "\x80"}, {"\xc3", "\xc3\xa9"},
		{"\xe0", "\x80\x80"}, {"\xed", "\xa0\x80"}, {"\xf0", "\x80\x80\x80"}, {"\xf4", "\x90\x80\x80"}, {"\xe0", "\x9f"}} {
		if _, ok := accept(bad...); ok {
			t.Errorf("%q accepted", bad)
		}
		if utf8.ValidString(bad[0] + bad[1]) {
			t.Errorf("%q is valid UTF-8: a wrong test case", bad)
		}
	}
	if _, ok := utf8Next(utf8Class(nil), 0, utf8State{pending: 1}); ok {
		t.Error("an empty piece inside a character accepted")
	}
	if st, ok := accept("\xe2", "\x82"); !ok || st.pending != 1 {
		t.Errorf("a character in three pieces: ok %v state %+v after two", ok, st)
	}
}

// TestUTF8Exhaustive: every sequence of two pieces of up to two bytes each over the
// bytes that matter is accepted exactly when it is valid UTF-8 or a valid prefix of it.
func TestUTF8Exhaustive(t *testing.T) {
	bytes := []byte{'a', 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc2, 0xdf, 0xe0, 0xe1, 0xed, 0xef, 0xf0, 0xf1, 0xf4, 0xf5, 0xff}
	var pieces []string
	for _, a := range bytes {
		pieces = append(pieces, string([]byte{a}))
		for _, b := range bytes {
			pieces = append(pieces, string([]byte{a, b}))
		}
	}
	for _, p := range pieces {
		for _, q := range pieces {
			s := p + q
			_, got := accept(p, q)
			if want := validPrefix(s); got != want {
				t.Errorf("%q+%q: accepted %v, valid prefix %v", p, q, got, want)
			}
		}
	}
}

// validPrefix: s is valid UTF-8 possibly cut inside its last character.
func validPrefix(s string) bool {
	for cut := 0; cut <= 3 && cut <= len(s); cut++ {
		if utf8.ValidString(s[:len(s)-cut]) && (cut == 0 || completes(s[len(s)-cut:])) {
			return true
		}
	}
	return false
}

// prefixes holds every proper prefix of the encoding of every valid rune.
var prefixes = func() map[string]bool {
	m := map[string]bool{}
	for c := rune(0x80); c <= utf8.MaxRune; c++ {
		if e := string(c); utf8.ValidRune(c) {
			for n := 1; n < len(e); n++ {
				m[e[:n]] = true
			}
		}
	}
	return m
}()

// completes: some continuation makes tail a valid character.
func completes(tail string) bool { return prefixes[tail] }
