// Command synthmodel writes a synthesized GGUF model (internal/ggufsynth) for the
// metal tests that need a large one: built without the race detector, it writes
// hundreds of MB in a second or two instead of a minute.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

func main() {
	preset := flag.String("preset", "mid", "ggufsynth preset: tiny, small or mid")
	layers := flag.Int("layers", 0, "transformer blocks (0: the preset's)")
	dtype := flag.String("dtype", "", "weight type: f16 or f32 (default: the preset's)")
	out := flag.String("o", "", "output file")
	flag.Parse()
	spec, err := ggufsynth.Preset(*preset)
	if err == nil && *out == "" {
		err = fmt.Errorf("-o is required")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "synthmodel:", err)
		os.Exit(2)
	}
	if *layers > 0 {
		spec.Layers = *layers
	}
	if *dtype != "" {
		spec.DType = ggufsynth.DType(*dtype)
	}
	if err := ggufsynth.Write(*out, spec); err != nil {
		fmt.Fprintln(os.Stderr, "synthmodel:", err)
		os.Exit(1)
	}
}
