package ggufsynth

import (
	"errors"
	"fmt"

	"github.com/ollama/ollama/fs/ggml"
)

// Tokenizer is a real vocabulary to write into a model instead of the synthetic one:
// a byte-level BPE (tokenizer.ggml.model "gpt2") with its merges, or a SentencePiece
// vocabulary ("llama") with scores.
type Tokenizer struct {
	// Model is "gpt2" (byte-level BPE) or "llama" (SentencePiece).
	Model string
	// Pre is the BPE pre-tokenizer llama.cpp applies ("llama-bpe" for Llama 3).
	Pre string
	// Tokens, in id order, and their types (TokenNormal, TokenControl, ...).
	Tokens []string
	Types  []int32
	// Scores are SentencePiece scores (nil for BPE).
	Scores []float32
	// Merges are the BPE merges, "a b" each, highest priority first.
	Merges []string
	// BOS, EOS and EOT are token ids; EOT < 0 when the vocabulary has none.
	BOS, EOS, EOT int
	// AddBOS makes the tokenizer prepend BOS.
	AddBOS bool
}

// Token types as llama.cpp reads tokenizer.ggml.token_type.
const (
	TokenNormal      = tokenTypeNormal
	TokenControl     = tokenTypeControl
	TokenUserDefined = int32(4)
	TokenByte        = tokenTypeByte
)

func (t *Tokenizer) validate(vocab int) error {
	switch {
	case t.Model != "gpt2" && t.Model != "llama":
		return fmt.Errorf("tokenizer model %q is not gpt2 or llama", t.Model)
	case len(t.Tokens) != vocab || len(t.Types) != vocab:
		return fmt.Errorf("tokenizer has %d tokens and %d types, want the vocab size %d", len(t.Tokens), len(t.Types), vocab)
	case t.Model == "gpt2" && len(t.Merges) == 0:
		return errors.New("a gpt2 tokenizer needs merges")
	case t.Model == "llama" && len(t.Scores) != vocab:
		return errors.New("a llama tokenizer needs a score per token")
	case t.BOS < 0 || t.BOS >= vocab || t.EOS < 0 || t.EOS >= vocab || t.EOT >= vocab:
		return errors.New("special token ids out of range")
	}
	return nil
}

// tokenizerKV is the tokenizer metadata of a real vocabulary.
func (t *Tokenizer) kv(kv ggml.KV) {
	kv["tokenizer.ggml.model"] = t.Model
	kv["tokenizer.ggml.tokens"] = t.Tokens
	kv["tokenizer.ggml.token_type"] = t.Types
	kv["tokenizer.ggml.bos_token_id"] = uint32(t.BOS)
	kv["tokenizer.ggml.eos_token_id"] = uint32(t.EOS)
	kv["tokenizer.ggml.add_bos_token"] = t.AddBOS
	kv["tokenizer.ggml.add_eos_token"] = false
	delete(kv, "tokenizer.ggml.unknown_token_id")
	delete(kv, "tokenizer.ggml.eot_token_id")
	delete(kv, "tokenizer.ggml.scores")
	if t.EOT >= 0 {
		kv["tokenizer.ggml.eot_token_id"] = uint32(t.EOT)
	}
	if t.Model == "gpt2" {
		kv["tokenizer.ggml.merges"] = t.Merges
		if t.Pre != "" {
			kv["tokenizer.ggml.pre"] = t.Pre
		}
	} else {
		kv["tokenizer.ggml.scores"] = t.Scores
	}
}
