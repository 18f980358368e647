package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/agent/clustermode"
	"github.com/macfleet/macfleet/agent/hardware"
)

func TestAgentFlagsConfig(t *testing.T) {
	dir := t.TempDir()
	base := agentFlags{opts: clustermode.Options{NodeName: "mac-1", Listen: ":8080", StoreDir: filepath.Join(dir, "m"), StateDir: filepath.Join(dir, "s")}}
	tests := []struct {
		name    string
		edit    func(*agentFlags)
		ceiling int64
		ov      hardware.Overrides
		err     string
		// Prompt cache: the pool's hot budget, the SSD quota, the directory.
		hot, ssd int64
		pcDir    string
	}{
		{name: "defaults", edit: func(*agentFlags) {}, ssd: 10 << 30},
		{name: "prompt cache", edit: func(f *agentFlags) {
			f.opts.PromptCacheDir, f.pcHot, f.pcSSD = filepath.Join(dir, "pc"), "3Gi", "40Gi"
		}, hot: 3 << 30, ssd: 40 << 30, pcDir: filepath.Join(dir, "pc")},
		{name: "prompt cache tiers off", edit: func(f *agentFlags) { f.pcHot, f.pcSSD = "0", "0" }, hot: -1},
		{name: "bad prompt cache size", edit: func(f *agentFlags) { f.pcSSD = "much" }, err: "--prompt-cache-ssd-bytes"},
		{name: "sizes and a simulated Mac", edit: func(f *agentFlags) {
			f.ceiling, f.unifiedMemory, f.chip, f.cpuCores = "2Gi", "16Gi", "Apple M2", 8
		}, ceiling: 2 << 30, ov: hardware.Overrides{Chip: "Apple M2", UnifiedMemoryBytes: 16 << 30, CPUCores: 8}, ssd: 10 << 30},
		{name: "bad size", edit: func(f *agentFlags) { f.reserve = "lots" }, err: "--memory-reserve"},
		{name: "working set above memory", edit: func(f *agentFlags) { f.unifiedMemory, f.workingSet = "8Gi", "9Gi" },
			err: "working set"},
		{name: "no node name", edit: func(f *agentFlags) { f.opts.NodeName = "" }, err: "--node-name"},
		{name: "bad runner sandbox", edit: func(f *agentFlags) { f.opts.RunnerSandbox = "maybe" }, err: `--runner-sandbox: runner sandbox "maybe": want "on" or "off"`},
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
			if cfg.Pool.PromptCacheHotBytes != tt.hot || cfg.PromptCacheSSDBytes != tt.ssd || cfg.PromptCacheDir != tt.pcDir {
				t.Errorf("prompt cache: hot %d ssd %d dir %q; want %d %d %q", cfg.Pool.PromptCacheHotBytes,
					cfg.PromptCacheSSDBytes, cfg.PromptCacheDir, tt.hot, tt.ssd, tt.pcDir)
			}
			if d := cmp.Diff(tt.ov, ov); d != "" {
				t.Errorf("overrides (-want +got):\n%s", d)
			}
			for _, d := range []string{f.opts.StoreDir, f.opts.StateDir} {
				if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
					t.Errorf("%s not created: %v", d, err)
				}
			}
		})
	}
}

func TestAgentStoreOptions(t *testing.T) {
	t.Setenv(hfTokenEnv, "hf_from_env")
	for _, tc := range []struct {
		name  string
		fl    agentFlags
		max   int64
		dirs  []string
		token string
		err   string
	}{
		{name: "defaults", token: "hf_from_env"},
		{name: "--hf-token over the environment", fl: agentFlags{hfToken: "hf_flag"}, token: "hf_flag"},
		{name: "limits", fl: agentFlags{maxModelBytes: "60Gi", allowFileDirs: []string{"/opt/models/", "/Volumes/m"}},
			max: 60 << 30, dirs: []string{"/opt/models", "/Volumes/m"}, token: "hf_from_env"},
		{name: "bad size", fl: agentFlags{maxModelBytes: "huge"}, err: "--max-model-bytes"},
		{name: "relative directory", fl: agentFlags{allowFileDirs: []string{"models"}}, err: `--allow-file-dir "models": want an absolute directory`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, err := tc.fl.storeOptions()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if opts.MaxModelBytes != tc.max || !cmp.Equal(opts.LocalFileDirs, tc.dirs) || opts.HFToken != tc.token {
				t.Errorf("options %+v, want max %d, dirs %v, token %q", opts, tc.max, tc.dirs, tc.token)
			}
		})
	}
}
