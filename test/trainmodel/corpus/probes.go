package corpus

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Probes are held-out prompts for train.py to answer greedily when it has trained,
// beside what the corpus answers, with the vocabulary's bytes to print them
// (probes.json): a first look at the model without converting it.
type Probes struct {
	Probes []Probe `json:"probes"`
	// Pieces are the bytes of every token, hex-encoded.
	Pieces []string `json:"pieces"`
	// Stop are the tokens that end an answer.
	Stop []int `json:"stop"`
}

// Probe is a prompt cut where the model starts writing, and the turn the corpus
// has there.
type Probe struct {
	Name      string  `json:"name"`
	Prompt    []int32 `json:"prompt"`
	Want      string  `json:"want"`
	MaxTokens int     `json:"maxTokens"`
}

// probeOffset puts the probes' documents far past any corpus's.
const probeOffset = 1 << 40

// probeKinds are the documents probed and which of their assistant turns: the first
// (a tool call) or the last (the answer from a tool's result).
var probeKinds = []struct {
	kind string
	last bool
}{
	{"greeting", false}, {"answer", false}, {"json", false}, {"think", false}, {"tool-call", false},
	{"tool-call", true}, {"no-call", false}, {"agent-claude", false}, {"agent-claude", true}, {"agent-codex", false},
	{"quote", true}, // only where the corpus makes quotes
}

// MakeProbes finds one held-out document of each probed kind.
func (g *Generator) MakeProbes() (*Probes, error) {
	p := &Probes{Stop: []int{g.l.Tokenizer.EOT}}
	if g.l.Tokenizer.EOS != g.l.Tokenizer.EOT {
		p.Stop = append(p.Stop, g.l.Tokenizer.EOS)
	}
	for id := range g.l.Tokenizer.Tokens {
		s, err := g.l.Decode([]int32{int32(id)})
		if err != nil {
			return nil, err
		}
		p.Pieces = append(p.Pieces, hex.EncodeToString([]byte(s)))
	}
	for _, pk := range probeKinds {
		if pk.kind == "quote" && g.quoteEvery == 0 {
			continue
		}
		found := false
		for i := probeOffset; i < probeOffset+20000 && !found; i++ {
			c, err := g.Conversation(i)
			if err != nil {
				return nil, err
			}
			if c.Kind != pk.kind {
				continue
			}
			d, err := g.l.Tokens(c)
			if err != nil {
				return nil, err
			}
			runs, sup := segments(d)
			at, k := 0, -1
			for j := range runs {
				if sup[j] && (k < 0 || pk.last) {
					k = j
				}
			}
			if k < 0 || (pk.last && k == firstSupervised(sup)) {
				continue // no tool turn before the answer
			}
			for _, r := range runs[:k] {
				at += len(r)
			}
			want, err := g.l.Decode(runs[k][:len(runs[k])-1])
			if err != nil {
				return nil, err
			}
			name := pk.kind
			if pk.last {
				name += " (answer from the result)"
			}
			p.Probes = append(p.Probes, Probe{Name: name, Prompt: d.IDs[:at], Want: want, MaxTokens: len(runs[k]) + 16})
			found = true
		}
		if !found {
			return nil, fmt.Errorf("no held-out %s document to probe", pk.kind)
		}
	}
	return p, nil
}

func firstSupervised(sup []bool) int {
	for j, s := range sup {
		if s {
			return j
		}
	}
	return -1
}

// segments splits a document into its runs of prompt and supervised tokens.
func segments(d Document) (runs [][]int32, supervised []bool) {
	for i, id := range d.IDs {
		if i == 0 || d.Supervised[i] != d.Supervised[i-1] {
			runs = append(runs, nil)
			supervised = append(supervised, d.Supervised[i])
		}
		runs[len(runs)-1] = append(runs[len(runs)-1], id)
	}
	return runs, supervised
}

func writeProbes(dir string, p *Probes) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "probes.json"), b, 0o644)
}
