//go:build cgo && !race

package llama

/*
#cgo CXXFLAGS: -std=c++17
#include <stdlib.h>
#include "llama.h"
#include "grammar.h"
#include "direct.h"
*/
import "C"

import (
	"errors"
	"math/rand/v2"
	"unsafe"

	// llama.cpp's common helpers, for its JSON-schema-to-grammar converter (called
	// from grammar.cpp). Debian's nlohmann-json3-dev provides the JSON headers the
	// module zip leaves out.
	_ "github.com/ollama/ollama/llama/llama.cpp/common"
)

// SamplerParams selects the samplers of a chain. The zero value is greedy decoding
// without penalties; set Temperature > 0 for random sampling.
type SamplerParams struct {
	Temperature float32
	TopK        int     // 0: off
	TopP        float32 // 0 or 1: off
	MinP        float32 // 0: off
	Seed        uint32
	// PresencePenalty and FrequencyPenalty follow OpenAI's definitions over the last
	// PenaltyLastN tokens.
	PresencePenalty, FrequencyPenalty float32
	PenaltyLastN                      int
}

// Sampler is a sampler chain, optionally under a grammar; it remembers the tokens it
// produced (for penalties and the grammar's state).
type Sampler struct {
	c       *C.struct_llama_sampler
	grammar *C.struct_llama_sampler
	cur     []C.llama_token_data // scratch: one entry per vocabulary token
	utf8    *utf8Table           // the model's token UTF-8 classes, under a grammar
	state   C.int32_t            // what the output needs next to stay valid UTF-8
	// Resampled counts the tokens the grammar rejected from the chain's first choice.
	Resampled int
	// direct is a chain of a temperature alone or greedy, drawn straight from the
	// logits (direct.cpp; under a grammar, its first choice); rng is its seeded source.
	direct  bool
	temp    float32
	rng     *rand.Rand
	scratch []float32
}

// NewSampler builds a chain: penalties, top-k, top-p, min-p, temperature and a seeded
// distribution, or greedy when Temperature is 0.
func NewSampler(p SamplerParams) *Sampler {
	cp := C.llama_sampler_chain_default_params()
	cp.no_perf = true
	chain := C.llama_sampler_chain_init(cp)
	if p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		lastN := p.PenaltyLastN
		if lastN <= 0 {
			lastN = 64
		}
		C.llama_sampler_chain_add(chain, C.llama_sampler_init_penalties(C.int32_t(lastN), 1.0,
			C.float(p.FrequencyPenalty), C.float(p.PresencePenalty)))
	}
	penalties := p.PresencePenalty != 0 || p.FrequencyPenalty != 0
	if p.Temperature <= 0 {
		C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
		return &Sampler{c: chain, direct: !penalties}
	}
	if p.TopK > 0 {
		C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_k(C.int32_t(p.TopK)))
	}
	if p.TopP > 0 && p.TopP < 1 {
		C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_p(C.float(p.TopP), 1))
	}
	if p.MinP > 0 {
		C.llama_sampler_chain_add(chain, C.llama_sampler_init_min_p(C.float(p.MinP), 1))
	}
	C.llama_sampler_chain_add(chain, C.llama_sampler_init_temp(C.float(p.Temperature)))
	C.llama_sampler_chain_add(chain, C.llama_sampler_init_dist(C.uint32_t(p.Seed)))
	s := &Sampler{c: chain}
	if !penalties && p.TopK <= 0 && (p.TopP <= 0 || p.TopP >= 1) && p.MinP <= 0 {
		s.direct, s.temp = true, p.Temperature
		s.rng = rand.New(rand.NewPCG(uint64(p.Seed), 0x6d66736d706c)) // seeded: one seed, one answer
	}
	return s
}

// ErrGrammarDeadEnd is a grammar that allows no token of the vocabulary.
var ErrGrammarDeadEnd = errors.New("the grammar allows no next token")

// Constrain puts the sampler under a GBNF grammar (root rule "root") for m's
// vocabulary. With triggers the grammar is lazy: the output is free until the text so
// far matches one of these patterns (ECMAScript regular expressions over the whole
// output), and from the start of the pattern's first group on it holds. Call it
// before the first Sample.
func (s *Sampler) Constrain(m *Model, gbnf string, triggers []string) error {
	g, err := parseGrammar(m, gbnf, triggers)
	if err != nil {
		return err
	}
	if s.grammar != nil {
		C.llama_sampler_free(s.grammar)
	}
	s.grammar = g
	s.utf8 = m.utf8Classes()
	return nil
}

