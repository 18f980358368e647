package runnerproc

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
)

// TestAttackRunnerOfAModelInPartsReadsBesideThem: the runner of a model stored in
// parts, laid out as the store lays it out (parts/<hash>/NAME-0000i-of-00003.gguf,
// each a link to its blob), may read every part through its link; a loader bug that
// reads a file beside the parts that is not one of them (a file in the links'
// directory, a part of another count, another model's blob) gets "permission denied".
func TestAttackRunnerOfAModelInPartsReadsBesideThem(t *testing.T) {
	if st := sandbox.Probe(); !st.Enforced {
		t.Skipf("no runner sandbox on this kernel: %s", st.Detail)
	}
	bin := procBuildFakeRunner(t)
	store := t.TempDir()
	blobs, links := filepath.Join(store, "blobs"), filepath.Join(store, "parts", "0f3c")
	for _, d := range []string{blobs, links} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	link := func(name, blob, content string) string {
		if err := os.WriteFile(filepath.Join(blobs, blob), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(links, name)
		if err := os.Symlink(filepath.Join("..", "..", "blobs", blob), path); err != nil {
			t.Fatal(err)
		}
		return path
	}
	model := link("m-00001-of-00003.gguf", "sha256-01", "PART-ONE")
	second := link("m-00002-of-00003.gguf", "sha256-02", "PART-TWO")
	third := link("m-00003-of-00003.gguf", "sha256-03", "PART-THREE")
	otherCount := link("m-00002-of-00004.gguf", "sha256-04", "NOT-A-PART-4")
	notes := link("m.gguf", "sha256-05", "NOT-A-PART-5")
	if err := os.WriteFile(filepath.Join(blobs, "sha256-06"), []byte("ANOTHER-MODEL"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, read, want string
	}{
		{"second part", second, `read ` + second + `: "PART-TWO"`},
		{"third part", third, `read ` + third + `: "PART-THREE"`},
		{"the third part's blob", filepath.Join(blobs, "sha256-03"), `"PART-THREE"`},
		{"a part of another count", otherCount, "read " + otherCount + ": open " + otherCount + ": permission denied"},
		{"a file beside the parts", notes, "read " + notes + ": open " + notes + ": permission denied"},
		{"another model's blob", filepath.Join(blobs, "sha256-06"), "permission denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := NewProcessFactory(ProcessConfig{RunnerPath: bin, Args: []string{"--fake-read", tc.read}})
			r := procStart(t, f, enginepool.ModelSpec{Name: "m", Path: model}, 0)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			err := r.WaitReady(ctx)
			if err == nil {
				t.Fatal("WaitReady: the probing runner reported a successful load")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("load error lacks %q:\n%v", tc.want, err)
			}
			for _, secret := range []string{"NOT-A-PART", "ANOTHER-MODEL"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("the runner read %s: %v", secret, err)
				}
			}
		})
	}
}
