package runnerproc

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
	"github.com/macfleet/macfleet/test/support/syncbuf"
)

// TestAttackRunnerReadsTheAgentsSecrets: a runner with a loader bug (the fake
// runner's --fake-read and --fake-dial, started through the agent's ProcessFactory)
// reads the node's kubeconfig and the fleet token file, finds them in its
// environment, and connects to a TCP listener next to it; it must now get
// "permission denied" for each read and connect, and an environment without them.
func TestAttackRunnerReadsTheAgentsSecrets(t *testing.T) {
	if st := sandbox.Probe(); !st.Enforced {
		t.Skipf("no runner sandbox on this kernel: %s", st.Detail)
	}
	bin := procBuildFakeRunner(t)
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	tokenFile := filepath.Join(dir, "fleet-token")
	model := filepath.Join(dir, "models", "m.gguf")
	const nodeSecret, fleetSecret = "NODE-CREDENTIAL-4f2a", "FLEET-TOKEN-9c1d"
	for file, content := range map[string]string{kubeconfig: "users: [{name: node, user: {token: " + nodeSecret + "}}]\n",
		tokenFile: fleetSecret, model: "GGUF"} {
		if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("KUBECONFIG", kubeconfig)
	t.Setenv("MACFLEET_FLEET_TOKEN", fleetSecret)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	// A real runner, confined the same way, still loads and serves its model, and
	// holds neither secret in its environment.
	t.Run("real runner", func(t *testing.T) {
		bin := realRunner(t)
		model := filepath.Join(t.TempDir(), "tiny.gguf")
		if err := ggufsynth.Write(model, ggufsynth.Tiny()); err != nil {
			t.Fatal(err)
		}
		var out syncbuf.Buffer
		f := NewProcessFactory(ProcessConfig{RunnerPath: bin, Threads: 1, Output: &out,
			PromptCacheDir: t.TempDir(), PromptCacheSSDBytes: 64 << 20})
		r := procStart(t, f, enginepool.ModelSpec{Name: "tiny", Path: model, Engine: engine.Settings{ContextLength: 256, Parallel: 1},
			PromptCache: enginepool.PromptCacheSpec{Enabled: true}}, 0)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if err := r.WaitReady(ctx); err != nil {
			t.Fatalf("WaitReady: %v\n%s", err, out.String())
		}
		if got := procPost(t, r, `{"prompt":"hello","max_tokens":4}`); !strings.Contains(got, `"completion_tokens":4`) {
			t.Errorf("completion: %s", got)
		}
		status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(r.PID()), "status"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(status), "\nSeccomp:\t2\n") {
			t.Error("the runner runs without the sandbox's seccomp filter")
		}
		checkEnviron(t, r.PID(), "KUBECONFIG=", fleetSecret)
	})

	for _, target := range []string{kubeconfig, tokenFile} {
		t.Run(filepath.Base(target), func(t *testing.T) {
			f := NewProcessFactory(ProcessConfig{RunnerPath: bin,
				// The runner stays after its failed load so that its environment can be
				// read whatever the machine's load (it is stopped at the test's end).
				Args: []string{"--fake-read", target, "--fake-dial", ln.Addr().String(), "--fake-fail-linger", "1m"}})
			r := procStart(t, f, enginepool.ModelSpec{Name: "m", Path: model}, 0)

			checkEnviron(t, r.PID(), "KUBECONFIG=", fleetSecret)

			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			err = r.WaitReady(ctx)
			if err == nil {
				t.Fatal("WaitReady: the probing runner reported a successful load")
			}
			got := err.Error()
			for _, secret := range []string{nodeSecret, fleetSecret} {
				if strings.Contains(got, secret) {
					t.Errorf("the runner read %s: %s", secret, got)
				}
			}
			for _, want := range []string{"read " + target + ": open " + target + ": permission denied",
				"dial tcp " + ln.Addr().String() + ": socket: permission denied"} {
				if !strings.Contains(got, want) {
					t.Errorf("load error lacks %q:\n%s", want, got)
				}
			}
		})
	}
}

// checkEnviron fails t if the environment of process pid holds any of leaks.
func checkEnviron(t *testing.T, pid int, leaks ...string) {
	t.Helper()
	environ, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		t.Fatal(err)
	}
	for _, leak := range leaks {
		if strings.Contains(string(environ), leak) {
			t.Errorf("the runner's environment holds %s", leak)
		}
	}
}
