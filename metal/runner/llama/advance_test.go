//go:build cgo && !race

package llama

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// TestAdvance: a grammar is moved past text it accepts, refuses text it does not with
// where, and refuses a model other than the one it was made for before it reads the
// sampler's state.
func TestAdvance(t *testing.T) {
	Init(false)
	load := func(name string) *Model {
		t.Helper()
		spec := ggufsynth.Tiny()
		spec.Name = name
		path := filepath.Join(t.TempDir(), name+".gguf")
		if err := ggufsynth.Write(path, spec); err != nil {
			t.Fatal(err)
		}
		m, err := LoadModel(path, ModelParams{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Free)
		return m
	}
	a, b := load("a"), load("b")
	const gbnf = `root ::= "{" [a-z]* "}"`
	s := NewSampler(SamplerParams{})
	defer s.Free()
	if err := s.Constrain(a, gbnf, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Advance(a, "{ab"); err != nil {
		t.Errorf("advancing past an accepted prefix: %v", err)
	}
	if err := s.Advance(a, "}}"); err == nil || !strings.Contains(err.Error(), "byte 1") {
		t.Errorf("advancing past text the grammar refuses at its second byte: %v", err)
	}
	if err := s.Advance(b, "c"); err == nil || !strings.Contains(err.Error(), "another model") {
		t.Errorf("advancing with another model: %v", err)
	}
	if err := CheckGrammar(a, gbnf, nil, "{ab}"); err != nil {
		t.Errorf("checking an accepted prefix: %v", err)
	}
	var pe *PrefixError
	if err := CheckGrammar(a, gbnf, nil, "x"); !errors.As(err, &pe) {
		t.Errorf("checking a refused prefix: %v, want a PrefixError", err)
	}
}
