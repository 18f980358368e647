package runnerproc

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
	"github.com/macfleet/macfleet/test/support/syncbuf"
)

// TestAttackRunnerOnAMachineWithoutTheSandbox: the agent runs where its runners
// cannot be confined (Linux without Landlock, macOS without sandbox-exec; simulated
// with sandbox.UnavailableEnv, the one fake here) and a tenant's deployment asks for
// a runner, which parses the tenant's model file. Before, the runner started
// unconfined, silently but for a log line: a loader bug would read the agent's
// credentials. Now the agent refuses to start it with an error naming the fix and
// --allow-unconfined-runners, and reports itself "on" and unenforced; with that flag
// the operator's leave is explicit: the real runner starts and serves, and the
// factory reports "allow-unconfined".
func TestAttackRunnerOnAMachineWithoutTheSandbox(t *testing.T) {
	bin := realRunner(t)
	spec := enginepool.ModelSpec{Name: "tiny", Path: tinyModel(t), Engine: engine.Settings{ContextLength: 256, Parallel: 1}}
	t.Setenv(sandbox.UnavailableEnv, "1")

	refused := NewProcessFactory(ProcessConfig{RunnerPath: bin, Threads: 1})
	r, err := refused.Start(t.Context(), spec, 0)
	if err == nil {
		_ = r.Stop(context.Background(), 0)
		t.Fatal("a runner started on a machine that cannot confine it, without --allow-unconfined-runners")
	}
	var unconfined *sandbox.UnconfinedError
	if !errors.As(err, &unconfined) || !strings.Contains(err.Error(), sandbox.AllowUnconfinedFlag) ||
		!strings.Contains(err.Error(), sandbox.UnavailableEnv) {
		t.Errorf("Start: %v; want a *sandbox.UnconfinedError naming %s and why the sandbox is unavailable", err, sandbox.AllowUnconfinedFlag)
	}
	if mode, st := refused.SandboxStatus(); mode != sandbox.On || st.Enforced {
		t.Errorf("the refusing factory reports %q, enforced %v; want %q and not enforced", mode, st.Enforced, sandbox.On)
	}

	var out syncbuf.Buffer
	allowed := NewProcessFactory(ProcessConfig{RunnerPath: bin, Threads: 1, AllowUnconfined: true, Output: &out})
	if mode, _ := allowed.SandboxStatus(); mode != sandbox.AllowedUnconfined {
		t.Errorf("with --allow-unconfined-runners the factory reports %q, want %q", mode, sandbox.AllowedUnconfined)
	}
	pr := procStart(t, allowed, spec, 0)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := pr.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady with --allow-unconfined-runners: %v\n%s", err, out.String())
	}
	if got := procPost(t, pr, `{"prompt":"hello","max_tokens":4}`); !strings.Contains(got, `"completion_tokens":4`) {
		t.Errorf("a completion with --allow-unconfined-runners: %s", got)
	}
}
