package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

func init() { root.AddCommand(newSynthModelCommand()) }

func newSynthModelCommand() *cobra.Command {
	var (
		preset, out, family string
		override            ggufsynth.Spec
		dtype               string
		parts               int
		projector           string
	)
	cmd := &cobra.Command{
		Use:   "synth-model [--preset tiny|small|mid | --family FAMILY] [--parts N] -o FILE",
		Short: "Write a deterministic random-weight GGUF model for tests and benchmarks",
		Long: "Writes a GGUF with pseudo-random weights, a byte-level tokenizer and a chatml " +
			"template: a llama-architecture model of a preset, or with --family the smallest model " +
			"of another family (" + familyNames() + "). The same flags always produce the same " +
			"bytes. Dimension flags override the preset. With --parts N the model is stored as N " +
			"files named as hubs store large models (FILE without .gguf, then -00001-of-0000N.gguf); " +
			"name the first to load it. With --projector FILE (--family gemma3) a vision projector " +
			"(mmproj) for the model is written too: the runner's --mmproj, a deployment's " +
			"spec.model.projector.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, err := synthBase(cmd, preset, family)
			if err != nil {
				return err
			}
			synthOverride(cmd, &spec, override, dtype)
			if _, err := ggufsynth.TinyProjector(spec); projector != "" && err != nil {
				return fmt.Errorf("--projector: %w", err)
			}
			files, err := synthWrite(out, spec, parts)
			if err != nil {
				return err
			}
			var size int64
			for _, f := range files {
				st, err := os.Stat(f)
				if err != nil {
					return err
				}
				size += st.Size()
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(),
				"wrote %s: %d bytes, %d params (%s; vocab %d, embd %d, layers %d, heads %d/%d kv, ff %d, ctx %d, %s)\n",
				strings.Join(files, ", "), size, spec.Params(), spec.Family.Arch(), spec.Vocab, spec.Embd, spec.Layers,
				spec.Heads, spec.KVHeads, spec.FF, spec.Ctx, spec.DType)
			if err != nil || projector == "" {
				return err
			}
			return synthProjector(cmd, projector, spec)
		},
	}
	f := cmd.Flags()
	f.StringVar(&preset, "preset", "tiny", "base preset: tiny (≈2 MB), small (≈20 MB) or mid (≈175 MiB)")
	f.StringVar(&family, "family", "", "write the smallest model of this family instead of a preset: "+familyNames())
	f.IntVar(&parts, "parts", 1, "store the model as this many files (FILE's name without .gguf, then -00001-of-0000N.gguf)")
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
	f.StringVar(&projector, "projector", "", "also write a vision projector (mmproj GGUF) for the model to this path (--family gemma3)")
	_ = cmd.MarkFlagRequired("output")
	cmd.MarkFlagsMutuallyExclusive("preset", "family")
	return cmd
}

// synthProjector writes the tiny vision projector that pairs with spec to out.
func synthProjector(cmd *cobra.Command, out string, spec ggufsynth.Spec) error {
	p, err := ggufsynth.TinyProjector(spec)
	if err != nil {
		return fmt.Errorf("--projector: %w", err)
	}
	if err := ggufsynth.WriteProjector(out, p); err != nil {
		return err
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: projector %s, %d tokens an image (%d px, patch %d, merged %d×%d)\n",
		out, ggufsynth.ProjectorType, p.ImageTokens(), p.ImageSize, p.PatchSize, p.Merge, p.Merge)
	return err
}

// synthOverride applies the dimension and naming flags given to spec.
func synthOverride(cmd *cobra.Command, spec *ggufsynth.Spec, override ggufsynth.Spec, dtype string) {
	flags := cmd.Flags()
	for name, dst := range map[string]*int{
		"vocab": &spec.Vocab, "embd": &spec.Embd, "layers": &spec.Layers, "heads": &spec.Heads,
		"kv-heads": &spec.KVHeads, "ff": &spec.FF, "ctx": &spec.Ctx,
	} {
		if flags.Changed(name) {
			*dst, _ = flags.GetInt(name)
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
	if flags.Changed("untied") {
		spec.Untied, _ = flags.GetBool("untied")
	}
}

// synthBase is the spec synth-model starts from: the family's smallest model, or the
// preset's.
func synthBase(cmd *cobra.Command, preset, family string) (ggufsynth.Spec, error) {
	if cmd.Flags().Changed("family") {
		return ggufsynth.TinyFamily(ggufsynth.Family(family))
	}
	return ggufsynth.Preset(preset)
}

// synthWrite writes spec to out, or as parts files beside it, and returns the files.
func synthWrite(out string, spec ggufsynth.Spec, parts int) ([]string, error) {
	if parts == 1 {
		return []string{out}, ggufsynth.Write(out, spec)
	}
	if parts < 1 || parts > ggufsynth.MaxParts {
		return nil, fmt.Errorf("--parts %d: want 1 to %d", parts, ggufsynth.MaxParts)
	}
	return ggufsynth.WriteParts(strings.TrimSuffix(out, ".gguf"), spec, parts)
}

// familyNames lists the families synth-model writes.
func familyNames() string {
	names := make([]string, len(ggufsynth.Families))
	for i, f := range ggufsynth.Families {
		names[i] = string(f)
	}
	return strings.Join(names, ", ")
}
