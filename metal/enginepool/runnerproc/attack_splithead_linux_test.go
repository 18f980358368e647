package runnerproc

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
	"github.com/macfleet/macfleet/test/support/syncbuf"
)

// TestAttackSplitHeadBelowLandlockABI4: on a kernel whose Landlock is ABI 1 to 3
// (simulated with sandbox.LandlockABIEnv at 3: the launcher then applies what such a
// kernel would), a split replica's head — a runner that parses a tenant's model and
// must connect(2) to its workers — is hostile (the fake runner's --fake-dial) and
// connects to a loopback port that is not its worker's: the agent's, another
// replica's worker. Before, the sandbox reported itself enforced, the head started
// and connected, as Landlock below ABI 4 holds no TCP connect. Now the head is
// refused before it starts, with an error naming Landlock ABI 4, the kernel that has
// it and --allow-unconfined-runners; a runner that connects nowhere still starts
// there, its files confined and its connects refused by the seccomp filter.
func TestAttackSplitHeadBelowLandlockABI4(t *testing.T) {
	if st := sandbox.Probe(); !st.Enforced {
		t.Skipf("no Landlock on this kernel: %s", st.Detail)
	}
	bin := procBuildFakeRunner(t)
	dir := t.TempDir()
	model, secret := filepath.Join(dir, "m.gguf"), filepath.Join(dir, "kubeconfig")
	for file, content := range map[string]string{model: "GGUF", secret: "NODE-CREDENTIAL-77b1"} {
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		return ln
	}
	worker, other := listen(), listen()
	t.Setenv(sandbox.LandlockABIEnv, "3")
	head := enginepool.ModelSpec{Name: "m", Path: model,
		SplitWorkers: []enginepool.SplitWorker{{Addr: worker.Addr().String(), Layers: 1}}}
	// The runner stays after its failed load, so that what it reached can be read.
	probing := []string{"--fake-read", secret, "--fake-dial", other.Addr().String(), "--fake-fail-linger", "1m"}
	loadError := func(r enginepool.Runner) string {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		err := r.(*ProcessRunner).WaitReady(ctx)
		if err == nil {
			t.Fatal("WaitReady: the probing runner reported a successful load")
		}
		return err.Error()
	}

	f := NewProcessFactory(ProcessConfig{RunnerPath: bin, Args: probing})
	if mode, st := f.SandboxStatus(); mode != sandbox.On || st.ConnectConfined || strings.Contains(st.Detail, ", TCP") {
		t.Errorf("under Landlock ABI 3 the factory reports %q, TCP connects confined %v: %s", mode, st.ConnectConfined, st.Detail)
	}
	r, err := f.Start(t.Context(), head, 0)
	if err == nil {
		defer r.Stop(context.Background(), 0)
		t.Fatalf("a split head started under Landlock ABI 3; what it reached: %s", loadError(r))
	}
	var refused *sandbox.ConnectUnconfinedError
	if !errors.As(err, &refused) {
		t.Errorf("Start: %v; want a *sandbox.ConnectUnconfinedError", err)
	}
	for _, want := range []string{"Landlock ABI 4", "Linux 6.7", sandbox.AllowUnconfinedFlag, sandbox.LandlockABIEnv} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal lacks %q: %v", want, err)
		}
	}

	t.Run("runner that connects nowhere", func(t *testing.T) {
		r := procStart(t, f, enginepool.ModelSpec{Name: "m", Path: model}, 0)
		got := loadError(r)
		for _, want := range []string{"read " + secret + ": open " + secret + ": permission denied",
			"dial " + other.Addr().String() + ": dial tcp " + other.Addr().String() + ": socket: permission denied"} {
			if !strings.Contains(got, want) {
				t.Errorf("under Landlock ABI 3 the load error lacks %q:\n%s", want, got)
			}
		}
	})

	// The operator's explicit leave: the head starts, its files still confined, its
	// connects not (the log says so).
	t.Run(sandbox.AllowUnconfinedFlag, func(t *testing.T) {
		var log syncbuf.Buffer
		f := NewProcessFactory(ProcessConfig{RunnerPath: bin, Args: probing, AllowUnconfined: true, Log: funcr.New(func(prefix, args string) {
			log.Write([]byte(prefix + args + "\n"))
		}, funcr.Options{})})
		got := loadError(procStart(t, f, head, 0))
		for _, want := range []string{"read " + secret + ": open " + secret + ": permission denied",
			"dial " + other.Addr().String() + ": connected"} {
			if !strings.Contains(got, want) {
				t.Errorf("the allowed head's load error lacks %q:\n%s", want, got)
			}
		}
		if !strings.Contains(log.String(), "cannot confine TCP connects") {
			t.Errorf("no warning logged for the unconfined head:\n%s", log.String())
		}
	})
}
