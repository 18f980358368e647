package server

import "slices"

// readAsGenerated reads a continued answer (runnerapi.HeaderContinuedTokenIDs) as the
// tokens the model generated, ids, instead of its text tokenized anew: a model does
// not always write the canonical tokens of its own text, and the same text in other
// tokens continues differently. prompt is the rendered prompt with the answer open at
// its end, toks its usual tokens and head the tokens of what comes before the answer.
// The answer is read as ids for as far as their texts spell it, the rest of it
// tokenized as usual (alignPrompt), so the prompt's text never changes: ids that
// spell other text, or that are outside the vocabulary of nVocab tokens, leave toks as
// they are. used is how many of ids the tokens returned start the answer with.
func readAsGenerated(v vocabulary, prompt string, toks, head, ids []int32, nVocab int, bos int32) (out []int32, used int) {
	if len(ids) == 0 {
		return toks, 0
	}
	for _, id := range ids {
		if id < 0 || int(id) >= nVocab {
			return toks, 0
		}
	}
	saved := append(slices.Clip(head), ids...)
	out = alignPrompt(v, prompt, toks, saved, bos)
	return out, max(commonPrefix(out, saved)-len(head), 0)
}
