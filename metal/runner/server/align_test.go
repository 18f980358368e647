package server

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// testVocab is a small vocabulary whose tokenizer takes the longest token at each
// position, as a BPE's merges mostly do; "<s>" is BOS and "<eot>" a control token.
type testVocab struct {
	texts []string
	// spaceFirst: the tokenizer puts a space before every text it is given, as
	// SentencePiece's add_space_prefix does; tailSpace: only before a text that starts
	// a call, not inside a prompt (as SentencePiece does after a control token).
	spaceFirst, tailSpace bool
}

func newTestVocab(texts ...string) *testVocab {
	return &testVocab{texts: append([]string{"<s>", "<eot>"}, texts...)}
}

func (v *testVocab) id(s string) int32 {
	i := slices.Index(v.texts, s)
	if i < 0 {
		panic("no token " + s)
	}
	return int32(i)
}

func (v *testVocab) ids(ss ...string) []int32 {
	out := make([]int32, len(ss))
	for i, s := range ss {
		out[i] = v.id(s)
	}
	return out
}

func (v *testVocab) PromptText(tok int32) []byte {
	if tok < 0 || int(tok) >= len(v.texts) {
		return nil
	}
	return []byte(v.texts[tok])
}

// Tokenize tokenizes a prompt's tail, as alignPrompt asks: special tokens parsed, no
// BOS (the flags are not read).
func (v *testVocab) Tokenize(text string, _, _ bool) ([]int32, error) {
	if v.tailSpace {
		text = " " + text
	}
	return v.longest(text)
}

func (v *testVocab) longest(text string) ([]int32, error) {
	if v.spaceFirst {
		text = " " + text
	}
	var out []int32
	for text != "" {
		best := -1
		for i, t := range v.texts {
			if i > 0 && strings.HasPrefix(text, t) && (best < 0 || len(t) > len(v.texts[best])) {
				best = i
			}
		}
		if best < 0 {
			return nil, errors.New("untokenizable")
		}
		out = append(out, int32(best))
		text = text[len(v.texts[best]):]
	}
	return out, nil
}

func (v *testVocab) tokenize(text string) []int32 {
	toks, err := v.longest(text)
	if err != nil {
		panic(err)
	}
	return append([]int32{0}, toks...) // BOS added by the tokenizer, not in the text
}

func TestAlignPrompt(t *testing.T) {
	v := newTestVocab("user:", "bot:", " ", "ri", "ver", "river", "stone", "é", "\xc3", "\xa9", "!", "x")
	// The first turn's prompt, and the reply the model generated as "ri"+"ver" where
	// the tokenizer reads "river".
	first := "user: stone bot:"
	generated := v.ids(" ", "ri", "ver", " ", "stone")
	saved := append(v.tokenize(first), generated...)
	next := first + " river stone<eot>user: x"

	cases := []struct {
		name  string
		vocab *testVocab
		text  string
		saved []int32
		want  []int32 // nil: the usual tokens
	}{{
		name:  "the reply is read as generated",
		text:  next,
		saved: saved,
		want:  append(slices.Clone(saved), v.ids("<eot>", "user:", " ", "x")...),
	}, {
		name:  "saved adds nothing beyond the usual tokens",
		text:  next,
		saved: v.tokenize(first),
	}, {
		name:  "an edited reply aligns up to the edit",
		text:  first + " river!<eot>user: x",
		saved: saved,
		want:  append(v.tokenize(first+" ri"), v.ids("ver", "!", "<eot>", "user:", " ", "x")...),
	}, {
		name:  "a token ending inside a character is taken back",
		text:  first + " éé!",
		saved: append(v.tokenize(first), v.ids(" ", "\xc3", "\xa9", "\xc3", "x")...),
		want:  append(v.tokenize(first), v.ids(" ", "\xc3", "\xa9", "é", "!")...),
	}, {
		name:  "the prompt ends inside the saved tokens",
		text:  first + " river",
		saved: saved,
		want:  append(v.tokenize(first), v.ids(" ", "ri", "ver")...),
	}, {
		name:  "shared tokens that do not spell the text",
		text:  next,
		saved: saved,
		vocab: &testVocab{texts: v.texts, spaceFirst: true},
	}, {
		name:  "a tail that does not spell the text",
		text:  next,
		saved: saved,
		vocab: &testVocab{texts: v.texts, tailSpace: true},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			voc := v
			if tc.vocab != nil {
				voc = tc.vocab
			}
			toks := voc.tokenize(tc.text)
			got := alignPrompt(voc, tc.text, toks, tc.saved, 0)
			want := tc.want
			if want == nil {
				want = toks
			}
			if !slices.Equal(got, want) {
				t.Fatalf("aligned %v, want %v (usual %v)", got, want, toks)
			}
			if tc.want != nil && !spells(voc, got[1:], tc.text) {
				t.Errorf("aligned tokens %v do not spell %q", got, tc.text)
			}
			if tc.want != nil && commonPrefix(got, tc.saved) <= commonPrefix(toks, tc.saved) {
				t.Errorf("alignment shares %d tokens with saved, the usual tokens %d", commonPrefix(got, tc.saved), commonPrefix(toks, tc.saved))
			}
		})
	}
}
