package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// synthModel runs synth-model with args and returns what it printed.
func synthModel(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newSynthModelCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// header reads the metadata of the GGUF at path.
func header(t *testing.T, path string) ggml.KV {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := ggml.Decode(f, -1)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return g.KV()
}

// TestSynthModelFamilies: --family writes each family's model under its own
// architecture, --parts N stores it as N files named as hubs name them with the split
// keys in each, and bad flags are refused naming what is wanted.
func TestSynthModelFamilies(t *testing.T) {
	dir := t.TempDir()
	for _, f := range ggufsynth.Families {
		out := filepath.Join(dir, string(f)+".gguf")
		printed, err := synthModel(t, "--family", string(f), "-o", out)
		if err != nil || !strings.Contains(printed, "("+f.Arch()+";") {
			t.Fatalf("synth-model --family %s: %v, printed %q", f, err, printed)
		}
		if got := header(t, out).Architecture(); got != f.Arch() {
			t.Errorf("--family %s wrote architecture %q, want %q", f, got, f.Arch())
		}
	}

	out := filepath.Join(dir, "moe.gguf")
	if printed, err := synthModel(t, "--family", string(ggufsynth.Qwen3MoE), "--parts", "3", "-o", out); err != nil {
		t.Fatalf("--parts 3: %v, printed %q", err, printed)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("--parts 3 wrote %s too (%v)", out, err)
	}
	for no := 1; no <= 3; no++ {
		part := filepath.Join(dir, ggufsynth.PartName("moe", no, 3))
		// The split keys are uint16, read raw (the decoder's typed getters prefix
		// the architecture and want uint32).
		kv := header(t, part)
		if got, want := fmt.Sprint(kv[ggufsynth.KeySplitNo], "/", kv[ggufsynth.KeySplitCount]), fmt.Sprint(uint16(no-1), "/", uint16(3)); got != want {
			t.Errorf("%s: split.no/split.count %s, want %s", part, got, want)
		}
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--family", "mamba"}, `unknown family "mamba"`},
		{[]string{"--family", "gemma3", "--preset", "small"}, "[family preset] were all set"},
		{[]string{"--parts", "0"}, "--parts 0: want 1 to"},
	} {
		_, err := synthModel(t, append(tc.args, "-o", filepath.Join(dir, "bad.gguf"))...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("synth-model %v: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}
