// Command trainmodel makes the small trained test model's corpus and converts the
// trained weights into a GGUF (docs/testing.md, "The trained test model"):
//
//	trainmodel corpus -out DIR [-seed N] [-tokens N]
//	trainmodel convert -weights DIR -out FILE.gguf
//
// The training itself (test/trainmodel/train.py) runs on a machine with a GPU.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/macfleet/macfleet/test/trainmodel/convert"
	"github.com/macfleet/macfleet/test/trainmodel/corpus"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "trainmodel:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: trainmodel corpus|convert [flags]")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	switch args[0] {
	case "corpus":
		out := fs.String("out", "", "directory to write tokens.bin, mask.bin and corpus.json into")
		seed := fs.Uint64("seed", corpus.DefaultSeed, "seed of the documents")
		tokens := fs.Int("tokens", corpus.DefaultTokens, "corpus size in tokens")
		fixtures := fs.String("fixtures", corpus.AgentFixtures, "directory of the coding agents' recorded requests")
		quoteEvery := fs.Int("quote-every", 0, "make every Nth document a quote (a file or a search result quoted whole); 0: none")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *out == "" {
			return fmt.Errorf("corpus: -out is required")
		}
		st, err := corpus.Generate(corpus.Config{Seed: *seed, Tokens: *tokens, AgentFixtures: *fixtures, QuoteEvery: *quoteEvery}, *out)
		if err != nil {
			return err
		}
		fmt.Printf("corpus: %d documents, %d tokens (%d supervised, longest document %d) in %s\n",
			st.Documents, st.Tokens, st.Supervised, st.LongestDocument, *out)
		for k, v := range st.Kinds {
			fmt.Printf("  %-14s %6d documents %9d tokens\n", k, v.Documents, v.Tokens)
		}
		return nil
	case "convert":
		weights := fs.String("weights", "", "directory of the trained weights (manifest.json and its tensor files)")
		out := fs.String("out", "", "GGUF file to write")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *weights == "" || *out == "" {
			return fmt.Errorf("convert: -weights and -out are required")
		}
		if err := convert.Convert(*weights, *out); err != nil {
			return err
		}
		fmt.Printf("convert: wrote %s\n", *out)
		return nil
	}
	return fmt.Errorf("unknown command %q (want corpus or convert)", args[0])
}
