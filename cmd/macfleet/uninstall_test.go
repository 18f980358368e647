package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/macfleet/macfleet/agent/launchd"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

// fakeMac stands in for macOS: launchctl records its calls and says a service is
// loaded once bootstrapped, until booted out.
type fakeMac struct {
	mu     sync.Mutex
	calls  []string
	loaded map[string]bool
}

func (f *fakeMac) launchctl(_ context.Context, args ...string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, strings.Join(args, " "))
	switch args[0] {
	case "print":
		if !f.loaded[args[1]] {
			return []byte("Could not find service"), errors.New("exit status 113")
		}
	case "bootout":
		delete(f.loaded, args[1])
	case "bootstrap":
		label := strings.TrimSuffix(filepath.Base(args[2]), ".plist")
		f.loaded[args[1]+"/"+label] = true
	}
	return nil, nil
}

// onFakeMac makes install and uninstall believe they run on macOS, as a user (uid
// 501) or, with a systemRoot standing in for /, as root.
func onFakeMac(t *testing.T, systemRoot string) *fakeMac {
	f := &fakeMac{loaded: map[string]bool{}}
	euid := map[bool]int{true: 0, false: 501}[systemRoot != ""]
	oldOS, oldCtl, oldRoot, oldEUID := serviceOS, serviceLaunchctl, serviceSystemRoot, serviceEUID
	serviceOS, serviceLaunchctl, serviceSystemRoot, serviceEUID = "darwin", f.launchctl, systemRoot, func() int { return euid }
	t.Cleanup(func() { serviceOS, serviceLaunchctl, serviceSystemRoot, serviceEUID = oldOS, oldCtl, oldRoot, oldEUID })
	return f
}

