package speculate

import "fmt"

// A draft model: a smaller model that shares the target's vocabulary, run greedily
// beside it, proposes the tokens the target then verifies (Verify). Its tokens are
// the target's token ids, so its vocabulary must be the target's, id for id.

// Vocab is what VocabMismatch reads of a model's vocabulary.
type Vocab interface {
	NTokens() int
	BOS() int32
	EOS() int32
	// RawText is a token's stored text, TokenAttr its attributes (control, …).
	RawText(tok int32) string
	TokenAttr(tok int32) uint32
}

// VocabMismatch is why a draft model with vocabulary draft cannot draft for a target
// with vocabulary target ("" when it can): the same number of tokens, the same
// beginning and end of sequence, and every token the same text and kind.
func VocabMismatch(target, draft Vocab) string {
	const fix = "; a draft model must share the model's vocabulary (a smaller model of the same family and tokenizer)"
	if n, d := target.NTokens(), draft.NTokens(); n != d {
		return fmt.Sprintf("the draft model has %d tokens, the model %d%s", d, n, fix)
	}
	if b, d := target.BOS(), draft.BOS(); b != d {
		return fmt.Sprintf("the draft model's beginning of sequence is token %d, the model's %d%s", d, b, fix)
	}
	if e, d := target.EOS(), draft.EOS(); e != d {
		return fmt.Sprintf("the draft model's end of sequence is token %d, the model's %d%s", d, e, fix)
	}
	for i := range int32(target.NTokens()) {
		if t, d := target.RawText(i), draft.RawText(i); t != d {
			return fmt.Sprintf("token %d is %q in the draft model, %q in the model%s", i, d, t, fix)
		}
		if t, d := target.TokenAttr(i), draft.TokenAttr(i); t != d {
			return fmt.Sprintf("token %d (%q) is of kind %#x in the draft model, %#x in the model%s", i, target.RawText(i), d, t, fix)
		}
	}
	return ""
}
