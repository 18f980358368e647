package main

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/agent/hardware"
)

func TestAgentFlagsConfig(t *testing.T) {
	dir := t.TempDir()
	base := agentFlags{nodeName: "mac-1", listen: ":8080", storeDir: filepath.Join(dir, "m"), stateDir: filepath.Join(dir, "s")}
	tests := []struct {
		name    string
		edit    func(*agentFlags)
		ceiling int64
		ov      hardware.Overrides
		err     string
	}{
		{name: "defaults", edit: func(*agentFlags) {}},
		{name: "sizes and a simulated Mac", edit: func(f *agentFlags) {
			f.ceiling, f.unifiedMemory, f.chip, f.cpuCores = "2Gi", "16Gi", "Apple M2", 8
		}, ceiling: 2 << 30, ov: hardware.Overrides{Chip: "Apple M2", UnifiedMemoryBytes: 16 << 30, CPUCores: 8}},
		{name: "bad size", edit: func(f *agentFlags) { f.reserve = "lots" }, err: "--memory-reserve"},
		{name: "working set above memory", edit: func(f *agentFlags) { f.unifiedMemory, f.workingSet = "8Gi", "9Gi" },
			err: "working set"},
		{name: "no node name", edit: func(f *agentFlags) { f.nodeName = "" }, err: "--node-name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := base
			tt.edit(&f)
			cfg, ov, err := f.config()
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one mentioning %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Pool.CeilingBytes != tt.ceiling || cfg.NodeName != "mac-1" || cfg.Listen != ":8080" {
				t.Errorf("config %+v", cfg)
			}
			if d := cmp.Diff(tt.ov, ov); d != "" {
				t.Errorf("overrides (-want +got):\n%s", d)
			}
			for _, d := range []string{f.storeDir, f.stateDir} {
				if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
					t.Errorf("%s not created: %v", d, err)
				}
			}
		})
	}
}

func TestDefaultDataDir(t *testing.T) {
	home, err := os.UserHomeDir()
	if err != nil {
		t.Skip("no home directory")
	}
	if runtime.GOOS == "darwin" {
		if got, want := defaultDataDir("models"), filepath.Join(home, "Library", "Application Support", "macfleet", "models"); got != want {
			t.Errorf("defaultDataDir = %s, want %s", got, want)
		}
		return
	}
	t.Setenv("XDG_DATA_HOME", "/data/x")
	if got := defaultDataDir("state"); got != "/data/x/macfleet/state" {
		t.Errorf("with XDG_DATA_HOME: %s", got)
	}
	t.Setenv("XDG_DATA_HOME", "")
	if got, want := defaultDataDir("models"), filepath.Join(home, ".local", "share", "macfleet", "models"); got != want {
		t.Errorf("defaultDataDir = %s, want %s", got, want)
	}
}
