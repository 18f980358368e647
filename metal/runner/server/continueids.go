package server

import (
	"strings"

	"github.com/macfleet/macfleet/metal/runner/textstream"
)

// readAsGenerated reads a continued answer (runnerapi.HeaderContinuedTokenIDs) as the
// tokens the model generated, ids, instead of its text tokenized anew: a model does
// not always write the canonical tokens of its own text, and the same text in other
// tokens continues differently. prompt is the rendered prompt with the answer open at
// prompt[open:], content the final message's content (what the client has of the
// answer's text), head the tokens of prompt[:open] and toks the prompt's usual tokens.
//
// The answer is read as ids for as far as their texts spell it as the runner's output
// did (spelled). When they spell all of it and the answer ends with content, the ids
// left are tokens whose text the client never got (held back: a character not
// finished, the start of a stop string or of a marker): they are read too, and held is
// them, whose text the continuation's output must start with. Otherwise the rest of
// the answer is tokenized as usual. Ids outside the vocabulary of nVocab tokens, or a
// rest whose tokens do not spell it, leave toks as they are. used is how many of ids
// were read.
func readAsGenerated(v generatedVocab, prompt string, open int, content string, toks, head, ids []int32,
	nVocab int) (out []int32, used int, held []int32) {
	for _, id := range ids {
		if id < 0 || int(id) >= nVocab {
			return toks, 0, nil
		}
	}
	answer := prompt[open:]
	used, off := spelled(v, answer, ids)
	if off == len(answer) && used < len(ids) && strings.HasSuffix(answer, content) {
		used, held = len(ids), ids[used:]
	}
	if used == 0 {
		return toks, 0, nil
	}
	var tail []int32
	if off < len(answer) {
		var err error
		if tail, err = v.Tokenize(answer[off:], false, true); err != nil || !spells(v, tail, answer[off:]) {
			return toks, 0, nil
		}
	}
	out = make([]int32, 0, len(head)+used+len(tail))
	return append(append(append(out, head...), ids[:used]...), tail...), used, held
}

// generatedVocab is a vocabulary that also gives the text a generated token adds to
// the output: none for a control token (the output shows only the markers its parser
// needs, as their prompt text). The loaded model (*llama.Model) is one.
type generatedVocab interface {
	vocabulary
	Piece(tok int32) []byte
}

// spelled is how many of ids, from the first, spell the start of answer as the
// runner's output spelled them (textstream: a character whole, bytes that are not
// UTF-8 as U+FFFD), with nothing held back after them, and the bytes of answer they
// spell. A control token spells its text where the answer has it, else nothing.
func spelled(v generatedVocab, answer string, ids []int32) (used, off int) {
	ts := textstream.New(nil)
	pos := 0
	for k, id := range ids {
		p := v.Piece(id)
		if len(p) == 0 {
			if ts.Holding() {
				continue
			}
			if c := v.PromptText(id); hasPrefixAt(answer, pos, c) {
				pos += len(c)
			}
			used, off = k+1, pos
			continue
		}
		text, _ := ts.Push(p)
		if !strings.HasPrefix(answer[pos:], text) {
			return used, off
		}
		pos += len(text)
		if !ts.Holding() {
			used, off = k+1, pos
		}
	}
	return used, off
}
