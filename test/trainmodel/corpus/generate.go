// Package corpus generates the training corpus of the small model the tests and the
// demo use (docs/testing.md, "The trained test model"): conversations rendered with
// the runner's own chat template renderer and the real Llama 3.1 chat template,
// tokenized with the real Llama 3 vocabulary, written as token ids with a mask of
// the tokens the model writes. The same seed always gives the same bytes.
package corpus

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
)

// MaxTokens is the most tokens a corpus may hold: the token file stays within 48 MiB,
// and the corpus compressed within what the GPU machine is sent (64 MiB).
const MaxTokens = 48 << 20 / 4

// Config is what a corpus is generated from.
type Config struct {
	// Seed selects the documents.
	Seed uint64
	// Tokens is the corpus size to reach (the last document may pass it).
	Tokens int
	// AgentFixtures is the directory of the coding agents' recorded requests.
	AgentFixtures string
	// QuoteEvery, above 0, makes document i a quote where i%QuoteEvery ==
	// QuoteEvery-1 (quote); 0 makes none, as the trained test model's corpus.
	QuoteEvery int
}

// Stats describes a generated corpus (corpus.json).
type Stats struct {
	Seed       uint64 `json:"seed"`
	QuoteEvery int    `json:"quoteEvery,omitempty"`
	Tokens     int    `json:"tokens"`
	Supervised int    `json:"supervisedTokens"`
	Documents  int    `json:"documents"`
	// LongestDocument is the most tokens of one document: the training context must hold it.
	LongestDocument int                  `json:"longestDocument"`
	Kinds           map[string]KindStats `json:"kinds"`
	Vocab           int                  `json:"vocab"`
	BOS             int                  `json:"bos"`
	EOT             int                  `json:"eot"`
	// Files name the token ids (uint32, little-endian) and the mask (one byte per
	// token, 1 where the model writes the token).
	TokenFile string `json:"tokenFile"`
	MaskFile  string `json:"maskFile"`
}

// KindStats counts one kind of document.
type KindStats struct {
	Documents int `json:"documents"`
	Tokens    int `json:"tokens"`
}

// kinds are the generators with their weights (documents per 1000). Agent requests
// are about 60 times longer than the others, so 12 in 1000 makes them about two
// fifths of the tokens.
var kinds = []struct {
	weight int
	gen    func(r *rand.Rand) Conversation
}{
	{110, greeting}, {230, answer}, {330, toolCall}, {150, jsonAnswer}, {168, think}, {12, nil}, // nil: agentTurn
}

// Generator makes documents.
type Generator struct {
	l      *Llama3
	agents []agentRequest
	seed   uint64
	// quoteEvery is Config.QuoteEvery.
	quoteEvery int
}

// NewGenerator reads the vocabulary, the template and the agents' requests.
func NewGenerator(l *Llama3, seed uint64, agentFixtures string) (*Generator, error) {
	agents, err := loadAgents(agentFixtures)
	if err != nil {
		return nil, err
	}
	return &Generator{l: l, agents: agents, seed: seed}, nil
}

// Conversation is document i: a function of the seed and i alone.
func (g *Generator) Conversation(i int) (Conversation, error) {
	r := rand.New(rand.NewPCG(g.seed, uint64(i)))
	if g.quoteEvery > 0 && i%g.quoteEvery == g.quoteEvery-1 {
		return quote(r), nil
	}
	w := r.IntN(1000)
	for _, k := range kinds {
		if w -= k.weight; w < 0 {
			if k.gen == nil {
				return agentTurn(r, g.agents)
			}
			return k.gen(r), nil
		}
	}
	return agentTurn(r, g.agents)
}

// Document is document i tokenized.
func (g *Generator) Document(i int) (Conversation, Document, error) {
	c, err := g.Conversation(i)
	if err != nil {
		return c, Document{}, fmt.Errorf("document %d: %w", i, err)
	}
	d, err := g.l.Tokens(c)
	if err != nil {
		return c, d, fmt.Errorf("document %d: %w", i, err)
	}
	return c, d, nil
}

// Generate writes tokens.bin, mask.bin and corpus.json into dir.
func Generate(cfg Config, dir string) (Stats, error) {
	if cfg.Tokens <= 0 || cfg.Tokens > MaxTokens {
		return Stats{}, fmt.Errorf("tokens must be between 1 and %d, got %d", MaxTokens, cfg.Tokens)
	}
	l, err := LoadLlama3()
	if err != nil {
		return Stats{}, err
	}
	if cfg.QuoteEvery < 0 {
		return Stats{}, fmt.Errorf("quote-every must not be negative, got %d", cfg.QuoteEvery)
	}
	g, err := NewGenerator(l, cfg.Seed, cfg.AgentFixtures)
	if err != nil {
		return Stats{}, err
	}
	g.quoteEvery = cfg.QuoteEvery
	st := Stats{Seed: cfg.Seed, QuoteEvery: cfg.QuoteEvery, Kinds: map[string]KindStats{}, Vocab: len(l.Tokenizer.Tokens), BOS: l.Tokenizer.BOS,
		EOT: l.Tokenizer.EOT, TokenFile: "tokens.bin", MaskFile: "mask.bin"}
	ids := make([]byte, 0, cfg.Tokens*4+1<<20)
	mask := make([]byte, 0, cfg.Tokens+1<<18)
	batch := runtime.GOMAXPROCS(0) * 16
	for next := 0; st.Tokens < cfg.Tokens; next += batch {
		convs, docs, err := g.batch(next, batch)
		if err != nil {
			return st, err
		}
		for k, d := range docs {
			if st.Tokens >= cfg.Tokens {
				break
			}
			if st.Tokens+len(d.IDs) > MaxTokens {
				return st, fmt.Errorf("document %d would take the corpus past %d tokens", next+k, MaxTokens)
			}
			for j, id := range d.IDs {
				ids = binary.LittleEndian.AppendUint32(ids, uint32(id))
				var m byte
				if d.Supervised[j] {
					m = 1
					st.Supervised++
				}
				mask = append(mask, m)
			}
			ks := st.Kinds[convs[k].Kind]
			ks.Documents++
			ks.Tokens += len(d.IDs)
			st.Kinds[convs[k].Kind] = ks
			st.Tokens += len(d.IDs)
			st.Documents++
			st.LongestDocument = max(st.LongestDocument, len(d.IDs))
		}
	}
	if err := writeCorpus(dir, st, ids, mask); err != nil {
		return st, err
	}
	probes, err := g.MakeProbes()
	if err != nil {
		return st, err
	}
	return st, writeProbes(dir, probes)
}

// batch makes documents from..from+n-1 in parallel, in order.
func (g *Generator) batch(from, n int) ([]Conversation, []Document, error) {
	convs, docs, errs := make([]Conversation, n), make([]Document, n), make([]error, n)
	var wg sync.WaitGroup
	work := make(chan int)
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for k := range work {
				convs[k], docs[k], errs[k] = g.Document(from + k)
			}
		})
	}
	for k := range n {
		work <- k
	}
	close(work)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, nil, err
		}
	}
	return convs, docs, nil
}

func writeCorpus(dir string, st Stats, ids, mask []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	meta, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	for name, b := range map[string][]byte{st.TokenFile: ids, st.MaskFile: mask, "corpus.json": append(meta, '\n')} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return fmt.Errorf("writing the corpus: %w", err)
		}
	}
	return nil
}

// The corpus the trained test model is trained on: docs/testing.md records them.
const (
	DefaultSeed   = 45
	DefaultTokens = 3_500_000
)
