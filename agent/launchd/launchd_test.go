package launchd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// strs turns strings into the []any Parse returns for an array.
func strs(ss ...string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func TestRender(t *testing.T) {
	const (
		exe  = "/usr/local/bin/macfleet"
		kc   = "/Users/ada/.macfleet/node.kubeconfig"
		ada  = "/Users/ada/Library/Application Support/macfleet"
		logs = "/Users/ada/Library/Logs/macfleet"
	)
	common := func(args []any, workDir, logDir string) map[string]any {
		return map[string]any{
			"Label": "dev.macfleet.agent", "ProgramArguments": args,
			"RunAtLoad": true, "KeepAlive": true, "ThrottleInterval": int64(10), "ProcessType": "Interactive",
			"WorkingDirectory": workDir, "StandardOutPath": logDir + "/agent.log", "StandardErrorPath": logDir + "/agent.err.log",
		}
	}
	tests := []struct {
		name       string
		o          Options
		want       map[string]any
		wantPlist  string
		wantDomain string
		wantStore  string
		wantState  string
	}{
		{
			name: "user agent with the default store",
			o:    Options{Executable: exe, Home: "/Users/ada", UID: 501, AgentArgs: []string{"--kubeconfig", kc, "--node-name", "studio-1"}},
			want: common(strs(exe, "agent", "--kubeconfig", kc, "--node-name", "studio-1",
				"--store-dir="+ada+"/models", "--state-dir="+ada+"/state"), ada, logs),
			wantPlist:  "/Users/ada/Library/LaunchAgents/dev.macfleet.agent.plist",
			wantDomain: "gui/501",
			wantStore:  ada + "/models",
			wantState:  ada + "/state",
		},
		{
			name: "system daemon, kubeconfig from the shell",
			o: Options{Executable: exe, System: true, User: "root", AgentArgs: []string{"--node-name=mini-2"},
				Kubeconfig: "/etc/macfleet/node.kubeconfig"},
			want: common(strs(exe, "agent", "--node-name=mini-2", "--kubeconfig=/etc/macfleet/node.kubeconfig",
				"--store-dir=/Library/Application Support/macfleet/models", "--state-dir=/Library/Application Support/macfleet/state"),
				"/Library/Application Support/macfleet", "/Library/Logs/macfleet"),
			wantPlist:  "/Library/LaunchDaemons/dev.macfleet.agent.plist",
			wantDomain: "system",
			wantStore:  "/Library/Application Support/macfleet/models",
			wantState:  "/Library/Application Support/macfleet/state",
		},
		{
			name: "headless daemon run as a user",
			o: Options{Executable: exe, System: true, User: "ada", Root: "/Volumes/Image",
				AgentArgs: []string{"--node-name=mini-3", "--kubeconfig=/Users/ada/mini-3.kubeconfig"}},
			want: func() map[string]any {
				m := common(strs(exe, "agent", "--node-name=mini-3", "--kubeconfig=/Users/ada/mini-3.kubeconfig",
					"--store-dir=/Volumes/Image/Library/Application Support/macfleet/models",
					"--state-dir=/Volumes/Image/Library/Application Support/macfleet/state"),
					"/Volumes/Image/Library/Application Support/macfleet", "/Volumes/Image/Library/Logs/macfleet")
				m["UserName"] = "ada"
				return m
			}(),
			wantPlist:  "/Volumes/Image/Library/LaunchDaemons/dev.macfleet.agent.plist",
			wantDomain: "system",
			wantStore:  "/Volumes/Image/Library/Application Support/macfleet/models",
			wantState:  "/Volumes/Image/Library/Application Support/macfleet/state",
		},
		{
			name: "the user's store and characters XML must escape",
			o: Options{Executable: "/Users/ada/bin/mac&fleet", Home: "/Users/ada", UID: 502, Kubeconfig: "/ignored",
				AgentArgs: []string{"--store-dir", "/Volumes/SSD <fast>/models", "--kubeconfig=" + kc, "--advertise-address", "10.0.0.5:8080"}},
			want: common(strs("/Users/ada/bin/mac&fleet", "agent", "--store-dir", "/Volumes/SSD <fast>/models", "--kubeconfig="+kc,
				"--advertise-address", "10.0.0.5:8080", "--state-dir="+ada+"/state"), ada, logs),
			wantPlist:  "/Users/ada/Library/LaunchAgents/dev.macfleet.agent.plist",
			wantDomain: "gui/502",
			wantStore:  "/Volumes/SSD <fast>/models",
			wantState:  ada + "/state",
		},
		{
			name: "relative paths become absolute against the installing directory",
			o: Options{Executable: exe, Home: "/Users/ada", UID: 501, Dir: "/Users/ada/fleet",
				AgentArgs: []string{"--kubeconfig", "node.kubeconfig", "--fleet-token-file=secrets/token", "--node-name", "rel",
					"-store-dir", "../models", "--state-dir=st", "--", "--runner", "kept"}},
			want: common(strs(exe, "agent", "--kubeconfig", "/Users/ada/fleet/node.kubeconfig",
				"--fleet-token-file=/Users/ada/fleet/secrets/token", "--node-name", "rel", "-store-dir", "/Users/ada/models",
				"--state-dir=/Users/ada/fleet/st", "--", "--runner", "kept"), ada, logs),
			wantPlist:  "/Users/ada/Library/LaunchAgents/dev.macfleet.agent.plist",
			wantDomain: "gui/501",
			wantStore:  "/Users/ada/models",
			wantState:  "/Users/ada/fleet/st",
		},
		{
			name: "environment for tracing",
			o: Options{Executable: exe, Home: "/Users/ada", UID: 501, Kubeconfig: kc,
				Env: []string{"OTEL_SERVICE_NAME=studio-1", "OTEL_EXPORTER_OTLP_ENDPOINT=http://otel:4318", "OTEL_SERVICE_NAME=studio-2", "EMPTY="}},
			// The variables go to the env file, never into the property list.
			want: common(strs(exe, "agent", "--env-file="+ada+"/agent.env", "--kubeconfig="+kc,
				"--store-dir="+ada+"/models", "--state-dir="+ada+"/state"), ada, logs),
			wantPlist:  "/Users/ada/Library/LaunchAgents/dev.macfleet.agent.plist",
			wantDomain: "gui/501",
			wantStore:  ada + "/models",
			wantState:  ada + "/state",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Render(tt.o)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Parse(p.Plist)
			if err != nil {
				t.Fatalf("parsing the rendered plist: %v\n%s", err, p.Plist)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("plist (-want +got):\n%s\n%s", diff, p.Plist)
			}
			if p.PlistPath != tt.wantPlist || p.Domain != tt.wantDomain || p.StoreDir != tt.wantStore || p.StateDir != tt.wantState {
				t.Errorf("plan: plist %s, domain %s, store %s, state %s; want %s, %s, %s, %s", p.PlistPath, p.Domain, p.StoreDir,
					p.StateDir, tt.wantPlist, tt.wantDomain, tt.wantStore, tt.wantState)
			}
			if !strings.HasPrefix(string(p.Plist), `<?xml version="1.0" encoding="UTF-8"?>`) ||
				!strings.Contains(string(p.Plist), `<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN"`) {
				t.Errorf("plist lacks the XML header or doctype:\n%s", p.Plist)
			}
			if !slices.Equal(p.ProgramArguments, stringsOf(t, got["ProgramArguments"])) {
				t.Errorf("plan arguments %q differ from the plist's", p.ProgramArguments)
			}
		})
	}
}

