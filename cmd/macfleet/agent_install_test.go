package main

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"

	"github.com/macfleet/macfleet/agent/launchd"
)

// TestAgentInstallDryRun renders the service through the command line and reads the
// printed property list back.
func TestAgentInstallDryRun(t *testing.T) {
	t.Setenv("HOME", "/Users/ada")
	t.Setenv("KUBECONFIG", "")
	tests := []struct {
		name     string
		args     []string
		kubeEnv  string
		wantArgs []any
		wantLogs string
		wantUser string
	}{
		{
			name: "user agent",
			args: []string{"--dry-run", "--executable", "/usr/local/bin/macfleet", "--",
				"--kubeconfig", "/Users/ada/mac-1.kubeconfig", "--node-name", "mac-1"},
			wantArgs: []any{"/usr/local/bin/macfleet", "agent", "--kubeconfig", "/Users/ada/mac-1.kubeconfig", "--node-name", "mac-1",
				"--store-dir=/Users/ada/Library/Application Support/macfleet/models",
				"--state-dir=/Users/ada/Library/Application Support/macfleet/state"},
			wantLogs: "/Users/ada/Library/Logs/macfleet/agent.log",
		},
		{
			name:    "system daemon with $KUBECONFIG",
			args:    []string{"--dry-run", "--system", "--user", "ada", "--executable", "/opt/macfleet/bin/macfleet", "--", "--node-name=mini"},
			kubeEnv: "/etc/macfleet/mini.kubeconfig:/etc/other",
			wantArgs: []any{"/opt/macfleet/bin/macfleet", "agent", "--node-name=mini", "--kubeconfig=/etc/macfleet/mini.kubeconfig",
				"--store-dir=/Library/Application Support/macfleet/models", "--state-dir=/Library/Application Support/macfleet/state"},
			wantLogs: "/Library/Logs/macfleet/agent.log",
			wantUser: "ada",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tt.kubeEnv)
			stdout, stderr, err := runInstall(newAgentInstallCmd(), tt.args)
			if err != nil {
				t.Fatal(err)
			}
			plist := parsePlist(t, stdout)
			if diff := cmp.Diff(tt.wantArgs, plist["ProgramArguments"]); diff != "" {
				t.Errorf("ProgramArguments (-want +got):\n%s", diff)
			}
			if plist["StandardOutPath"] != tt.wantLogs || plist["KeepAlive"] != true || plist["RunAtLoad"] != true ||
				plist["Label"] != launchd.Label || plist["UserName"] != map[bool]any{true: tt.wantUser}[tt.wantUser != ""] {
				t.Errorf("plist = %v", plist)
			}
			if !strings.Contains(stderr, "Dry run: would write") {
				t.Errorf("stderr = %q, want the dry-run summary", stderr)
			}
		})
	}
}

func TestAgentInstallRefuses(t *testing.T) {
	t.Setenv("HOME", "/Users/ada")
	t.Setenv("SUDO_USER", "")
	t.Setenv("KUBECONFIG", "")
	tests := []struct {
		name string
		args []string
		want string
		skip bool
	}{
		{name: "agent flags before --", args: []string{"--dry-run", "node.kubeconfig"}, want: "after --"},
		{name: "unknown flag before --", args: []string{"--dry-run", "--kubeconfig", "k"}, want: "unknown flag"},
		{name: "no kubeconfig", args: []string{"--dry-run", "--executable", "/usr/local/bin/macfleet", "--", "--node-name", "m"}, want: "--kubeconfig"},
		{name: "store under /tmp", args: []string{"--dry-run", "--executable", "/usr/local/bin/macfleet", "--", "--kubeconfig", "/k",
			"--store-dir", "/tmp/models"}, want: "temporary"},
		{name: "a daemon without its user", args: []string{"--dry-run", "--system", "--executable", "/usr/local/bin/macfleet", "--", "--kubeconfig", "/k"},
			want: "--user NAME"},
		{name: "a user without --system", args: []string{"--dry-run", "--user", "ada", "--executable", "/usr/local/bin/macfleet", "--", "--kubeconfig", "/k"},
			want: "add --system"},
		{name: "loading off macOS", args: []string{"--executable", "/usr/local/bin/macfleet", "--", "--kubeconfig", "/k"},
			want: "--dry-run", skip: runtime.GOOS == "darwin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.skip {
				t.Skip("macOS has launchd")
			}
			stdout, stderr, err := runInstall(newAgentInstallCmd(), tt.args)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("install %q = %v; want an error mentioning %q (output %q)", tt.args, err, tt.want, stdout+stderr)
			}
		})
	}
}

// runInstall runs an install command (agent's or serve's) with args.
func runInstall(cmd *cobra.Command, args []string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err = cmd.Execute()
	return out.String(), errOut.String(), err
}

// parsePlist reads a printed property list back as launchd would, or fails the test.
func parsePlist(t *testing.T, printed string) map[string]any {
	t.Helper()
	plist, err := launchd.Parse([]byte(printed))
	if err != nil {
		t.Fatalf("the printed plist does not parse: %v\n%s", err, printed)
	}
	return plist
}

// TestHomebrewOpt: a binary of a Homebrew keg is named through the formula's opt link
// when that link leads to it, so that the property list outlives `brew upgrade`;
// anything else keeps its resolved path.
func TestHomebrewOpt(t *testing.T) {
	prefix, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	keg := func(version string) string {
		t.Helper()
		bin := filepath.Join(prefix, "Cellar", "macfleet", version, "bin")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		exe := filepath.Join(bin, "macfleet")
		if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return exe
	}
	old, current := keg("0.3.0"), keg("0.4.0")
	if err := os.MkdirAll(filepath.Join(prefix, "opt"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../Cellar/macfleet/0.4.0", filepath.Join(prefix, "opt", "macfleet")); err != nil {
		t.Fatal(err)
	}
	opt := filepath.Join(prefix, "opt", "macfleet", "bin", "macfleet")
	for _, tc := range []struct {
		name, path, want string
	}{
		{"the current keg", current, opt},
		{"an older keg the opt link has left", old, ""},
		{"not in a keg", filepath.Join(prefix, "bin", "macfleet"), ""},
		{"a keg without a version", filepath.Join(prefix, "Cellar", "macfleet"), ""},
		{"another formula's keg", filepath.Join(prefix, "Cellar", "other", "1.0", "bin", "macfleet"), ""},
	} {
		if got := homebrewOpt(tc.path); got != tc.want {
			t.Errorf("%s: homebrewOpt(%s) = %q, want %q", tc.name, tc.path, got, tc.want)
		}
	}
	// Through installExecutable: the keg's binary by any of its links is named by opt.
	if got, err := installExecutable(filepath.Join(prefix, "opt", "macfleet", "bin", "macfleet")); err != nil || got != opt {
		t.Errorf("installExecutable(opt link) = %q, %v; want %q", got, err, opt)
	}
	if got, err := resolveExecutable(opt); err != nil || got != current {
		t.Errorf("resolveExecutable(opt link) = %q, %v; want the keg's file %q", got, err, current)
	}
}
