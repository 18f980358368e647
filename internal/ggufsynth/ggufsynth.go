// Package ggufsynth writes small GGUF models with deterministic pseudo-random weights,
// a byte-level SentencePiece-style vocabulary and a chatml chat template: dense
// Llama-shaped ones, and those of the other families llama.cpp runs (Family: mixture
// of experts, sliding-window attention, hybrid recurrent layers). Nothing can be
// downloaded from a model hub here, so every test that needs a real model synthesizes
// one; the same Spec always produces the same bytes, and greedy generation on the
// result is deterministic.
package ggufsynth

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ollama/ollama/fs/ggml"
	"github.com/x448/float16"
)

// DType is the storage type of the weight matrices (norm vectors are always F32).
type DType string

const (
	// F16 stores matrices as IEEE half floats.
	F16 DType = "f16"
	// F32 stores matrices as single floats.
	F32 DType = "f32"
	// Q8_0 stores matrices in blocks of 32 int8 values with one f16 scale.
	Q8_0 DType = "q8_0"
	// Q4_0 stores matrices in blocks of 32 4-bit values with one f16 scale.
	Q4_0 DType = "q4_0"
)

// blockSize is the number of values in one block of a quantized type.
const blockSize = 32

// ChatMLTemplate is the Jinja chat template written into every model; llama.cpp
// recognises it as chatml.
const ChatMLTemplate = "{% for message in messages %}" +
	"{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}" +
	"{% endfor %}" +
	"{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

// Special token ids. Byte tokens <0x00>..<0xFF> follow at FirstByteToken. As in
// chatml models, the end of a turn (<|im_end|>) is the end-of-sequence token.
const (
	UnknownToken   = 0 // <unk>
	BOSToken       = 1 // <s>
	EndOfText      = 2 // </s>
	IMStartToken   = 3 // <|im_start|>
	IMEndToken     = 4 // <|im_end|>
	EOSToken       = IMEndToken
	FirstByteToken = 5
	// FirstNormalToken is the id of the first ordinary (merged) token.
	FirstNormalToken = FirstByteToken + 256
)

// token types as llama.cpp reads tokenizer.ggml.token_type.
const (
	tokenTypeNormal  int32 = 1
	tokenTypeUnknown int32 = 2
	tokenTypeControl int32 = 3
	tokenTypeByte    int32 = 6
)

// Spec describes a model to synthesize. The zero value is not useful; start from a
// preset (Tiny, Small, Mid) and override fields.
type Spec struct {
	// Name goes to general.name.
	Name string
	// Vocab is the vocabulary size, at least FirstNormalToken+96.
	Vocab int
	// Embd is the embedding (hidden) size; a multiple of Heads.
	Embd int
	// Layers is the number of transformer blocks.
	Layers int
	// Heads is the number of attention heads.
	Heads int
	// KVHeads is the number of key/value heads (grouped-query attention); divides Heads.
	KVHeads int
	// FF is the feed-forward (SwiGLU) hidden size.
	FF int
	// Ctx is the training context length written to the model.
	Ctx int
	// DType is the storage type of the weight matrices.
	DType DType
	// Untied writes a separate output projection (output.weight) instead of reusing
	// the token embedding.
	Untied bool
	// Seed selects the pseudo-random weights.
	Seed uint64
	// Tokenizer, when set, is a real vocabulary written instead of the synthetic one
	// (Vocab must equal its size).
	Tokenizer *Tokenizer
	// ChatTemplate, when set, replaces ChatMLTemplate.
	ChatTemplate string
	// Reply, when set, steers the otherwise random weights so that the model answers
	// every prompt with one token and then ends its turn (needs Untied).
	Reply *Reply
	// RopeBase is the rotary embedding's frequency base (10000 when zero).
	RopeBase float32
	// Trained, when set, holds the values of every tensor by its GGUF name, in ggml
	// order (a matrix row by row, each row a whole input vector): a trained model's
	// weights written instead of the pseudo-random ones.
	Trained map[string][]float32
	// Family is the architecture written (Llama, the dense model above, when empty);
	// the other families need the parts below that they name (family.go).
	Family Family
	// KeyLength, when set, is the size of one attention head (attention.key_length
	// and value_length) instead of Embd/Heads.
	KeyLength int
	// Experts are the mixture-of-experts feed-forward layers (Qwen3MoE, GPTOSS,
	// Qwen3Next).
	Experts *Experts
	// Window is the sliding-window attention (GPTOSS, Gemma3).
	Window *Window
	// DeltaNet are the recurrent (gated delta-net) layers of a hybrid (Qwen3Next).
	DeltaNet *DeltaNet
}

