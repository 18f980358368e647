package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/modelfit"
	"github.com/macfleet/macfleet/test/support/visiontest"
)

// TestModelsFitProjector: `models fit --projector` counts a vision model's projector
// in every need, as the manager counts a deployment's spec.model.projector: the
// model's estimate plus the projector's (estimate.Projector), whether the projector
// is a local file or read from the hub (a double, with the token) by range requests;
// without --projector the needs are the model's alone. A projector named by a part,
// or a file that is not a GGUF, is refused, naming the flag.
func TestModelsFitProjector(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBECONFIG", "")
	t.Setenv(hfTokenEnv, "hf_gated")
	dir := t.TempDir()
	model, proj := filepath.Join(dir, "gemma.gguf"), filepath.Join(dir, "mmproj.gguf")
	visiontest.WriteModel(t, model, proj)
	hub := newHubDoubleFiles(t, "hf_gated", map[string]string{"/org/gemma-GGUF/resolve/main/mmproj.gguf": proj})
	projBytes, err := estimate.Projector(t.Context(), estimate.Params{Path: proj})
	if err != nil || projBytes <= 0 {
		t.Fatalf("the projector's estimate: %d bytes, %v", projBytes, err)
	}
	bare := needsOf(t, model, 4096)[4096]

	fit := func(args ...string) modelfit.Report {
		t.Helper()
		return fitJSON(t, append([]string{model, "--memory", "24Gi", "--context-length", "4096"}, args...)...)
	}
	if rep := fit(); len(rep.Needs) != 1 || rep.Needs[0].Bytes != bare || rep.Model.Projector != nil {
		t.Errorf("without --projector: needs %+v, projector %+v; want the model's %d bytes alone", rep.Needs, rep.Model.Projector, bare)
	}
	for _, args := range [][]string{
		{"--projector", proj},
		{"--projector", "hf://org/gemma-GGUF/mmproj.gguf", "--hf-endpoint", hub.URL, "--source-policy", loopbackPolicy(t)},
	} {
		rep := fit(args...)
		if len(rep.Needs) != 1 || rep.Needs[0].Bytes != bare+projBytes {
			t.Errorf("models fit %q: needs %+v, want the model's %d and the projector's %d bytes", args, rep.Needs, bare, projBytes)
		}
		if pr := rep.Model.Projector; pr == nil || pr.Source != args[1] || pr.Bytes != projBytes {
			t.Errorf("models fit %q: projector %+v, want %s of %d bytes", args, pr, args[1], projBytes)
		}
	}
	out, err := runFit(t, model, "--memory", "24Gi", "--context-length", "4096", "--projector", proj)
	if err != nil || !strings.Contains(out, "with its projector "+proj+": ") {
		t.Errorf("the table: %v, want it to name the projector:\n%s", err, out)
	}

	notGGUF := filepath.Join(dir, "mmproj.txt")
	if err := os.WriteFile(notGGUF, []byte(strings.Repeat("not a model ", 512)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ projector, want string }{
		{"hf://org/gemma-GGUF/mmproj-00001-of-00002.gguf", "--projector hf://org/gemma-GGUF/mmproj-00001-of-00002.gguf: a projector is one file: it cannot be stored in parts"},
		{notGGUF, "--projector: reading the GGUF header of " + notGGUF},
	} {
		if out, err := runFit(t, model, "--memory", "24Gi", "--projector", tc.projector); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--projector %s: %v, want an error containing %q\n%s", tc.projector, err, tc.want, out)
		}
	}
}
