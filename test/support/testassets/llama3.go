package testassets

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// Llama 3 special tokens follow the 128,000 BPE tokens.
const (
	Llama3BeginOfText  = 128000
	Llama3EndOfText    = 128001
	Llama3StartHeader  = 128006
	Llama3EndHeader    = 128007
	Llama3EndOfMessage = 128008
	Llama3EndOfTurn    = 128009
	Llama3PythonTag    = 128010
	llama3Vocab        = 128256
)

// Llama3Tokenizer is the real Llama 3.2 byte-level BPE vocabulary (128,000 tokens and
// their merges from the module's test data) with the 256 special tokens of the
// Llama 3 instruct models, ready for ggufsynth.
func Llama3Tokenizer() (*ggufsynth.Tokenizer, error) {
	encPath, err := Path("tokenizer/testdata/llama3.2/encoder.json")
	if err != nil {
		return nil, err
	}
	bpePath, err := Path("tokenizer/testdata/llama3.2/vocab.bpe")
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(encPath)
	if err != nil {
		return nil, err
	}
	var enc map[string]int
	if err := json.Unmarshal(b, &enc); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", encPath, err)
	}
	t := &ggufsynth.Tokenizer{Model: "gpt2", Pre: "llama-bpe", Tokens: make([]string, llama3Vocab),
		Types: make([]int32, llama3Vocab), BOS: Llama3BeginOfText, EOS: Llama3EndOfTurn, EOT: Llama3EndOfTurn, AddBOS: true}
	for tok, id := range enc {
		if id < 0 || id >= Llama3BeginOfText {
			return nil, fmt.Errorf("%s: token id %d out of range", encPath, id)
		}
		t.Tokens[id], t.Types[id] = tok, ggufsynth.TokenNormal
	}
	special := map[int]string{
		Llama3BeginOfText: "<|begin_of_text|>", Llama3EndOfText: "<|end_of_text|>",
		Llama3StartHeader: "<|start_header_id|>", Llama3EndHeader: "<|end_header_id|>",
		Llama3EndOfMessage: "<|eom_id|>", Llama3EndOfTurn: "<|eot_id|>", Llama3PythonTag: "<|python_tag|>",
		128004: "<|finetune_right_pad_id|>",
	}
	reserved := 0
	for id := Llama3BeginOfText; id < llama3Vocab; id++ {
		name, ok := special[id]
		if !ok {
			name = fmt.Sprintf("<|reserved_special_token_%d|>", reserved)
			reserved++
		}
		t.Tokens[id], t.Types[id] = name, ggufsynth.TokenControl
	}
	for id, tok := range t.Tokens[:Llama3BeginOfText] {
		if tok == "" {
			return nil, fmt.Errorf("%s has no token %d", encPath, id)
		}
	}
	f, err := os.Open(bpePath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#version") || line == "" {
			continue
		}
		t.Merges = append(t.Merges, line)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return t, nil
}

// Llama31Spec is a small random-weight model with the real Llama 3 vocabulary and
// the real Llama 3.1 chat template (tools and tool calls): real prompts, real
// tokenization, nonsense answers.
func Llama31Spec() (ggufsynth.Spec, error) {
	tok, err := Llama3Tokenizer()
	if err != nil {
		return ggufsynth.Spec{}, err
	}
	tmpl, err := Find("llama3-instruct", "tool_calls")
	if err != nil {
		return ggufsynth.Spec{}, err
	}
	return ggufsynth.Spec{Name: "macfleet-llama31-vocab", Vocab: llama3Vocab, Embd: 64, Layers: 2, Heads: 4, KVHeads: 2,
		FF: 128, Ctx: 8192, DType: ggufsynth.F16, Seed: 3, Tokenizer: tok, ChatTemplate: tmpl.Source}, nil
}

// CoderContextLength is the context CoderSpec's model is trained for: the coding
// agents' system prompt and tools are 9k to 20k tokens, by client and version.
const CoderContextLength = 32768

// CoderSpec is the model a coding agent (Claude Code, Codex CLI) can talk to on the
// local fleet: Llama31Spec's vocabulary and chat template on one narrow layer, trained
// for CoderContextLength and steered to answer "Hi" and end its turn. The clients
// treat an answer cut at its token limit as an error, and random weights never end
// one; prefilling a 20k-token prompt is mostly attention, which one narrow layer keeps
// cheap.
func CoderSpec() (ggufsynth.Spec, error) {
	spec, err := Llama31Spec()
	if err != nil {
		return spec, err
	}
	hi := slices.Index(spec.Tokenizer.Tokens, "Hi")
	if hi < 0 || spec.Tokenizer.EOT < 0 {
		return spec, fmt.Errorf("the Llama 3 vocabulary has no token Hi (%d) or no end of turn (%d)", hi, spec.Tokenizer.EOT)
	}
	spec.Name, spec.Ctx, spec.Untied = "macfleet-coder", CoderContextLength, true
	spec.Embd, spec.Heads, spec.KVHeads, spec.FF, spec.Layers = 32, 2, 1, 64, 1
	spec.Reply = &ggufsynth.Reply{Token: hi, End: spec.Tokenizer.EOT}
	return spec, nil
}
