package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