// writeNodeCredential writes a kubeconfig holding a node token of node as `macfleet
// nodes credentials` issues it (unsigned: only its claims are read).
func writeNodeCredential(t *testing.T, path, node string) {
	t.Helper()
	claims, err := json.Marshal(map[string]any{"iat": 1000, "exp": 1000 + 86400, "kubernetes.io": map[string]any{
		"namespace": "macfleet-nodes", "serviceaccount": map[string]any{"name": node},
		"secret": map[string]any{"name": node + "-credential", "uid": "u1"}}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["macfleet"] = &clientcmdapi.Cluster{Server: "https://10.0.0.1:6443"}
	cfg.AuthInfos["node"] = &clientcmdapi.AuthInfo{Token: "e30." + base64.RawURLEncoding.EncodeToString(claims) + ".sig"}
	cfg.Contexts["node"] = &clientcmdapi.Context{Cluster: "macfleet", AuthInfo: "node"}
	cfg.CurrentContext = "node"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestAgentUninstall installs the agent and serve as LaunchAgents of a home in a
// temporary directory, then uninstalls them: what install and the agent wrote goes,
// the models the other service uses stay until it goes too, and the cluster's objects
// are named.
func TestAgentUninstall(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	mac := onFakeMac(t, "")
	kc := filepath.Join(home, "mac-1.kubeconfig")
	writeNodeCredential(t, kc, "mac-1")
	exe := []string{"--executable", "/usr/local/bin/macfleet", "--"}
	if _, _, err := runInstall(newAgentInstallCmd(), append(exe, "--kubeconfig", kc, "--node-name", "mac-1")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runInstall(newServeInstallCmd(), append(exe, "--model", "q=hf://o/r/m.gguf")); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(home, "Library", "Application Support", "macfleet")
	logs := filepath.Join(home, "Library", "Logs", "macfleet")
	agentPlist := filepath.Join(home, "Library", "LaunchAgents", launchd.Label+".plist")
	servePlist := filepath.Join(home, "Library", "LaunchAgents", launchd.ServeLabel+".plist")
	model, key := filepath.Join(data, "models", "blobs", "m.gguf"), filepath.Join(data, "state", "identity", "node.key")
	for _, f := range []string{model, key, filepath.Join(logs, "agent.err.log"), filepath.Join(logs, "serve.err.log")} {
		writeFile(t, f)
	}

	// A dry run changes nothing.
	out, _, err := runInstall(newAgentUninstallCmd(), []string{"--dry-run", "--purge"})
	if err != nil || !strings.Contains(out, "Would remove "+kc) || !strings.Contains(out, "also used by dev.macfleet.serve") {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	if !exists(agentPlist) || !exists(kc) || !exists(key) {
		t.Fatal("the dry run removed something")
	}

	out, _, err = runInstall(newAgentUninstallCmd(), []string{"--purge"})
	if err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	uid := "gui/" + strconv.Itoa(os.Getuid())
	if !slices.Contains(mac.calls, "bootout "+uid+"/"+launchd.Label) || mac.loaded[uid+"/"+launchd.Label] {
		t.Errorf("the agent was not booted out: launchctl %q", mac.calls)
	}
	for path, want := range map[string]bool{agentPlist: false, kc: false, key: false, filepath.Join(logs, "agent.err.log"): false,
		servePlist: true, model: true, filepath.Join(logs, "serve.err.log"): true} {
		if exists(path) != want {
			t.Errorf("%s exists = %v after uninstalling the agent, want %v\n%s", path, !want, want, out)
		}
	}
	for _, want := range []string{"Unloaded " + uid, "Removed      " + kc + " (the node credential)", "also used by dev.macfleet.serve",
		"kubectl delete macnode mac-1", "macfleet nodes revoke mac-1", "kubectl -n macfleet-node-lease delete lease mac-1"} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
	if _, _, err := runInstall(newAgentUninstallCmd(), nil); err == nil || !strings.Contains(err.Error(), "not installed") {
		t.Errorf("a second uninstall: %v, want not installed", err)
	}

	// serve goes last, taking the models and the emptied directories with it.
	if out, _, err = runInstall(newServeUninstallCmd(), []string{"--purge"}); err != nil {
		t.Fatalf("serve uninstall: %v\n%s", err, out)
	}
	for _, gone := range []string{servePlist, model, data, logs} {
		if exists(gone) {
			t.Errorf("%s is left after serve uninstall --purge:\n%s", gone, out)
		}
	}
	if strings.Contains(out, "kubectl") {
		t.Errorf("serve has no cluster objects, but the report names some:\n%s", out)
	}
}

// TestAgentInstallSystem installs the agent as a LaunchDaemon under a directory
// standing in for /, run as this test's user (nobody's when the test is root), reads
// the property list back, and uninstalls it.
func TestAgentInstallSystem(t *testing.T) {
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	if me.Uid == "0" {
		if me, err = user.Lookup("nobody"); err != nil {
			t.Skipf("running as root and no user nobody to run the daemon as: %v", err)
		}
	}
	root := t.TempDir()
	mac := onFakeMac(t, root)
	kc := filepath.Join(t.TempDir(), "mini.kubeconfig")
	writeNodeCredential(t, kc, "mini")
	out, stderr, err := runInstall(newAgentInstallCmd(), []string{"--system", "--user", me.Username,
		"--executable", "/usr/local/bin/macfleet", "--", "--kubeconfig", kc, "--node-name", "mini"})
	if err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	// The kubeconfig is the test's: a warning exactly when the daemon's user is another.
	kcInfo, err := os.Stat(kc)
	if err != nil {
		t.Fatal(err)
	}
	if warned, other := strings.Contains(stderr, "sudo chown "+me.Username), ownerOf(kcInfo) != me.Uid; warned != other {
		t.Errorf("kubeconfig of uid %s, daemon user %s (uid %s): warned %v\n%s", ownerOf(kcInfo), me.Username, me.Uid, warned, stderr)
	}
	plistPath := filepath.Join(root, "Library", "LaunchDaemons", launchd.Label+".plist")
	data, err := os.ReadFile(plistPath)
	if err != nil {
		t.Fatal(err)
	}
	plist := parsePlist(t, string(data))
	if plist["UserName"] != me.Username || plist["RunAtLoad"] != true || plist["KeepAlive"] != true {
		t.Errorf("the LaunchDaemon would not start at boot as %s: %v", me.Username, plist)
	}
	if !mac.loaded["system/"+launchd.Label] || !strings.Contains(out, "User:    "+me.Username) {
		t.Errorf("not loaded into the system domain: launchctl %q\n%s", mac.calls, out)
	}
	store := filepath.Join(root, "Library", "Application Support", "macfleet", "models")
	if fi, err := os.Stat(store); err != nil || !fi.IsDir() || ownerOf(fi) != me.Uid {
		t.Fatalf("the store %s was not created for %s (uid %s): %v, %v", store, me.Username, me.Uid, fi, err)
	}

	// Without --system the user's LaunchAgent is looked for, and there is none.
	t.Setenv("HOME", t.TempDir())
	if _, _, err := runInstall(newAgentUninstallCmd(), nil); err == nil || !strings.Contains(err.Error(), "--system") {
		t.Errorf("uninstall without --system: %v, want a hint at --system", err)
	}
	out, _, err = runInstall(newAgentUninstallCmd(), []string{"--system"})
	if err != nil {
		t.Fatalf("uninstall --system: %v\n%s", err, out)
	}
	if exists(plistPath) || exists(kc) || mac.loaded["system/"+launchd.Label] || !exists(store) {
		t.Errorf("after uninstall --system: plist %v, credential %v, loaded %v, store %v; want the store only\n%s",
			exists(plistPath), exists(kc), mac.loaded["system/"+launchd.Label], exists(store), out)
	}
}

// ownerOf is the uid owning a file, as a string.
func ownerOf(fi os.FileInfo) string {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return strconv.Itoa(int(st.Uid))
	}
	return ""
}

// TestAgentUninstallStopsLeftRunners: a runner the agent left running for its next
// start (detached, recorded in its state directory) is stopped by uninstall, instead of
// holding its model's memory until its orphan timeout.
func TestAgentUninstallStopsLeftRunners(t *testing.T) {
	bin := runnerOrSkip(t)
	home := t.TempDir()
	t.Setenv("HOME", home)
	onFakeMac(t, "")
	kc := filepath.Join(home, "mac-1.kubeconfig")
	writeNodeCredential(t, kc, "mac-1")
	if _, _, err := runInstall(newAgentInstallCmd(), []string{"--executable", "/usr/local/bin/macfleet", "--",
		"--kubeconfig", kc, "--node-name", "mac-1"}); err != nil {
		t.Fatal(err)
	}
	model := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := ggufsynth.Write(model, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	runners := filepath.Join(home, "Library", "Application Support", "macfleet", "state", "runners")
	f := runnerproc.NewProcessFactory(runnerproc.ProcessConfig{RunnerPath: bin, Threads: 1, StateDir: runners})
	spec := enginepool.ModelSpec{Name: "tiny", Path: model, Engine: engine.Settings{ContextLength: 512, Parallel: 1}, EstimatedBytes: 64 << 20}
	r, err := f.Start(t.Context(), spec, spec.EstimatedBytes)
	if err != nil {
		t.Fatal(err)
	}
	pr := r.(*runnerproc.ProcessRunner)
	pid := pr.PID()
	t.Cleanup(func() {
		if b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline")); err == nil && strings.Contains(string(b), "macfleet-runner") {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := r.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if !pr.Detach() {
		t.Fatal("the runner could not be left running: no state directory?")
	}

	out, _, err := runInstall(newAgentUninstallCmd(), nil)
	if err != nil || !strings.Contains(out, "Stopped 1 runner(s) the agent left running") {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	for deadline := time.Now().Add(10 * time.Second); runnerAlive(pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("runner pid %d still runs after uninstall", pid)
		}
	}
	if exists(runners) {
		t.Errorf("the state directory %s is left", runners)
	}
}

// runnerAlive says whether pid is a live process: not gone, not a zombie.
func runnerAlive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return syscall.Kill(pid, 0) == nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && !strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}
