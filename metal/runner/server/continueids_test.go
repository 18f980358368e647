package server

import (
	"slices"
	"testing"
)

func TestReadAsGenerated(t *testing.T) {
	v := newTestVocab("user:", "bot:", " ", "ri", "ver", "river", "stone", "!", "x")
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
	}{{
		name:     "the answer is read as the tokens generated",
		prompt:   prompt,
		ids:      generated,
		want:     append(slices.Clone(head), generated...),
		wantUsed: len(generated),
	}, {
		name:     "ids past the text (held back from the client) are not read",
		prompt:   before + " river",
		ids:      generated,
		want:     append(slices.Clone(head), v.ids(" ", "ri", "ver")...),
		wantUsed: 3,
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
			got, used := readAsGenerated(v, tc.prompt, usual, head, tc.ids, len(v.texts), 0)
			want := tc.want
			if want == nil {
				want = usual
			}
			if !slices.Equal(got, want) || used != tc.wantUsed {
				t.Fatalf("read as %v using %d ids, want %v using %d (usual %v)", got, used, want, tc.wantUsed, usual)
			}
			if !spells(v, got[1:], tc.prompt) {
				t.Errorf("tokens %v do not spell %q", got, tc.prompt)
			}
		})
	}
}
