package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

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
			args:    []string{"--dry-run", "--system", "--executable", "/opt/macfleet/bin/macfleet", "--", "--node-name=mini"},
			kubeEnv: "/etc/macfleet/mini.kubeconfig:/etc/other",
			wantArgs: []any{"/opt/macfleet/bin/macfleet", "agent", "--node-name=mini", "--kubeconfig=/etc/macfleet/mini.kubeconfig",
				"--store-dir=/Library/Application Support/macfleet/models", "--state-dir=/Library/Application Support/macfleet/state"},
			wantLogs: "/Library/Logs/macfleet/agent.log",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tt.kubeEnv)
			cmd := newAgentInstallCmd()
			var stdout, stderr bytes.Buffer
			cmd.SetArgs(tt.args)
			cmd.SetOut(&stdout)
			cmd.SetErr(&stderr)
			cmd.SilenceUsage, cmd.SilenceErrors = true, true
			if err := cmd.Execute(); err != nil {
				t.Fatal(err)
			}
			plist, err := launchd.Parse(stdout.Bytes())
			if err != nil {
				t.Fatalf("the printed plist does not parse: %v\n%s", err, stdout.String())
			}
			if diff := cmp.Diff(tt.wantArgs, plist["ProgramArguments"]); diff != "" {
				t.Errorf("ProgramArguments (-want +got):\n%s", diff)
			}
			if plist["StandardOutPath"] != tt.wantLogs || plist["KeepAlive"] != true || plist["RunAtLoad"] != true ||
				plist["Label"] != launchd.Label {
				t.Errorf("plist = %v", plist)
			}
			if !strings.Contains(stderr.String(), "Dry run: would write") {
				t.Errorf("stderr = %q, want the dry-run summary", stderr.String())
			}
		})
	}
}

func TestAgentInstallRefuses(t *testing.T) {
	t.Setenv("HOME", "/Users/ada")
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
		{name: "loading off macOS", args: []string{"--executable", "/usr/local/bin/macfleet", "--", "--kubeconfig", "/k"},
			want: "--dry-run", skip: runtime.GOOS == "darwin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.skip {
				t.Skip("macOS has launchd")
			}
			cmd := newAgentInstallCmd()
			var out bytes.Buffer
			cmd.SetArgs(tt.args)
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SilenceUsage, cmd.SilenceErrors = true, true
			err := cmd.Execute()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("install %q = %v; want an error mentioning %q (output %q)", tt.args, err, tt.want, out.String())
			}
		})
	}
}
