package server

import (
	"bytes"
	"unicode/utf8"
)

// A vocabulary gives the prompt text of tokens and tokenizes text; alignPrompt
// tokenizes a prompt's tail with special tokens parsed and no BOS added. The loaded
// model (*llama.Model) is one.
type vocabulary interface {
	PromptText(tok int32) []byte
	Tokenize(text string, addSpecial, parseSpecial bool) ([]int32, error)
}

// alignPrompt makes a prompt's tokens continue a saved sequence as far as the
// prompt's text does. toks is the prompt text tokenized as usual; saved is what a
// slot or cached state holds: an earlier prompt and the tokens the model generated
// after it. A model's reply does not always re-tokenize into the tokens it generated
// ("ri"+"ver" generated, "river" re-tokenized), so the usual tokens of the next turn
// part from saved inside the reply, and everything after that point would be
// prefilled again. The aligned tokens are saved's tokens for as long as their text is
// the prompt's, then the rest of the text tokenized: the model reads the reply as the
// tokens it wrote. It returns toks itself when saved adds nothing or the vocabulary's
// texts do not spell the prompt (a tokenizer that inserts spaces, say).
func alignPrompt(v vocabulary, text string, toks, saved []int32, bos int32) []int32 {
	n := commonPrefix(toks, saved)
	if n == len(saved) {
		return toks
	}
	// The text the shared tokens spell; a BOS the tokenizer added has none.
	off := 0
	for i, t := range toks[:n] {
		p := v.PromptText(t)
		if i == 0 && t == bos && !hasPrefixAt(text, 0, p) {
			continue
		}
		if len(p) == 0 || !hasPrefixAt(text, off, p) {
			return toks
		}
		off += len(p)
	}
	// Follow saved while its tokens spell the text, remembering where each ends.
	k, ends := n, []int{off}
	for k < len(saved) {
		p := v.PromptText(saved[k])
		if len(p) == 0 || !hasPrefixAt(text, off, p) {
			break
		}
		off += len(p)
		ends = append(ends, off)
		k++
	}
	// The rest must start on a character: a token may end inside one.
	for k > n && off < len(text) && !utf8.RuneStart(text[off]) {
		ends = ends[:len(ends)-1]
		k--
		off = ends[len(ends)-1]
	}
	if k == n {
		return toks
	}
	var tail []int32
	if off < len(text) {
		var err error
		if tail, err = v.Tokenize(text[off:], false, true); err != nil || !spells(v, tail, text[off:]) {
			return toks
		}
	}
	out := make([]int32, 0, k+len(tail))
	return append(append(out, saved[:k]...), tail...)
}

func commonPrefix(a, b []int32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func hasPrefixAt(text string, off int, p []byte) bool {
	return len(text)-off >= len(p) && text[off:off+len(p)] == string(p)
}

// spells reports whether toks' texts make text exactly.
func spells(v vocabulary, toks []int32, text string) bool {
	var b bytes.Buffer
	for _, t := range toks {
		b.Write(v.PromptText(t))
	}
	return b.String() == text
}