// Reply is the fixed answer of a steered model: Token, then End (an end-of-generation
// token of the vocabulary). Clients that treat an answer cut at its token limit as an
// error need a model that stops on its own; random weights never do.
//
// The steering dominates the residual stream with one embedding dimension: every
// token's embedding but Token's is large in dimension 0, Token's in dimension 1; the
// output projection maps dimension 0 to Token and dimension 1 to End. The random
// layers add a few units per dimension, far below replyWeight, so whatever the
// prompt, the next token after any other token is Token and the next after Token is
// End, by a margin of tens of logits (greedy or sampled alike).
type Reply struct {
	Token, End int
}

// replyWeight is the steering embedding value, replyLogit the output projection's:
// after normalization the steered dimension is about sqrt(Embd) and the logit about
// replyLogit·sqrt(Embd).
const (
	replyWeight = 100
	replyLogit  = 10
)

// Tiny is a ≈2 MB model (vocab 512, embd 128, 2 layers) for fast functional tests.
func Tiny() Spec {
	return Spec{Name: "macfleet-tiny", Vocab: 512, Embd: 128, Layers: 2, Heads: 4, KVHeads: 2,
		FF: 512, Ctx: 2048, DType: F32, Seed: 1}
}

// Small is a ≈20 MB model.
func Small() Spec {
	return Spec{Name: "macfleet-small", Vocab: 8192, Embd: 384, Layers: 4, Heads: 6, KVHeads: 2,
		FF: 1152, Ctx: 4096, DType: F16, Seed: 1}
}

// Mid is a ≈175 MiB model (vocab 32000, embd 1024, 8 layers, 16 heads / 4 KV heads)
// used for throughput measurements.
func Mid() Spec {
	return Spec{Name: "macfleet-mid", Vocab: 32000, Embd: 1024, Layers: 8, Heads: 16, KVHeads: 4,
		FF: 1536, Ctx: 4096, DType: F16, Seed: 1}
}

// EightB is the shape of an 8B-parameter model (7.2 billion here: vocab 32000, embd
// 4096, 32 layers, 32 heads / 8 KV heads, FF 14336, context 16384, an untied output
// projection) with its matrices stored as dt: about 4.1 GB as Q4_0, 14.5 GB as F16. It
// is what the peer benchmark measures on a GPU (docs/benchmarks.md, "On the card").
func EightB(dt DType) Spec {
	return Spec{Name: "macfleet-8b-" + string(dt), Vocab: 32000, Embd: 4096, Layers: 32, Heads: 32, KVHeads: 8,
		FF: 14336, Ctx: 16384, DType: dt, Untied: true, Seed: 1}
}

// PresetNames are the names Preset knows.
var PresetNames = []string{"tiny", "small", "mid", "8b-q4_0", "8b-f16", "qwen3moe-30b-a3b-q4_0", "gpt-oss-20b-q4_0"}

// Preset returns the named preset, one of PresetNames.
func Preset(name string) (Spec, error) {
	switch name {
	case "tiny":
		return Tiny(), nil
	case "small":
		return Small(), nil
	case "mid":
		return Mid(), nil
	case "8b-q4_0":
		return EightB(Q4_0), nil
	case "8b-f16":
		return EightB(F16), nil
	case "qwen3moe-30b-a3b-q4_0":
		return Qwen3MoE30BA3B(Q4_0), nil
	case "gpt-oss-20b-q4_0":
		return GPTOSS20B(Q4_0), nil
	}
	return Spec{}, fmt.Errorf("unknown preset %q (want one of %s)", name, strings.Join(PresetNames, ", "))
}

// HeadDim is the size of one attention head.
func (s Spec) HeadDim() int {
	if s.KeyLength > 0 {
		return s.KeyLength
	}
	return s.Embd / s.Heads
}

// EmbdKV is the width of the key (and value) projection.
func (s Spec) EmbdKV() int { return s.HeadDim() * s.KVHeads }

// KVBytesPerToken is the KV-cache size of one token (keys and values of every layer)
// when each element takes elemBytes (2 for f16).
func (s Spec) KVBytesPerToken(elemBytes float64) float64 {
	return float64(2*s.Layers*s.EmbdKV()) * elemBytes
}

