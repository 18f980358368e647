package server

import (
	"slices"
	"testing"
	"unicode/utf8"
)

// pieceVocab is a testVocab whose "<s>" and "<eot>" are control tokens: they add no
// text to the output.
type pieceVocab struct{ *testVocab }

func (v pieceVocab) Piece(tok int32) []byte {
	if tok <= 1 {
		return nil
	}
	return v.PromptText(tok)
}

func TestReadAsGenerated(t *testing.T) {
	v := newTestVocab("user:", "bot:", " ", "ri", "ver", "river", "stone", "!", "x", "\xeb", "1", "\xc3", "\xa9", "\ufffd")
	before := "user: stone bot:"
	head := v.tokenize(before)
	answer := " river stone"
	prompt := before + answer
	toks := v.tokenize(prompt) // "river" as one token
	generated := v.ids(" ", "ri", "ver", " ", "stone")

	cases := []struct {
		name     string
		prompt   string
		ids      []int32
		want     []int32 // nil: the usual tokens
		wantUsed int
		// spellsMore: the tokens spell the prompt with a control token's text more, or
		// the text held back.
		spellsMore bool
		held       []int32
	}{{
		name:     "the answer is read as the tokens generated",
		prompt:   prompt,
		ids:      generated,
		want:     append(slices.Clone(head), generated...),
		wantUsed: len(generated),
	}, {
		name:     "ids past the text (held back from the client) are read, their text to send",
		prompt:   before + " river",
		ids:      generated,
		want:     append(slices.Clone(head), generated...),
		wantUsed: 5, held: v.ids(" ", "stone"), spellsMore: true,
	}, {
		name:     "fewer ids than the text: the rest tokenized as usual",
		prompt:   prompt + "!",
		ids:      generated[:3],
		want:     append(append(slices.Clone(head), generated[:3]...), v.ids(" ", "stone", "!")...),
		wantUsed: 3,
	}, {
		name:     "ids that spell other text are read only up to where they part",
		prompt:   before + " river!",
		ids:      generated,
		want:     append(append(slices.Clone(head), generated[:3]...), v.ids("!")...),
		wantUsed: 3,
	}, {
		name:     "bytes that are not UTF-8 spell the U+FFFD the client has of each",
		prompt:   before + " \ufffd1\ufffd!",
		ids:      v.ids(" ", "\xeb", "1", "\xeb", "!"),
		want:     append(slices.Clone(head), v.ids(" ", "\xeb", "1", "\xeb", "!")...),
		wantUsed: 5,
	}, {
		name:     "a character in two tokens",
		prompt:   before + " \u00e9!",
		ids:      v.ids(" ", "\xc3", "\xa9", "!"),
		want:     append(slices.Clone(head), v.ids(" ", "\xc3", "\xa9", "!")...),
		wantUsed: 4,
	}, {
		name:     "a character's first byte, its text held back from the client, is read, its text to send",
		prompt:   before + " x",
		ids:      v.ids(" ", "x", "\xc3"),
		want:     append(slices.Clone(head), v.ids(" ", "x", "\xc3")...),
		wantUsed: 3, held: v.ids("\xc3"), spellsMore: true,
	}, {
		name:     "a character's first bytes in two tokens, then one that spells other text",
		prompt:   before + " x!",
		ids:      v.ids(" ", "x", "\xc3", "\xeb", "x"),
		want:     append(slices.Clone(head), v.ids(" ", "x", "!")...),
		wantUsed: 2,
	}, {
		name:   "a byte that is not UTF-8 where the text has another character",
		prompt: before + " x",
		ids:    v.ids(" ", "\xeb", "1"),
		want:   append(slices.Clone(head), v.ids(" ", "x")...), wantUsed: 1,
	}, {
		name:     "a control token the output did not show spells nothing",
		prompt:   before + " river",
		ids:      v.ids(" ", "ri", "<eot>", "ver"),
		want:     append(slices.Clone(head), v.ids(" ", "ri", "<eot>", "ver")...),
		wantUsed: 4, spellsMore: true,
	}, {
		name:     "a control token the output showed spells its text",
		prompt:   before + " ri<eot>ver",
		ids:      v.ids(" ", "ri", "<eot>", "ver"),
		want:     append(slices.Clone(head), v.ids(" ", "ri", "<eot>", "ver")...),
		wantUsed: 4,
	}, {
		name:   "an id outside the vocabulary: the usual tokens",
		prompt: prompt,
		ids:    append(slices.Clone(generated[:2]), int32(len(v.texts))),
	}, {
		name:   "no ids: the usual tokens",
		prompt: prompt,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			usual := v.tokenize(tc.prompt)
			if tc.prompt == prompt && !slices.Equal(usual, toks) {
				t.Fatalf("usual tokens %v, want %v", usual, toks)
			}
			content := tc.prompt[len(before):]
			got, used, held := readAsGenerated(pieceVocab{v}, tc.prompt, len(before), content, usual, head, tc.ids, len(v.texts))
			if !slices.Equal(held, tc.held) {
				t.Errorf("held %v, want %v", held, tc.held)
			}
			want := tc.want
			if want == nil {
				want = usual
			}
			if !slices.Equal(got, want) || used != tc.wantUsed {
				t.Fatalf("read as %v using %d ids, want %v using %d (usual %v)", got, used, want, tc.wantUsed, usual)
			}
			var text []byte
			for _, tok := range got[1:] {
				text = append(text, v.PromptText(tok)...)
			}
			if s := lossy(text); s != tc.prompt && !tc.spellsMore {
				t.Errorf("tokens %v spell %q, want %q", got, text, tc.prompt)
			}
		})
	}
}

// lossy is text as a JSON string carries it: each byte that is not UTF-8 a U+FFFD.
func lossy(text []byte) string {
	var out []byte
	for len(text) > 0 {
		r, size := utf8.DecodeRune(text)
		if r == utf8.RuneError && size == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, text[:size]...)
		}
		text = text[size:]
	}
	return string(out)
}
