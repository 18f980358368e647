package corpus

import (
	"fmt"

	"github.com/ollama/ollama/tokenizer"

	"github.com/macfleet/macfleet/internal/chat"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// llama3Pretokenizer is the Llama 3 pre-tokenizer's split pattern (llama.cpp's
// "llama-bpe"): the same pieces the runner's tokenizer merges within.
const llama3Pretokenizer = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// Llama3 is the real Llama 3 vocabulary and Llama 3.1 chat template (tools and tool
// calls), both read from the module cache: what the trained model is written with.
type Llama3 struct {
	// Template is the chat template, rendered by the runner's own renderer.
	Template *chat.Template
	// Source is the template's Jinja text.
	Source string
	// Tokenizer is the vocabulary as the GGUF carries it.
	Tokenizer *ggufsynth.Tokenizer
	bpe       tokenizer.BytePairEncoding
}

// LoadLlama3 reads the vocabulary and the template.
func LoadLlama3() (*Llama3, error) {
	tok, err := testassets.Llama3Tokenizer()
	if err != nil {
		return nil, fmt.Errorf("reading the Llama 3 vocabulary: %w", err)
	}
	tmpl, err := testassets.Find("llama3-instruct", "tool_calls")
	if err != nil {
		return nil, fmt.Errorf("finding the Llama 3.1 chat template: %w", err)
	}
	t, err := chat.NewTemplate(tmpl.Source, tok.Tokens[tok.BOS], tok.Tokens[tok.EOS])
	if err != nil {
		return nil, fmt.Errorf("parsing the Llama 3.1 chat template: %w", err)
	}
	vocab := &tokenizer.Vocabulary{Values: tok.Tokens, Types: tok.Types, Merges: tok.Merges,
		BOS: []int32{int32(tok.BOS)}, EOS: []int32{int32(tok.EOS)}, AddBOS: tok.AddBOS}
	return &Llama3{Template: t, Source: tmpl.Source, Tokenizer: tok,
		bpe: tokenizer.NewBytePairEncoding(vocab, llama3Pretokenizer)}, nil
}

// Encode tokenizes text as the runner tokenizes a rendered prompt: special token
// texts become their tokens, and no BOS is added (the rendered text carries it).
func (l *Llama3) Encode(text string) ([]int32, error) {
	return l.bpe.Encode(text, false)
}

// Decode is the text of ids.
func (l *Llama3) Decode(ids []int32) (string, error) {
	return l.bpe.Decode(ids)
}