// Params is the number of parameters (a tied output projection counted once).
func (s Spec) Params() int64 {
	if s.Family.Arch() != string(Llama) {
		return s.familyParams()
	}
	e, kv, ff := int64(s.Embd), int64(s.EmbdKV()), int64(s.FF)
	perLayer := 2*e*e + 2*e*kv + 3*e*ff + 2*e
	n := int64(s.Vocab)*e + e + int64(s.Layers)*perLayer
	if s.Untied {
		n += int64(s.Vocab) * e
	}
	return n
}

// Validate reports the first inconsistency in s.
func (s Spec) Validate() error {
	if s.Tokenizer != nil {
		if err := s.Tokenizer.validate(s.Vocab); err != nil {
			return err
		}
	}
	switch {
	case s.Tokenizer == nil && s.Vocab < FirstNormalToken+96:
		return fmt.Errorf("vocab %d is below the minimum %d", s.Vocab, FirstNormalToken+96)
	case s.Embd <= 0 || s.Layers <= 0 || s.Heads <= 0 || s.KVHeads <= 0 || s.FF <= 0 || s.Ctx <= 0:
		return errors.New("embd, layers, heads, kv heads, ff and ctx must be positive")
	case s.KeyLength == 0 && s.Embd%s.Heads != 0:
		return fmt.Errorf("embd %d is not a multiple of heads %d", s.Embd, s.Heads)
	case s.Heads%s.KVHeads != 0:
		return fmt.Errorf("heads %d is not a multiple of kv heads %d", s.Heads, s.KVHeads)
	case s.HeadDim()%2 != 0:
		return fmt.Errorf("head dimension %d must be even (rotary embedding)", s.HeadDim())
	case s.DType != F16 && s.DType != F32 && s.DType != Q8_0 && s.DType != Q4_0:
		return fmt.Errorf("dtype %q is not f16, f32, q8_0 or q4_0", s.DType)
	case s.DType.quantized() && (s.Embd%blockSize != 0 || s.FF%blockSize != 0):
		return fmt.Errorf("embd %d and ff %d must be multiples of %d for %s", s.Embd, s.FF, blockSize, s.DType)
	case s.Reply != nil && !s.Untied:
		return errors.New("a reply needs an untied output projection")
	case s.Reply != nil && s.Trained != nil:
		return errors.New("a trained model cannot be steered to a reply")
	case s.Reply != nil && (s.Reply.Token < 0 || s.Reply.Token >= s.Vocab || s.Reply.End < 0 ||
		s.Reply.End >= s.Vocab || s.Reply.Token == s.Reply.End):
		return fmt.Errorf("reply tokens %d and %d must be two different ids below vocab %d", s.Reply.Token, s.Reply.End, s.Vocab)
	}
	if err := s.validateFamily(); err != nil {
		return err
	}
	return s.validateTrained()
}

// TensorShapes are the model's tensors by name with their shapes in ggml order
// (the number of values in a row first).
func (s Spec) TensorShapes() map[string][]uint64 {
	out := map[string][]uint64{}
	for _, t := range tensors(s) {
		out[t.Name] = t.Shape
	}
	return out
}

// validateTrained checks that Trained holds exactly the model's tensors, each of
// its size.
func (s Spec) validateTrained() error {
	if s.Trained == nil {
		return nil
	}
	ts := tensors(s)
	for _, t := range ts {
		n := uint64(1)
		for _, d := range t.Shape {
			n *= d
		}
		v, ok := s.Trained[t.Name]
		switch {
		case !ok:
			return fmt.Errorf("the trained weights have no tensor %s", t.Name)
		case uint64(len(v)) != n:
			return fmt.Errorf("trained tensor %s has %d values, want %d (shape %v)", t.Name, len(v), n, t.Shape)
		}
	}
	if len(s.Trained) != len(ts) {
		for name := range s.Trained {
			if !slices.ContainsFunc(ts, func(t *ggml.Tensor) bool { return t.Name == name }) {
				return fmt.Errorf("trained tensor %s is not a tensor of this model (untied output needs Untied)", name)
			}
		}
	}
	return nil
}

// Write synthesizes the model described by spec into path (created or truncated).
func Write(path string, spec Spec) error {
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("invalid model spec: %w", err)
	}
	return writeAtomic(path, func(f *os.File) error { return ggml.WriteGGUF(f, metadata(spec), tensors(spec)) })
}

