package clustermode

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/janitor"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
)

// TestOptionsConfig: the agent's defaults (prompt cache budgets, sandbox on) and
// checks (required names and directories, durations), each error naming its flag.
func TestOptionsConfig(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	base := Options{NodeName: "mac-1", Listen: ":8080", StoreDir: "/data/m", StateDir: "/data/s", RunnerThreads: 2,
		StoreRetention: time.Hour, PromptCacheRetention: 2 * time.Hour, GCInterval: time.Minute, TokenAudience: "aud"}
	baseCfg := Config{NodeName: "mac-1", Listen: ":8080", StateDir: "/data/s", RunnerThreads: 2, TokenAudience: "aud",
		RunnerSandbox: sandbox.On, PromptCacheSSDBytes: config.DefaultPromptCacheSSDBytes,
		Janitor: janitor.Options{StoreRetention: time.Hour, PromptCacheRetention: 2 * time.Hour, Interval: time.Minute}}
	tests := []struct {
		name string
		edit func(*Options)
		want func(*Config)
		err  string
	}{
		{name: "defaults: the hot budget a tenth of the ceiling (0), the SSD quota the default", edit: func(*Options) {}, want: func(*Config) {}},
		{name: "sizes", edit: func(o *Options) {
			o.CeilingBytes, o.ReserveBytes = 2<<30, 1<<30
			o.PromptCacheHotBytes, o.PromptCacheSSDBytes = ptr.To(config.Size(3<<30)), ptr.To(config.Size(40<<30))
		}, want: func(c *Config) {
			c.Pool.CeilingBytes, c.Pool.ReserveBytes, c.Pool.PromptCacheHotBytes, c.PromptCacheSSDBytes = 2<<30, 1<<30, 3<<30, 40<<30
		}},
		{name: "0 turns the prompt cache tiers off", edit: func(o *Options) {
			o.PromptCacheHotBytes, o.PromptCacheSSDBytes = ptr.To(config.Size(0)), ptr.To(config.Size(0))
		}, want: func(c *Config) { c.Pool.PromptCacheHotBytes, c.PromptCacheSSDBytes = -1, 0 }},
		{name: "the prompt cache directory made absolute", edit: func(o *Options) { o.PromptCacheDir = "pc" },
			want: func(c *Config) { c.PromptCacheDir = filepath.Join(wd, "pc") }},
		{name: "sandbox off and runners kept", edit: func(o *Options) { o.RunnerSandbox, o.KeepRunners = "off", true },
			want: func(c *Config) { c.RunnerSandbox, c.KeepRunners = sandbox.Off, true }},
		{name: "no node name", edit: func(o *Options) { o.NodeName = "" }, err: "--node-name is required"},
		{name: "no store directory", edit: func(o *Options) { o.StoreDir = "" }, err: "--store-dir is required"},
		{name: "no state directory", edit: func(o *Options) { o.StateDir = "" }, err: "--state-dir is required"},
		{name: "negative retention", edit: func(o *Options) { o.PromptCacheRetention = -time.Second },
			err: "--prompt-cache-retention: -1s is negative"},
		{name: "negative interval", edit: func(o *Options) { o.GCInterval = -time.Minute }, err: "--gc-interval: -1m0s is negative"},
		{name: "auto with a probe interval", edit: func(o *Options) { o.GatewayTunnel, o.TunnelProbeInterval = "gw:7443", 10*time.Second },
			want: func(c *Config) {
				c.GatewayTunnel, c.ConnectAuto, c.TunnelProbeInterval = "gw:7443", true, 10*time.Second
			}},
		{name: "a probe interval without auto", edit: func(o *Options) {
			o.Connect, o.GatewayTunnel, o.TunnelProbeInterval = "outbound", "gw:7443", time.Minute
		}, err: "--tunnel-probe-interval is for --connect auto"},
		{name: "a probe interval shorter than a failed probe", edit: func(o *Options) { o.GatewayTunnel, o.TunnelProbeInterval = "gw:7443", time.Second },
			err: "--tunnel-probe-interval 1s: want at least 5s"},
		{name: "bad runner sandbox", edit: func(o *Options) { o.RunnerSandbox = "maybe" },
			err: `--runner-sandbox: runner sandbox "maybe": want "on" or "off"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := base
			tt.edit(&o)
			got, err := o.Config()
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := baseCfg
			tt.want(&want)
			if d := cmp.Diff(want, got, cmpopts.IgnoreTypes(logr.Logger{})); d != "" {
				t.Errorf("config (-want +got):\n%s", d)
			}
		})
	}
}

// TestOptionsCreateDirs: both directories exist afterwards, nested ones included.
func TestOptionsCreateDirs(t *testing.T) {
	dir := t.TempDir()
	o := Options{StoreDir: filepath.Join(dir, "a", "models"), StateDir: filepath.Join(dir, "state")}
	if err := o.CreateDirs(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{o.StoreDir, o.StateDir} {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			t.Errorf("%s not created: %v", d, err)
		}
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	o.StateDir = filepath.Join(file, "state")
	if err := o.CreateDirs(); err == nil || !strings.Contains(err.Error(), "--state-dir") {
		t.Errorf("error %v, want one naming --state-dir", err)
	}
}
