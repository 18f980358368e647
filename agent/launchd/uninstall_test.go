package launchd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// installed renders svc for ada with args and reads its property list back.
func installed(t *testing.T, svc Service, args ...string) *Installed {
	t.Helper()
	p, err := Render(Options{Service: svc, Executable: "/usr/local/bin/macfleet", Home: "/Users/ada", UID: 501, AgentArgs: args})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), svc.Label+".plist")
	if err := os.WriteFile(path, p.Plist, 0o644); err != nil {
		t.Fatal(err)
	}
	in, err := ReadInstalled(svc, path, p.Domain)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func TestPlanRemoval(t *testing.T) {
	const (
		ada  = "/Users/ada/Library/Application Support/macfleet"
		logs = "/Users/ada/Library/Logs/macfleet"
		kc   = "/Users/ada/mac-1.kubeconfig"
	)
	agent := installed(t, Agent, "--kubeconfig", kc, "--node-name", "mac-1")
	serve := installed(t, Serve, "--model", "q=hf://o/r/m.gguf")
	ownStore := installed(t, Agent, "--kubeconfig", kc, "--store-dir", "/Volumes/SSD/models", "--state-dir=/Users/ada")
	plist := Item{Path: agent.PlistPath, What: "the launchd service"}
	cred := Item{Path: kc, What: "the node credential"}
	state := Item{Path: ada + "/state", What: dirWhat(StateFlag)}
	store := Item{Path: ada + "/models", What: "the model store"}
	agentLogs := []Item{{Path: logs + "/agent.log", What: "log"}, {Path: logs + "/agent.err.log", What: "log"}}
	keep := func(its []Item, why string) []Item {
		var out []Item
		for _, it := range its {
			out = append(out, with(it, why))
		}
		return out
	}
	tests := []struct {
		name     string
		in       *Installed
		o        RemovalOptions
		want     []Item
		wantKept []Item
	}{
		{name: "agent: service, credential and state; models and logs stay",
			in: agent, o: RemovalOptions{NodeCredential: true, Home: "/Users/ada"},
			want:     []Item{plist, cred, state},
			wantKept: append([]Item{with(store, "--purge removes it")}, keep(agentLogs, "--purge removes it")...)},
		{name: "agent: a kubeconfig that is no node token stays",
			in: agent, o: RemovalOptions{Home: "/Users/ada"},
			want: []Item{plist, state},
			wantKept: append([]Item{with(Item{Path: kc, What: "the agent's kubeconfig"}, "not a node token of `macfleet nodes credentials`: yours to remove"),
				with(store, "--purge removes it")}, keep(agentLogs, "--purge removes it")...)},
		{name: "agent --keep-credential --purge",
			in: agent, o: RemovalOptions{NodeCredential: true, KeepCredential: true, Purge: true, Home: "/Users/ada"},
			want: append([]Item{plist, store}, agentLogs...),
			wantKept: []Item{with(Item{Path: kc, What: "the agent's kubeconfig"}, "kept with --keep-credential"),
				with(state, "holds the TLS key pinned to this Mac: kept with --keep-credential")}},
		{name: "agent --purge keeps the store serve uses",
			in: agent, o: RemovalOptions{NodeCredential: true, Purge: true, Home: "/Users/ada", Others: []*Installed{serve}},
			want:     append([]Item{plist, cred, state}, agentLogs...),
			wantKept: []Item{with(store, "also used by dev.macfleet.serve")}},
		{name: "a state directory that is the home is never removed",
			in: ownStore, o: RemovalOptions{NodeCredential: true, Purge: true, Home: "/Users/ada"},
			want: append([]Item{{Path: ownStore.PlistPath, What: "the launchd service"}, cred,
				{Path: "/Volumes/SSD/models", What: "the model store"}}, agentLogs...),
			wantKept: []Item{{Path: "/Users/ada", What: dirWhat(StateFlag),
				Why: "too broad a path to remove: remove what macfleet put there yourself"}}},
		{name: "serve --purge: store, prompt cache, logs",
			in: serve, o: RemovalOptions{Purge: true, Home: "/Users/ada"},
			want: []Item{{Path: serve.PlistPath, What: "the launchd service"}, store,
				{Path: ada + "/prompt-cache", What: "the prompt cache"},
				{Path: logs + "/serve.log", What: "log"}, {Path: logs + "/serve.err.log", What: "log"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := PlanRemoval(tt.in, tt.o)
			if diff := cmp.Diff(tt.want, r.Remove); diff != "" {
				t.Errorf("removed (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantKept, r.Keep); diff != "" {
				t.Errorf("kept (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{ada, logs}, r.EmptyDirs); diff != "" {
				t.Errorf("empty directories (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTooBroad(t *testing.T) {
	for path, want := range map[string]bool{
		"/": true, "/Users": true, "/Users/ada": true, "/Users/": true, "models": true, "/Users/ada/../ada": true,
		"/Users/ada/Library/Application Support/macfleet/models": false, "/Volumes/SSD": false, "/Users/bob": false,
	} {
		if got := tooBroad(path, "/Users/ada"); got != want {
			t.Errorf("tooBroad(%q) = %v, want %v", path, got, want)
		}
	}
}

func TestReadInstalledRefuses(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadInstalled(Agent, filepath.Join(dir, "none.plist"), "gui/501"); err == nil ||
		!strings.Contains(err.Error(), ErrNotInstalled.Error()) {
		t.Errorf("a missing plist: %v, want ErrNotInstalled", err)
	}
	for name, doc := range map[string]string{
		"another label": `<plist><dict><key>Label</key><string>com.example.other</string>` +
			`<key>ProgramArguments</key><array><string>/bin/x</string><string>agent</string></array></dict></plist>`,
		"serve's plist read as the agent's": `<plist><dict><key>Label</key><string>dev.macfleet.agent</string>` +
			`<key>ProgramArguments</key><array><string>/bin/macfleet</string><string>serve</string></array></dict></plist>`,
		"not a plist": `{"Label": "dev.macfleet.agent"}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name+".plist")
			if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
				t.Fatal(err)
			}
			if in, err := ReadInstalled(Agent, path, "gui/501"); err == nil {
				t.Errorf("ReadInstalled = %+v, want an error", in)
			}
		})
	}
}