// writeAtomic writes path with write through a temporary name and a rename, so that
// a reader never sees a partial model.
func writeAtomic(path string, write func(f *os.File) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("creating model file: %w", err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if err := write(f); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func metadata(s Spec) ggml.KV {
	var tokens []string
	var scores []float32
	var types []int32
	if s.Tokenizer == nil {
		tokens, scores, types = Vocabulary(s.Vocab)
	}
	fileType := map[DType]uint32{F32: 0, F16: 1, Q4_0: 2, Q8_0: 7}[s.DType] // llama_ftype
	a := s.Family.Arch()
	kv := ggml.KV{
		"general.architecture":                  a,
		"general.name":                          s.Name,
		"general.file_type":                     fileType,
		a + ".context_length":                   uint32(s.Ctx),
		a + ".embedding_length":                 uint32(s.Embd),
		a + ".block_count":                      uint32(s.Layers),
		a + ".feed_forward_length":              uint32(s.FF),
		a + ".attention.head_count":             uint32(s.Heads),
		a + ".attention.head_count_kv":          uint32(s.KVHeads),
		a + ".attention.layer_norm_rms_epsilon": float32(1e-5),
		a + ".rope.dimension_count":             uint32(s.HeadDim()),
		a + ".rope.freq_base":                   cmp.Or(s.RopeBase, 10000),
		a + ".vocab_size":                       uint32(s.Vocab),
		"tokenizer.ggml.model":                  "llama",
		"tokenizer.ggml.tokens":                 tokens,
		"tokenizer.ggml.scores":                 scores,
		"tokenizer.ggml.token_type":             types,
		"tokenizer.ggml.bos_token_id":           uint32(BOSToken),
		"tokenizer.ggml.eos_token_id":           uint32(EOSToken),
		"tokenizer.ggml.eot_token_id":           uint32(IMEndToken),
		"tokenizer.ggml.unknown_token_id":       uint32(UnknownToken),
		"tokenizer.ggml.add_bos_token":          true,
		"tokenizer.ggml.add_eos_token":          false,
		"tokenizer.chat_template":               ChatMLTemplate,
	}
	if s.Tokenizer != nil {
		s.Tokenizer.kv(kv)
	}
	if s.ChatTemplate != "" {
		kv["tokenizer.chat_template"] = s.ChatTemplate
	}
	s.familyKV(kv)
	return kv
}

func tensors(s Spec) []*ggml.Tensor {
	if s.Family.Arch() != string(Llama) {
		return familyTensors(s)
	}
	e, kv, ff := uint64(s.Embd), uint64(s.EmbdKV()), uint64(s.FF)
	var ts []*ggml.Tensor
	var steer map[string]func(i uint64) (float32, bool)
	if r := s.Reply; r != nil {
		steer = map[string]func(i uint64) (float32, bool){
			// Row t, column c is value t·Embd+c.
			"token_embd.weight": func(i uint64) (float32, bool) {
				t, c := i/e, i%e
				switch {
				case c == 0 && t != uint64(r.Token), c == 1 && t == uint64(r.Token):
					return replyWeight, true
				case c <= 1:
					return 0, true
				}
				return 0, false
			},
			"output.weight": func(i uint64) (float32, bool) {
				t, c := i/e, i%e
				switch {
				case c == 0 && t == uint64(r.Token), c == 1 && t == uint64(r.End):
					return replyLogit, true
				case c <= 1:
					return 0, true
				}
				return 0, false
			},
		}
	}
	matrix := func(name string, cols, rows uint64) {
		// Uniform in ±sqrt(3)·σ with σ = 1/sqrt(cols): unit-variance outputs.
		scale := float32(math.Sqrt(3 / float64(cols)))
		t := newTensor(s, name, s.DType, []uint64{cols, rows}, scale)
		t.WriterTo.(*weights).steer = steer[name]
		ts = append(ts, t)
	}
	norm := func(name string) {
		ts = append(ts, newTensor(s, name, F32, []uint64{e}, 0))
	}
	// The embedding doubles as the output projection (tied), so its scale sets the
	// logit spread: σ = 1/sqrt(embd) gives unit-variance logits.
	matrix("token_embd.weight", e, uint64(s.Vocab))
	norm("output_norm.weight")
	if s.Untied {
		matrix("output.weight", e, uint64(s.Vocab))
	}
	for i := range s.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		norm(p + "attn_norm.weight")
		matrix(p+"attn_q.weight", e, e)
		matrix(p+"attn_k.weight", e, kv)
		matrix(p+"attn_v.weight", e, kv)
		matrix(p+"attn_output.weight", e, e)
		norm(p + "ffn_norm.weight")
		matrix(p+"ffn_gate.weight", e, ff)
		matrix(p+"ffn_up.weight", e, ff)
		matrix(p+"ffn_down.weight", ff, e)
	}
	return ts
}

func newTensor(s Spec, name string, dt DType, shape []uint64, scale float32) *ggml.Tensor {
	kind := map[DType]uint32{F32: uint32(ggml.TensorTypeF32), F16: uint32(ggml.TensorTypeF16),
		Q8_0: uint32(ggml.TensorTypeQ8_0), Q4_0: uint32(ggml.TensorTypeQ4_0)}[dt]
	n := uint64(1)
	for _, d := range shape {
		n *= d
	}
	h := fnv.New64a()
	_, _ = io.WriteString(h, name)
	return &ggml.Tensor{
		Name:  name,
		Kind:  kind,
		Shape: shape,
		WriterTo: &weights{
			n: n, dtype: dt, scale: scale,
			state:   s.Seed*splitmixGamma ^ h.Sum64(),
			trained: s.Trained[name],
		},
	}
}

// weights streams n pseudo-random values: uniform in [-scale, scale], or all ones when
// scale is zero (norm vectors). Each tensor has its own generator keyed by the seed and
// its name, so the bytes do not depend on the order tensors are written in (WriteGGUF
// writes them concurrently, one goroutine per tensor up to GOMAXPROCS).
//
// The generator is splitmix64: tiny, fast and fully specified, so files are stable
// across Go versions. Its state only counts up by splitmixGamma, so value i is a
// function of i alone and any stretch of a tensor can be generated by itself.
type weights struct {
	n     uint64
	dtype DType
	scale float32
	// state is the generator's state before value 0.
	state uint64
	// steer, when set, replaces the value at index i when it returns true (Reply).
	steer func(i uint64) (float32, bool)
	// trained, when set, are the values (Spec.Trained).
	trained []float32
	// shift is added to every pseudo-random value (not to a norm's ones).
	shift float32
}

const splitmixGamma = 0x9E3779B97F4A7C15

// chunkValues is how many values are generated and written at a time: 256 KiB of f32,
// a whole number of quantized blocks.
const chunkValues = 1 << 16

// values fills vals with the values from index from on.
func (w *weights) values(vals []float32, from uint64) {
	if w.trained != nil {
		copy(vals, w.trained[from:])
		return
	}
	if w.scale == 0 {
		for i := range vals {
			vals[i] = 1
		}
		return
	}
	state := w.state + from*splitmixGamma
	for i := range vals {
		state += splitmixGamma
		z := state
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		z ^= z >> 31
		u := float32(z>>40) / float32(1<<24) // [0,1)
		vals[i] = (2*u-1)*w.scale + w.shift
	}
	if w.steer != nil {
		for i := range vals {
			if s, ok := w.steer(from + uint64(i)); ok {
				vals[i] = s
			}
		}
	}
}

// appendValues appends the encoding of vals (a whole number of blocks for a quantized
// type; the tensor's rows are whole blocks, Validate checks the widths).
func (w *weights) appendValues(buf []byte, vals []float32) []byte {
	switch w.dtype {
	case Q8_0:
		for b := 0; b < len(vals); b += blockSize {
			buf = appendQ8_0(buf, (*[blockSize]float32)(vals[b:b+blockSize]))
		}
	case Q4_0:
		for b := 0; b < len(vals); b += blockSize {
			buf = appendQ4_0(buf, (*[blockSize]float32)(vals[b:b+blockSize]))
		}
	case F16:
		for _, v := range vals {
			buf = binary.LittleEndian.AppendUint16(buf, float16.Fromfloat32(v).Bits())
		}
	default:
		for _, v := range vals {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
		}
	}
	return buf
}

// WriteTo implements io.WriterTo.
func (w *weights) WriteTo(dst io.Writer) (int64, error) {
	vals := make([]float32, min(w.n, chunkValues))
	buf := make([]byte, 0, len(vals)*4)
	var written int64
	for from := uint64(0); from < w.n; from += uint64(len(vals)) {
		v := vals[:min(uint64(len(vals)), w.n-from)]
		w.values(v, from)
		buf = w.appendValues(buf[:0], v)
		m, err := dst.Write(buf)
		written += int64(m)
		if err != nil {
			return written, err
		}
	}
	return written, nil
}
