package config

import (
	"os"
	"path/filepath"
	"runtime"
)

// DataDir is where the agent keeps sub persistently: on macOS
// ~/Library/Application Support/macfleet/<sub>, elsewhere $XDG_DATA_HOME/macfleet/<sub>
// or ~/.local/share/macfleet/<sub>; "" without a home directory. Never a temporary
// directory: models are large.
func DataDir(sub string) string {
	if runtime.GOOS == "darwin" {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, "Library", "Application Support", "macfleet", sub)
		}
		return ""
	}
	if x := os.Getenv("XDG_DATA_HOME"); filepath.IsAbs(x) {
		return filepath.Join(x, "macfleet", sub)
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "share", "macfleet", sub)
	}
	return ""
}

// Resolve is the configuration `macfleet serve` runs: the file's (file), the flags'
// (flags) over it (Merge), the prompt cache directory under DataDir when neither
// names one, completed and validated (Complete).
func Resolve(file, flags Config) (Config, error) {
	c := file.Merge(flags)
	if c.PromptCacheDir == "" {
		c.PromptCacheDir = DataDir("prompt-cache")
	}
	return c.Complete()
}
