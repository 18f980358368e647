package runnerapi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHoldsBackend: which directories hold a backend library the runner would load
// (and so get the sandbox's GPU rules).
func TestHoldsBackend(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string // "name/" is a directory
		goos  string
		want  bool
	}{
		{"cuda backend", []string{"libggml-base.so", "libggml-cuda.so"}, "linux", true},
		{"a mac backend", []string{"libggml-vulkan.dylib"}, "darwin", true},
		{"base and cpu only", []string{"libggml-base.so", "libggml-cpu-haswell.so", "libggml-cpu.so"}, "linux", false},
		{"another platform's library", []string{"libggml-cuda.dylib", "ggml-cuda.dll"}, "linux", false},
		{"a directory of the name", []string{"libggml-cuda.so/"}, "linux", false},
		{"other files", []string{"libcudart.so.12", "README"}, "linux", false},
		{"empty", nil, "linux", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tc.files {
				var err error
				if name, ok := strings.CutSuffix(f, "/"); ok {
					err = os.Mkdir(filepath.Join(dir, name), 0o700)
				} else {
					err = os.WriteFile(filepath.Join(dir, f), nil, 0o600)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if got := HoldsBackend(dir, tc.goos); got != tc.want {
				t.Errorf("HoldsBackend(%q) = %v, want %v", tc.files, got, tc.want)
			}
		})
	}
	for _, dir := range []string{"", filepath.Join(t.TempDir(), "missing")} {
		if HoldsBackend(dir, "linux") {
			t.Errorf("HoldsBackend(%q) = true for no directory", dir)
		}
	}
}