func stringsOf(t *testing.T, v any) []string {
	t.Helper()
	arr, ok := v.([]any)
	if !ok {
		t.Fatalf("%v is not an array", v)
	}
	out := make([]string, len(arr))
	for i, a := range arr {
		out[i], _ = a.(string)
	}
	return out
}

func TestRenderRefuses(t *testing.T) {
	const exe, kc = "/usr/local/bin/macfleet", "/Users/ada/node.kubeconfig"
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{"relative executable", Options{Executable: "macfleet", Home: "/Users/ada", Kubeconfig: kc}, "absolute path"},
		{"no home", Options{Executable: exe, Kubeconfig: kc}, "home directory"},
		{"no kubeconfig", Options{Executable: exe, Home: "/Users/ada"}, "--kubeconfig"},
		{"relative kubeconfig", Options{Executable: exe, Home: "/Users/ada", AgentArgs: []string{"--kubeconfig=kc"}}, "--kubeconfig"},
		{"store under /tmp", Options{Executable: exe, Home: "/Users/ada", Kubeconfig: kc, AgentArgs: []string{"--store-dir=/tmp/models"}}, "temporary"},
		{"store under /private/tmp", Options{Executable: exe, Home: "/Users/ada", Kubeconfig: kc, AgentArgs: []string{"--store-dir", "/private/tmp/m"}}, "temporary"},
		{"store under TMPDIR", Options{Executable: exe, Home: "/Users/ada", Kubeconfig: kc, AgentArgs: []string{"-store-dir=/var/folders/xy/T/m"}}, "temporary"},
		{"state under /tmp", Options{Executable: exe, Home: "/Users/ada", Kubeconfig: kc, AgentArgs: []string{"--state-dir=/tmp"}}, "adopt"},
		{"relative store", Options{Executable: exe, Home: "/Users/ada", Kubeconfig: kc, AgentArgs: []string{"--store-dir=models"}}, "absolute path"},
		{"store flag without a value", Options{Executable: exe, Home: "/Users/ada", Kubeconfig: kc, AgentArgs: []string{"--store-dir"}}, "needs a value"},
		{"env without =", Options{Executable: exe, Home: "/Users/ada", Kubeconfig: kc, Env: []string{"OTEL_SDK_DISABLED"}}, "want KEY=VALUE"},
		{"env without a key", Options{Executable: exe, Home: "/Users/ada", Kubeconfig: kc, Env: []string{"=x"}}, "want KEY=VALUE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Render(tt.o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Render = %v, %v; want an error mentioning %q", p, err, tt.want)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	for name, doc := range map[string]string{
		"not a plist":     `<html/>`,
		"array at top":    `<plist><array/></plist>`,
		"key without val": `<plist><dict><key>a</key></dict></plist>`,
		"value, no key":   `<plist><dict><string>a</string></dict></plist>`,
		"duplicate key":   `<plist><dict><key>a</key><true/><key>a</key><false/></dict></plist>`,
		"bad integer":     `<plist><dict><key>a</key><integer>x</integer></dict></plist>`,
		"unknown type":    `<plist><dict><key>a</key><date>2026</date></dict></plist>`,
		"truncated":       `<plist><dict><key>a</key>`,
	} {
		t.Run(name, func(t *testing.T) {
			if m, err := Parse([]byte(doc)); err == nil {
				t.Errorf("Parse(%s) = %v, want an error", doc, m)
			}
		})
	}
}

