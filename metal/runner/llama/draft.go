//go:build cgo && !race

package llama

// What a draft model (speculative decoding) needs of the bindings: the greedy token
// of a row of logits, and the vocabulary a draft must share with its target.

/*
#include "llama.h"
#include "direct.h"
*/
import "C"

import "unsafe"

// Argmax is the token of row l of m's logits with the highest logit (greedy
// decoding; the lowest id among equals). It touches no context.
func (l Logits) Argmax(m *Model) int32 {
	n := m.NVocab()
	if l.p == nil || n == 0 {
		return -1
	}
	return int32(C.mf_argmax(l.p, C.int32_t(n)))
}

// At is row l's logit of tok, 0 for a token outside m's vocabulary or no row.
func (l Logits) At(m *Model, tok int32) float32 {
	if l.p == nil || tok < 0 || int(tok) >= m.NVocab() {
		return 0
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(l.p)), m.NVocab())[tok]
}

// NTokens is the vocabulary's size (NVocab; the name speculate.Vocab asks for).
func (m *Model) NTokens() int { return m.NVocab() }

// TokenAttr is the vocabulary's attributes of tok (llama_token_attr: normal,
// control, user-defined …), 0 for an id outside the vocabulary.
func (m *Model) TokenAttr(tok int32) uint32 {
	if tok < 0 || int(tok) >= m.NVocab() {
		return 0
	}
	return uint32(C.llama_vocab_get_attr(m.vocab, C.llama_token(tok)))
}

// RawText is the vocabulary's own text of tok (llama_vocab_get_text: the stored
// piece, before any decoding), "" for an id outside the vocabulary.
func (m *Model) RawText(tok int32) string {
	if tok < 0 || int(tok) >= m.NVocab() {
		return ""
	}
	return C.GoString(C.llama_vocab_get_text(m.vocab, C.llama_token(tok)))
}