// Advance moves the sampler's grammar (constrained for m) past text, output already
// written under it (an answer being continued), so that the next Sample allows what
// may follow it. A
// grammar that does not accept text is an error that says where; a lazy grammar still
// waiting for its trigger, or no grammar, is left as it is.
func (s *Sampler) Advance(m *Model, text string) error {
	if s.grammar == nil || text == "" {
		return nil
	}
	ct := C.CString(text)
	defer C.free(unsafe.Pointer(ct))
	var cerr *C.char
	if C.mf_grammar_advance(m.c, s.grammar, ct, &cerr) < 0 {
		defer C.free(unsafe.Pointer(cerr))
		return errors.New(C.GoString(cerr))
	}
	return nil
}

// Logits is one output row of the last Decode: the model's vocabulary's logits.
type Logits struct {
	p *C.float
}

// Logits returns output row i (batch index) of the last Decode. It waits for the
// decode to finish on its device; call it from the goroutine that decodes.
func (c *Context) Logits(i int) Logits {
	return Logits{p: C.llama_get_logits_ith(c.c, C.int32_t(i))}
}

// SampleLogits picks a token from row l of m's logits and records it in the chain's
// history (and the grammar's state). It touches no context: distinct samplers may
// sample at once, each from its own row, until the next Decode. Under a grammar it
// first checks the chain's choice alone and masks the vocabulary only when the
// grammar rejects it, so output the grammar allows anyway costs almost nothing. The
// scratch row is the sampler's own, kept between calls (a fresh one a token cost
// about as much as the sampling itself).
func (s *Sampler) SampleLogits(m *Model, l Logits) (int32, error) {
	return s.sample(m, l, -1)
}

// Greedy reports whether the chain's choice is the row's first largest logit
// (Logits.Argmax), so that it can be computed before the sampler's turn, on another
// goroutine (SampleArgmax): greedy, without penalties.
func (s *Sampler) Greedy() bool { return s.direct && s.temp <= 0 }

// SampleArgmax is SampleLogits for a Greedy sampler given row l's Argmax.
func (s *Sampler) SampleArgmax(m *Model, l Logits, argmax int32) (int32, error) {
	if !s.Greedy() || argmax < 0 {
		return s.sample(m, l, -1)
	}
	return s.sample(m, l, argmax)
}

// sample is SampleLogits, with the chain's choice already made where chosen is not
// negative (a greedy chain's argmax).
func (s *Sampler) sample(m *Model, l Logits, pick int32) (int32, error) {
	n := m.NVocab()
	chosen := C.llama_token(pick)
	switch {
	case chosen >= 0:
		if s.grammar == nil {
			return pick, nil
		}
	case s.direct:
		// The chain's choice straight from the row; a grammar then checks it alone,
		// and masks the vocabulary for the chain only when it refuses it (mf_sample).
		if len(s.scratch) < n {
			s.scratch = make([]float32, n)
		}
		u := 0.0
		if s.rng != nil {
			u = s.rng.Float64()
		}
		chosen = C.mf_sample_direct(l.p, C.int32_t(n), C.float(s.temp), C.double(u), (*C.float)(unsafe.Pointer(&s.scratch[0])))
		if chosen < 0 {
			return 0, errors.New("no logits for the sampled row")
		}
		if s.grammar == nil {
			return int32(chosen), nil
		}
	}
	if len(s.cur) < n {
		s.cur = make([]C.llama_token_data, n)
	}
	var resampled C.int32_t
	var classes *C.uint16_t
	var first *C.uint8_t
	if s.grammar != nil {
		classes = (*C.uint16_t)(unsafe.Pointer(&s.utf8.class[0]))
		first = (*C.uint8_t)(unsafe.Pointer(&s.utf8.first[0]))
	}
	tok := C.mf_sample(s.c, s.grammar, classes, first, &s.state, m.vocab, l.p, &s.cur[0], C.int32_t(n), chosen, &resampled)
	s.Resampled += int(resampled)
	switch tok {
	case -1:
		return 0, errors.New("no logits for the sampled row")
	case -2:
		return 0, ErrGrammarDeadEnd
	}
	return int32(tok), nil
}

