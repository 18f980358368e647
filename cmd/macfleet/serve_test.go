package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// TestServeRefusesBadConfiguration runs the serve command up to its configuration
// checks: every mistake is reported before anything starts.
func TestServeRefusesBadConfiguration(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "m.gguf")
	if err := os.WriteFile(model, []byte("GGUF"), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(conf, []byte("listen: 127.0.0.1:0\nmodels:\n  - name: a\n    path: "+model+"\n    parralel: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		want []string
	}{
		{args: []string{"serve"}, want: []string{"at least one model"}},
		{args: []string{"serve", "--model", model}, want: []string{"want NAME=PATH"}},
		{args: []string{"serve", "--model", "a=" + filepath.Join(dir, "missing.gguf")}, want: []string{"models[0] (a).path"}},
		{args: []string{"serve", "--model", "a=" + model, "--model", "a=" + model + ":ctx=64,parallel=2",
			"--listen", "nowhere"}, want: []string{`"a" is given twice`, "listen:"}},
		{args: []string{"serve", "--model", "a=" + model, "--memory-ceiling", "lots"}, want: []string{"--memory-ceiling"}},
		{args: []string{"serve", "--config", conf}, want: []string{"parralel"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			cmd := newServeCommand()
			cmd.SetArgs(tt.args[1:])
			cmd.SilenceUsage, cmd.SilenceErrors = true, true
			err := cmd.Execute()
			if err == nil {
				t.Fatal("serve started; want a configuration error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestAttackServeOnAllInterfacesWithoutKey: a developer runs `macfleet serve --listen
// 0.0.0.0:…` without a key, and anyone on the café's network unloads their models
// and spends them; the attacker must now find nothing listening: serve refuses to
// start, naming --api-key and --insecure.
func TestAttackServeOnAllInterfacesWithoutKey(t *testing.T) {
	if os.Getenv("MACFLEET_RUNNER") == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	model := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := ggufsynth.Write(model, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	for _, listen := range []string{"0.0.0.0:0", ":0"} {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		cmd := newServeCommand()
		cmd.SetArgs([]string{"--model", "m=" + model, "--listen", listen, "--prompt-cache-dir", t.TempDir()})
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		start := time.Now()
		err := cmd.ExecuteContext(ctx)
		cancel()
		if err == nil {
			t.Errorf("serve --listen %s without a key served for %s; want a refusal to start", listen, time.Since(start).Round(time.Second))
			continue
		}
		for _, w := range []string{"--api-key", "--insecure"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("the refusal %q does not name %s", err, w)
			}
		}
	}
}
