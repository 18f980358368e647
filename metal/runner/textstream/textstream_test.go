package textstream

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestStream(t *testing.T) {
	euro := []byte("€") // 3 bytes
	tests := []struct {
		name        string
		stops       []string
		pieces      [][]byte
		wantChunks  []string // output of each Push
		wantFlush   string
		wantStopped bool
		wantMatched string
	}{
		{
			name:       "plain text passes through",
			pieces:     [][]byte{[]byte("Hello"), []byte(" world")},
			wantChunks: []string{"Hello", " world"},
		},
		{
			name:       "a split character is held until complete",
			pieces:     [][]byte{euro[:1], euro[1:2], append(euro[2:3:3], 'x')},
			wantChunks: []string{"", "", "€x"},
		},
		{
			name:       "an incomplete character at the end becomes U+FFFD",
			pieces:     [][]byte{[]byte("a"), euro[:2]},
			wantChunks: []string{"a", ""},
			wantFlush:  "\uFFFD",
		},
		{
			name:       "invalid bytes are replaced, not held",
			pieces:     [][]byte{{0xFF, 'a'}, {0x80}},
			wantChunks: []string{"\uFFFDa", "\uFFFD"},
		},
		{
			name:        "a stop string inside one piece cuts the text",
			stops:       []string{"END"},
			pieces:      [][]byte{[]byte("abcENDdef"), []byte("more")},
			wantChunks:  []string{"abc", ""},
			wantStopped: true,
			wantMatched: "END",
		},
		{
			name:        "a stop string across pieces is never sent",
			stops:       []string{"</s>"},
			pieces:      [][]byte{[]byte("ok <"), []byte("/"), []byte("s>tail")},
			wantChunks:  []string{"ok ", "", ""},
			wantStopped: true,
			wantMatched: "</s>",
		},
		{
			name:       "a false start is released once it diverges",
			stops:      []string{"STOP"},
			pieces:     [][]byte{[]byte("xST"), []byte("x")},
			wantChunks: []string{"x", "STx"},
		},
		{
			name:       "held text is flushed at the end",
			stops:      []string{"STOP"},
			pieces:     [][]byte{[]byte("abST")},
			wantChunks: []string{"ab"},
			wantFlush:  "ST",
		},
		{
			name:        "the earliest of several stops wins",
			stops:       []string{"zz", "b"},
			pieces:      [][]byte{[]byte("abzz")},
			wantChunks:  []string{"a"},
			wantStopped: true,
			wantMatched: "b",
		},
		{
			name:        "of stops at the same place the longest is the one matched",
			stops:       []string{"en", "end"},
			pieces:      [][]byte{[]byte("the end")},
			wantChunks:  []string{"the "},
			wantStopped: true,
			wantMatched: "end",
		},
		{
			name:       "empty stop strings are ignored",
			stops:      []string{""},
			pieces:     [][]byte{[]byte("abc")},
			wantChunks: []string{"abc"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(tt.stops)
			var got []string
			for _, p := range tt.pieces {
				out, _ := s.Push(p)
				got = append(got, out)
			}
			if d := cmp.Diff(tt.wantChunks, got); d != "" {
				t.Errorf("chunks (-want +got):\n%s", d)
			}
			if f := s.Flush(); f != tt.wantFlush {
				t.Errorf("Flush() = %q, want %q", f, tt.wantFlush)
			}
			if s.Stopped() != tt.wantStopped {
				t.Errorf("Stopped() = %v, want %v", s.Stopped(), tt.wantStopped)
			}
			if s.Matched() != tt.wantMatched {
				t.Errorf("Matched() = %q, want %q", s.Matched(), tt.wantMatched)
			}
		})
	}
}

// Whatever the split of the input into pieces, the concatenated output equals the
// input cut at the first stop string.
func TestStreamSplitInvariance(t *testing.T) {
	input := []byte("héllo wörld → STOP after")
	want := "héllo wörld → "
	for size := 1; size <= len(input); size++ {
		s := New([]string{"STOP"})
		var b strings.Builder
		for i := 0; i < len(input); i += size {
			out, stopped := s.Push(input[i:min(i+size, len(input))])
			b.WriteString(out)
			if stopped {
				break
			}
		}
		b.WriteString(s.Flush())
		if b.String() != want {
			t.Errorf("piece size %d: got %q, want %q", size, b.String(), want)
		}
	}
}
