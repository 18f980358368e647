// Package textstream turns a stream of token pieces (raw bytes) into text that is safe
// to send: it never splits a UTF-8 character across two chunks and never sends text
// that might turn out to be the start of a stop string.
package textstream

import (
	"strings"
	"unicode/utf8"
)

// Stream assembles generated text. The zero value has no stop strings.
type Stream struct {
	stops   []string
	raw     []byte // bytes of an incomplete UTF-8 character
	held    string // decoded text that may be the start of a stop string
	stopped bool
	matched string // the stop string that ended the stream
}

// New returns a Stream that ends at the first occurrence of any of stops (empty
// strings are ignored).
func New(stops []string) *Stream {
	s := &Stream{}
	for _, st := range stops {
		if st != "" {
			s.stops = append(s.stops, st)
		}
	}
	return s
}

// Push adds a piece and returns the text that can be sent now. stopped reports that a
// stop string was found: out is the text before it, and the stream takes no more input.
func (s *Stream) Push(piece []byte) (out string, stopped bool) {
	if s.stopped {
		return "", true
	}
	s.raw = append(s.raw, piece...)
	n := completePrefix(s.raw)
	text := s.held + strings.ToValidUTF8(string(s.raw[:n]), "\uFFFD")
	s.raw = append(s.raw[:0], s.raw[n:]...)
	s.held = ""

	if i, st := s.firstStop(text); i >= 0 {
		s.stopped, s.matched = true, st
		s.raw = nil
		return text[:i], true
	}
	h := s.holdBack(text)
	s.held = text[len(text)-h:]
	return text[:len(text)-h], false
}

// Flush returns everything still held back (at the end of generation); an incomplete
// trailing character becomes U+FFFD.
func (s *Stream) Flush() string {
	if s.stopped {
		return ""
	}
	out := s.held + strings.ToValidUTF8(string(s.raw), "\uFFFD")
	s.held, s.raw = "", nil
	return out
}

// Holding reports whether the stream holds back text it was pushed (an unfinished
// character, the start of a stop string).
func (s *Stream) Holding() bool { return len(s.raw) > 0 || s.held != "" }

// Stopped reports whether a stop string ended the stream.
func (s *Stream) Stopped() bool { return s.stopped }

// Matched is the stop string that ended the stream ("" while it has not).
func (s *Stream) Matched() string { return s.matched }

// firstStop finds the stop string that occurs first in text (the longest of those at
// the same place) and where.
func (s *Stream) firstStop(text string) (int, string) {
	best, which := -1, ""
	for _, st := range s.stops {
		if i := strings.Index(text, st); i >= 0 && (best < 0 || i < best || (i == best && len(st) > len(which))) {
			best, which = i, st
		}
	}
	return best, which
}

// holdBack is the length of the longest suffix of text that is a proper prefix of a
// stop string.
func (s *Stream) holdBack(text string) int {
	h := 0
	for _, st := range s.stops {
		for k := min(len(st)-1, len(text)); k > h; k-- {
			if strings.HasSuffix(text, st[:k]) {
				h = k
				break
			}
		}
	}
	return h
}

// completePrefix is the length of the longest prefix of b that does not end inside a
// UTF-8 character which later bytes could still complete.
func completePrefix(b []byte) int {
	// A character is at most 4 bytes: only the last 3 bytes can start an incomplete one.
	for i := len(b) - 1; i >= 0 && i >= len(b)-3; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return i
			}
			return len(b)
		}
	}
	return len(b)
}
