package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/agent/launchd"
)

// TestServeInstallDryRun renders `macfleet serve install` through the command line and
// parses the printed property list back as launchd would read it.
func TestServeInstallDryRun(t *testing.T) {
	t.Setenv("HOME", "/Users/ada")
	const src = "hf://org/repo/m.gguf:ctx=32768"
	for _, tc := range []struct {
		name     string
		args     []string
		wantArgs []any
		wantLogs string
		wantUser any
		wantErr  string
	}{
		{name: "user agent",
			args: []string{"--dry-run", "--executable", "/opt/homebrew/bin/macfleet", "--", "--model", "qwen=" + src},
			wantArgs: []any{"/opt/homebrew/bin/macfleet", "serve", "--model", "qwen=" + src,
				"--store-dir=/Users/ada/Library/Application Support/macfleet/models",
				"--prompt-cache-dir=/Users/ada/Library/Application Support/macfleet/prompt-cache"},
			wantLogs: "/Users/ada/Library/Logs/macfleet/serve.log"},
		{name: "headless daemon with its own directories",
			args: []string{"--dry-run", "--system", "--user", "ada", "--executable", "/usr/local/bin/macfleet", "--",
				"--model=chat=/opt/models/chat.gguf", "--store-dir", "/Volumes/models", "--api-key-file=/etc/macfleet/key", "--listen=0.0.0.0:8080"},
			wantArgs: []any{"/usr/local/bin/macfleet", "serve", "--model=chat=/opt/models/chat.gguf", "--store-dir", "/Volumes/models",
				"--api-key-file=/etc/macfleet/key", "--listen=0.0.0.0:8080",
				"--prompt-cache-dir=/Library/Application Support/macfleet/prompt-cache"},
			wantLogs: "/Library/Logs/macfleet/serve.log", wantUser: "ada"},
		{name: "a key in the world-readable plist",
			args:    []string{"--dry-run", "--executable", "/usr/local/bin/macfleet", "--", "--model", "qwen=" + src, "--api-key", "sk-secret"},
			wantErr: "--api-key-file"},
		{name: "a relative model file",
			args:    []string{"--dry-run", "--executable", "/usr/local/bin/macfleet", "--", "--model", "chat=models/chat.gguf"},
			wantErr: "needs an absolute path"},
		{name: "flags before --",
			args:    []string{"--dry-run", "--executable", "/usr/local/bin/macfleet", "--model", "x"},
			wantErr: "unknown flag: --model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, _, err := runInstall(newServeInstallCmd(), tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				if stdout != "" {
					t.Errorf("a refused install printed %q", stdout)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			plist := parsePlist(t, stdout)
			if diff := cmp.Diff(tc.wantArgs, plist["ProgramArguments"]); diff != "" {
				t.Errorf("ProgramArguments (-want +got):\n%s", diff)
			}
			if plist["Label"] != launchd.ServeLabel || plist["StandardOutPath"] != tc.wantLogs ||
				plist["KeepAlive"] != true || plist["RunAtLoad"] != true || plist["UserName"] != tc.wantUser {
				t.Errorf("plist = %v", plist)
			}
		})
	}
}
