// Command fits prints, as a Markdown table, which model shapes fit the agent's memory
// ceiling on Macs of 16, 24 and 32 GB at which context: each shape is synthesized as
// a header-only GGUF (internal/ggufsynth.WriteHeader), estimated as the manager does
// (internal/estimate) and set against the ceiling the agent would compute on that Mac
// with the default reserve (metal/enginepool.ComputeCeiling, Metal's working set
// estimated). docs/mac-server.md holds its output.
//
//	go run ./hack/fits
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// Model is a published model's shape, stored as Q4_0 or Q8_0.
type Model struct {
	Name  string
	Shape ggufsynth.Spec
}

// Models are the shapes of the models the docs and examples name (their
// config.json: vocabulary, width, layers, heads, KV heads, feed-forward width, and
// whether the output projection is the embedding's).
var Models = []Model{
	{"Qwen2.5 3B", shape(151936, 2048, 36, 16, 2, 11008, false)},
	{"Qwen2.5 7B", shape(152064, 3584, 28, 28, 4, 18944, true)},
	{"Llama 3.1 8B", shape(128256, 4096, 32, 32, 8, 14336, true)},
	{"Qwen2.5 14B", shape(152064, 5120, 48, 40, 8, 13824, true)},
	{"Qwen2.5 32B", shape(152064, 5120, 64, 40, 8, 27648, true)},
}

func shape(vocab, embd, layers, heads, kvHeads, ff int, untied bool) ggufsynth.Spec {
	return ggufsynth.Spec{Name: "fits", Vocab: vocab, Embd: embd, Layers: layers, Heads: heads, KVHeads: kvHeads,
		FF: ff, Ctx: 131072, Untied: untied, Seed: 1}
}

// MacsGiB are the memory sizes of the table's columns.
var MacsGiB = []int64{16, 24, 32}

// Contexts are the contexts of each model's rows.
var Contexts = []int32{8192, 32768}

// Ceiling is what the agent would enforce on a Mac of gib GiB left at its defaults.
func Ceiling(gib int64) int64 {
	total := gib << 30
	hw := enginepool.Hardware{TotalBytes: total, MetalWorkingSetBytes: enginepool.MetalWorkingSetEstimate(total)}
	return enginepool.ComputeCeiling(hw, 0, 0, 0, 0).Bytes
}

// Row is one model at one context and storage type.
type Row struct {
	Model   string
	DType   ggufsynth.DType
	Context int32
	Est     estimate.Result
}

// Estimate synthesizes each model's header in dir and estimates it at each context.
func Estimate(ctx context.Context, dir string, models []Model, dtypes []ggufsynth.DType, contexts []int32) ([]Row, error) {
	var rows []Row
	for _, m := range models {
		for _, dt := range dtypes {
			spec := m.Shape
			spec.DType = dt
			path := filepath.Join(dir, strings.ReplaceAll(m.Name, " ", "-")+"-"+string(dt)+".gguf")
			if err := ggufsynth.WriteHeader(path, spec); err != nil {
				return nil, fmt.Errorf("%s: %w", m.Name, err)
			}
			for _, c := range contexts {
				est, err := estimate.Estimate(ctx, estimate.Params{Path: path, ContextLength: c, Parallel: 1})
				if err != nil {
					return nil, fmt.Errorf("%s at %d: %w", m.Name, c, err)
				}
				rows = append(rows, Row{Model: m.Name, DType: dt, Context: c, Est: est})
			}
			if err := os.Remove(path); err != nil {
				return nil, err
			}
		}
	}
	return rows, nil
}

// Write prints rows as a Markdown table with a column per Mac: the memory left under
// its ceiling, or "no" and by how much it misses.
func Write(w io.Writer, rows []Row) {
	fmt.Fprint(w, "| Model | Weights | Context | Estimate |")
	for _, g := range MacsGiB {
		fmt.Fprintf(w, " %d GB (ceiling %s) |", g, gb(Ceiling(g)))
	}
	fmt.Fprint(w, "\n|---|---|---|---|")
	for range MacsGiB {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s %s | %dk | %s |", r.Model, strings.ToUpper(string(r.DType)), gb(r.Est.Weights), r.Context/1024, gb(r.Est.Total))
		for _, g := range MacsGiB {
			if left := Ceiling(g) - r.Est.Total; left >= 0 {
				fmt.Fprintf(w, " yes, %s left |", gb(left))
			} else {
				fmt.Fprintf(w, " no (%s over) |", gb(-left))
			}
		}
		fmt.Fprintln(w)
	}
}

func gb(b int64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

func main() {
	dir, err := os.MkdirTemp("", "fits")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	rows, err := Estimate(context.Background(), dir, Models, []ggufsynth.DType{ggufsynth.Q4_0, ggufsynth.Q8_0}, Contexts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1) //nolint:gocritic // the directory is removed above
	}
	Write(os.Stdout, rows)
}
