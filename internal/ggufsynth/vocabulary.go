package ggufsynth

import "fmt"

// Vocabulary returns the tokens, scores and token types of a vocabulary of n entries:
// control tokens, the 256 byte tokens, then ordinary tokens (the word-start marker,
// printable ASCII, then letter n-grams) until n is reached. Ordinary tokens listed
// earlier get higher scores, so the tokenizer prefers them when merging.
func Vocabulary(n int) ([]string, []float32, []int32) {
	tokens := make([]string, 0, n)
	types := make([]int32, 0, n)
	add := func(tok string, typ int32) {
		if len(tokens) < n {
			tokens = append(tokens, tok)
			types = append(types, typ)
		}
	}
	add("<unk>", tokenTypeUnknown)
	add("<s>", tokenTypeControl)
	add("</s>", tokenTypeControl)
	add("<|im_start|>", tokenTypeControl)
	add("<|im_end|>", tokenTypeControl)
	for b := range 256 {
		add(fmt.Sprintf("<0x%02X>", b), tokenTypeByte)
	}
	const space = "\u2581" // SentencePiece word-start marker
	add(space, tokenTypeNormal)
	for c := byte('!'); c <= '~'; c++ {
		add(string(c), tokenTypeNormal)
	}
	// n-grams of lowercase letters, optionally prefixed by the word-start marker,
	// shortest first; enumerated as base-27 numbers so the order is fixed.
	firsts := make([]string, 0, 27)
	firsts = append(firsts, space)
	for c := 'a'; c <= 'z'; c++ {
		firsts = append(firsts, string(c))
	}
	for length := 2; len(tokens) < n; length++ {
		total := 27
		for range length - 1 {
			total *= 26
		}
		for i := 0; i < total && len(tokens) < n; i++ {
			rest := make([]byte, length-1)
			v := i
			for j := length - 2; j >= 0; j-- {
				rest[j] = byte('a' + v%26)
				v /= 26
			}
			add(firsts[v]+string(rest), tokenTypeNormal)
		}
	}
	scores := make([]float32, len(tokens))
	for i := FirstNormalToken; i < len(tokens); i++ {
		scores[i] = -float32(i - FirstNormalToken)
	}
	return tokens, scores, types
}