func TestCheckPlatform(t *testing.T) {
	if err := CheckPlatform("darwin"); err != nil {
		t.Errorf("darwin: %v", err)
	}
	err := CheckPlatform("linux")
	if !errors.Is(err, ErrNotDarwin) || !strings.Contains(err.Error(), "--dry-run") {
		t.Errorf("linux: %v, want ErrNotDarwin pointing at --dry-run", err)
	}
}

// fakeLaunchctl records calls and answers from a script.
type fakeLaunchctl struct {
	mu     sync.Mutex
	calls  [][]string
	answer func(args []string, n int) ([]byte, error) // n counts calls of that verb
	counts map[string]int
}

func (f *fakeLaunchctl) run(_ context.Context, args ...string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, args)
	if f.counts == nil {
		f.counts = map[string]int{}
	}
	f.counts[args[0]]++
	return f.answer(args, f.counts[args[0]])
}

func TestInstall(t *testing.T) {
	bootstrapRetry = time.Millisecond
	notLoaded := errors.New("exit status 113")
	tests := []struct {
		name      string
		answer    func(args []string, n int) ([]byte, error)
		wantVerbs []string
		wantErr   string
	}{
		{
			name: "fresh install",
			answer: func(args []string, _ int) ([]byte, error) {
				if args[0] == "print" {
					return []byte("Could not find service"), notLoaded
				}
				return nil, nil
			},
			wantVerbs: []string{"print", "bootstrap"},
		},
		{
			name:      "replaces a loaded service",
			answer:    func([]string, int) ([]byte, error) { return nil, nil },
			wantVerbs: []string{"print", "bootout", "bootstrap"},
		},
		{
			name: "retries bootstrap while the old service goes away",
			answer: func(args []string, n int) ([]byte, error) {
				if args[0] == "bootstrap" && n < 3 {
					return []byte("Bootstrap failed: 5: Input/output error"), errors.New("exit status 5")
				}
				return nil, nil
			},
			wantVerbs: []string{"print", "bootout", "bootstrap", "bootstrap", "bootstrap"},
		},
		{
			name: "gives up with launchctl's message",
			answer: func(args []string, _ int) ([]byte, error) {
				if args[0] == "print" {
					return nil, notLoaded
				}
				return []byte("Bootstrap failed: 125: Domain does not support specified action"), errors.New("exit status 125")
			},
			wantVerbs: append([]string{"print"}, slices.Repeat([]string{"bootstrap"}, bootstrapAttempts)...),
			wantErr:   "Domain does not support specified action",
		},
		{
			name: "a failed bootout stops",
			answer: func(args []string, _ int) ([]byte, error) {
				if args[0] == "bootout" {
					return []byte("Boot-out failed: 1: Operation not permitted"), errors.New("exit status 1")
				}
				return nil, nil
			},
			wantVerbs: []string{"print", "bootout"},
			wantErr:   "Operation not permitted",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Render(Options{Executable: "/usr/local/bin/macfleet", Home: "/Users/ada", UID: 501,
				AgentArgs: []string{"--node-name=m1", "--kubeconfig=/Users/ada/node.kubeconfig"}})
			if err != nil {
				t.Fatal(err)
			}
			// Install where the test may write (Render refuses a store under /tmp).
			root := t.TempDir()
			for _, path := range []*string{&p.PlistPath, &p.LogDir, &p.DataDir, &p.StoreDir, &p.StateDir} {
				*path = filepath.Join(root, *path)
			}
			for i := range p.Dirs {
				p.Dirs[i] = filepath.Join(root, p.Dirs[i])
			}
			// An older plist is replaced.
			if err := os.MkdirAll(filepath.Dir(p.PlistPath), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p.PlistPath, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			f := &fakeLaunchctl{answer: tt.answer}
			err = Install(t.Context(), p, f.run)
			if tt.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("Install = %v, want an error with %q", err, tt.wantErr)
			}
			var verbs []string
			for _, c := range f.calls {
				verbs = append(verbs, c[0])
				switch c[0] {
				case "print", "bootout":
					if want := []string{c[0], "gui/501/dev.macfleet.agent"}; !slices.Equal(c, want) {
						t.Errorf("launchctl %q, want %q", c, want)
					}
				case "bootstrap":
					if want := []string{"bootstrap", "gui/501", p.PlistPath}; !slices.Equal(c, want) {
						t.Errorf("launchctl %q, want %q", c, want)
					}
				}
			}
			if diff := cmp.Diff(tt.wantVerbs, verbs); diff != "" {
				t.Errorf("launchctl calls (-want +got):\n%s", diff)
			}
			data, err := os.ReadFile(p.PlistPath)
			if err != nil || string(data) != string(p.Plist) {
				t.Errorf("plist on disk = %q, %v; want the rendered one", data, err)
			}
			if fi, err := os.Stat(p.PlistPath); err != nil || fi.Mode().Perm() != 0o644 {
				t.Errorf("plist mode = %v, %v; want 0644", fi.Mode(), err)
			}
			for _, dir := range []string{p.LogDir, p.DataDir, p.StoreDir, p.StateDir} {
				if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
					t.Errorf("%s not created: %v", dir, err)
				}
			}
		})
	}
}
