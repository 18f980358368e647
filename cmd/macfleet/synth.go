package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

func init() { root.AddCommand(newSynthModelCommand()) }

func newSynthModelCommand() *cobra.Command {
	var (
		preset, out string
		override    ggufsynth.Spec
		dtype       string
	)
	cmd := &cobra.Command{
		Use:   "synth-model --preset tiny|small|mid -o FILE",
		Short: "Write a deterministic random-weight llama GGUF model for tests and benchmarks",
		Long: "Writes a llama-architecture GGUF with pseudo-random weights, a byte-level " +
			"tokenizer and a chatml template. The same flags always produce the same bytes. " +
			"Dimension flags override the preset.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, err := ggufsynth.Preset(preset)
			if err != nil {
				return err
			}
			flags := cmd.Flags()
			for name, dst := range map[string]*int{
				"vocab": &spec.Vocab, "embd": &spec.Embd, "layers": &spec.Layers, "heads": &spec.Heads,
				"kv-heads": &spec.KVHeads, "ff": &spec.FF, "ctx": &spec.Ctx,
			} {
				if flags.Changed(name) {
					v, _ := flags.GetInt(name)
					*dst = v
				}
			}
			if flags.Changed("seed") {
				spec.Seed = override.Seed
			}
			if flags.Changed("name") {
				spec.Name = override.Name
			}
			if flags.Changed("dtype") {
				spec.DType = ggufsynth.DType(dtype)
			}
			spec.Untied, _ = flags.GetBool("untied")
			if err := ggufsynth.Write(out, spec); err != nil {
				return err
			}
			st, err := os.Stat(out)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(),
				"wrote %s: %d bytes, %d params (vocab %d, embd %d, layers %d, heads %d/%d kv, ff %d, ctx %d, %s)\n",
				out, st.Size(), spec.Params(), spec.Vocab, spec.Embd, spec.Layers, spec.Heads, spec.KVHeads,
				spec.FF, spec.Ctx, spec.DType)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&preset, "preset", "tiny", "base preset: tiny (≈2 MB), small (≈20 MB) or mid (≈175 MiB)")
	f.StringVarP(&out, "output", "o", "", "output GGUF path")
	f.Int("vocab", 0, "vocabulary size")
	f.Int("embd", 0, "embedding size")
	f.Int("layers", 0, "number of transformer blocks")
	f.Int("heads", 0, "attention heads")
	f.Int("kv-heads", 0, "key/value heads")
	f.Int("ff", 0, "feed-forward size")
	f.Int("ctx", 0, "training context length")
	f.Uint64Var(&override.Seed, "seed", 1, "weight seed")
	f.StringVar(&override.Name, "name", "", "general.name (default: the preset's)")
	f.StringVar(&dtype, "dtype", "", "weight type: f16, f32, q8_0 or q4_0 (default: the preset's)")
	f.Bool("untied", false, "write a separate output projection (output.weight) instead of reusing the token embedding")
	_ = cmd.MarkFlagRequired("output")
	return cmd
}
