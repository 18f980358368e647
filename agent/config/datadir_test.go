package config

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestDataDir(t *testing.T) {
	home, err := os.UserHomeDir()
	if err != nil {
		t.Skip("no home directory")
	}
	if runtime.GOOS == "darwin" {
		if got, want := DataDir("models"), filepath.Join(home, "Library", "Application Support", "macfleet", "models"); got != want {
			t.Errorf("DataDir = %s, want %s", got, want)
		}
		return
	}
	t.Setenv("XDG_DATA_HOME", "/data/x")
	if got := DataDir("state"); got != "/data/x/macfleet/state" {
		t.Errorf("with XDG_DATA_HOME: %s", got)
	}
	t.Setenv("XDG_DATA_HOME", "")
	if got, want := DataDir("models"), filepath.Join(home, ".local", "share", "macfleet", "models"); got != want {
		t.Errorf("DataDir = %s, want %s", got, want)
	}
}

// TestResolve: the prompt cache directory of `macfleet serve` is the flags', else the
// file's, else the one under DataDir; the result is completed and checked.
func TestResolve(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_DATA_HOME", filepath.Join(dir, "data"))
	model := filepath.Join(dir, "m.gguf")
	if err := os.WriteFile(model, []byte("GGUF"), 0o644); err != nil {
		t.Fatal(err)
	}
	models := []Model{{Name: "m", Path: model}}
	tests := []struct {
		name        string
		file, flags Config
		wantDir     string
		err         string
	}{
		{name: "neither names one: the data directory's", flags: Config{Models: models}, wantDir: DataDir("prompt-cache")},
		{name: "the file's", file: Config{PromptCacheDir: filepath.Join(dir, "file")}, flags: Config{Models: models},
			wantDir: filepath.Join(dir, "file")},
		{name: "the flags' over the file's", file: Config{PromptCacheDir: filepath.Join(dir, "file")},
			flags: Config{PromptCacheDir: filepath.Join(dir, "flag"), Models: models}, wantDir: filepath.Join(dir, "flag")},
		{name: "completed and checked", flags: Config{}, err: "at least one model"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Resolve(tt.file, tt.flags)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.PromptCacheDir != tt.wantDir || got.Listen != DefaultListen {
				t.Errorf("prompt cache directory %q, listen %q; want %q, %q", got.PromptCacheDir, got.Listen, tt.wantDir, DefaultListen)
			}
		})
	}
}