// Free releases the chain and its grammar.
func (s *Sampler) Free() {
	if s.c != nil {
		C.llama_sampler_free(s.c)
		s.c = nil
	}
	if s.grammar != nil {
		C.llama_sampler_free(s.grammar)
		s.grammar = nil
	}
	s.cur, s.scratch = nil, nil
}

// utf8Classes are the UTF-8 classes of the model's token pieces, computed once.
func (m *Model) utf8Classes() *utf8Table {
	m.utf8Once.Do(func() { m.utf8 = newUTF8Table(m.pieces) })
	return m.utf8
}

// CheckGrammar reports whether gbnf (and its triggers, as Constrain takes them)
// parses for m's vocabulary, and accepts prefix (see Advance) when it is not "".
func CheckGrammar(m *Model, gbnf string, triggers []string, prefix string) error {
	g, err := parseGrammar(m, gbnf, triggers)
	if err != nil {
		return err
	}
	defer C.llama_sampler_free(g)
	if prefix == "" {
		return nil
	}
	cp := C.CString(prefix)
	defer C.free(unsafe.Pointer(cp))
	var cerr *C.char
	if C.mf_grammar_advance(m.c, g, cp, &cerr) < 0 {
		defer C.free(unsafe.Pointer(cerr))
		return &PrefixError{Msg: C.GoString(cerr)}
	}
	return nil
}

// PrefixError is a grammar that does not accept the answer a continuation starts from.
type PrefixError struct{ Msg string }

func (e *PrefixError) Error() string { return e.Msg }

func parseGrammar(m *Model, gbnf string, triggers []string) (*C.struct_llama_sampler, error) {
	cs := C.CString(gbnf)
	defer C.free(unsafe.Pointer(cs))
	// The patterns in C memory: cgo forbids Go pointers to Go pointers.
	var ct **C.char
	if len(triggers) > 0 {
		ct = (**C.char)(C.malloc(C.size_t(len(triggers)) * C.size_t(unsafe.Sizeof((*C.char)(nil)))))
		defer C.free(unsafe.Pointer(ct))
		list := unsafe.Slice(ct, len(triggers))
		for i, p := range triggers {
			list[i] = C.CString(p)
			defer C.free(unsafe.Pointer(list[i]))
		}
	}
	var cerr *C.char
	g := C.mf_grammar_init(m.c, cs, ct, C.int32_t(len(triggers)), &cerr)
	if cerr != nil {
		defer C.free(unsafe.Pointer(cerr))
		return nil, errors.New(C.GoString(cerr))
	}
	return g, nil
}

// BuildGrammar builds a GBNF grammar with llama.cpp's JSON-schema converter: schemas
// is a JSON object of named JSON schemas, rules a JSON object of named GBNF rule bodies
// (one of them "root") in which {{name}} stands for a value of the schema of that
// name. A schema the converter cannot express is an error that says why.
func BuildGrammar(schemas, rules []byte) (string, error) {
	cs, cr := C.CString(string(schemas)), C.CString(string(rules))
	defer C.free(unsafe.Pointer(cs))
	defer C.free(unsafe.Pointer(cr))
	var cerr *C.char
	out := C.mf_build_grammar(cs, cr, &cerr)
	if cerr != nil {
		defer C.free(unsafe.Pointer(cerr))
		return "", errors.New(C.GoString(cerr))
	}
	defer C.free(unsafe.Pointer(out))
	return calendarDates(C.GoString(out)), nil
}

// TopLogprob is a token and its log-probability.
type TopLogprob struct {
	Token   int32
	Logprob float32
}

// Logprobs returns the log-probability of tok in output row i of the last Decode
// (the model's distribution before sampling) and the k most likely tokens (k ≤ 20).
func (c *Context) Logprobs(i int, tok int32, k int) (float32, []TopLogprob) {
	k = max(0, min(k, 20))
	var ids [20]C.llama_token
	var lps [20]C.float
	lp := C.mf_logprobs(c.c, C.int32_t(i), C.int32_t(c.model.NVocab()), C.llama_token(tok), C.int32_t(k), &ids[0], &lps[0])
	top := make([]TopLogprob, k)
	for j := range k {
		top[j] = TopLogprob{Token: int32(ids[j]), Logprob: float32(lps[j])}
	}
	return float32(lp), top
}
