package runnerproc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/test/support/syncbuf"
)

// adoptEnv is a real runner binary, a synthesized tiny model and a state directory.
type adoptEnv struct {
	bin, model, stateDir string
	out                  *syncbuf.Buffer
}

func newAdoptEnv(t *testing.T) adoptEnv {
	t.Helper()
	bin := realRunner(t)
	return adoptEnv{bin: bin, model: tinyModel(t), stateDir: t.TempDir(), out: &syncbuf.Buffer{}}
}

// tinyModel writes the tiny random-weight model into t.TempDir() and is its path.
func tinyModel(t *testing.T) string {
	t.Helper()
	model := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := ggufsynth.Write(model, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	return model
}

// factory is a fresh factory on the shared state directory: what a restarted agent has.
func (e adoptEnv) factory(mod ...func(*ProcessConfig)) *ProcessFactory {
	cfg := ProcessConfig{RunnerPath: e.bin, Threads: 1, StateDir: e.stateDir, Output: e.out}
	for _, m := range mod {
		m(&cfg)
	}
	return NewProcessFactory(cfg)
}

func (e adoptEnv) spec() enginepool.ModelSpec {
	return enginepool.ModelSpec{Name: "tiny", Path: e.model, Engine: engine.Settings{ContextLength: 512, Parallel: 1}, EstimatedBytes: 64 << 20}
}

func (e adoptEnv) records(t *testing.T) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(e.stateDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// realRunner is $MACFLEET_RUNNER, or skips the test.
func realRunner(t *testing.T) string {
	t.Helper()
	bin := os.Getenv(RunnerEnv)
	if bin == "" {
		t.Skipf("%s is unset: build the runner with `make runner` and point %s at bin/macfleet-runner (`make test` does both)", RunnerEnv, RunnerEnv)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s=%s: %v", RunnerEnv, bin, err)
	}
	return bin
}

// adoptStart starts (or adopts) a runner, waits for it to be ready and makes sure it
// is gone when the test ends, whoever holds it.
func adoptStart(t *testing.T, f *ProcessFactory, spec enginepool.ModelSpec) *ProcessRunner {
	t.Helper()
	r, err := f.Start(t.Context(), spec, spec.EstimatedBytes)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	pr := r.(*ProcessRunner)
	pid := pr.PID()
	t.Cleanup(func() { killIfRunner(pid) })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := r.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady: %v", err)
	}
	return pr
}

// killIfRunner SIGKILLs pid if it is still a macfleet-runner (a detached runner the
// test left behind), never another process.
func killIfRunner(pid int) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err == nil && strings.Contains(string(b), "macfleet-runner") {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// procAlive says whether pid is a live process (not gone, not a zombie).
func procAlive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return syscall.Kill(pid, 0) == nil // no procfs (darwin)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && !strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}

func TestAdoptRunners(t *testing.T) {
	env := newAdoptEnv(t)

	t.Run("SameSpecIsAdopted", func(t *testing.T) {
		f1 := env.factory()
		r1 := adoptStart(t, f1, env.spec())
		if r1.Adopted() {
			t.Fatal("a started runner reports Adopted")
		}
		if !r1.Detach() {
			t.Fatal("Detach of a runner started with a StateDir = false")
		}
		if err := r1.Stop(t.Context(), time.Second); err == nil {
			t.Error("Stop after Detach succeeded: a detached runner is not ours to stop")
		}

		f2 := env.factory()
		if got, err := f2.RecordedModels(); err != nil || !slices.Equal(got, []string{"tiny"}) {
			t.Errorf("RecordedModels = %q, %v; want [tiny]", got, err)
		}
		began := time.Now()
		r2 := adoptStart(t, f2, env.spec())
		if got, err := f2.RecordedModels(); err != nil || len(got) != 0 {
			t.Errorf("RecordedModels after adoption = %q, %v; want none unclaimed", got, err)
		}
		t.Logf("adopted pid %d and ready in %v", r2.PID(), time.Since(began))
		if r2.PID() != r1.PID() || !r2.Adopted() {
			t.Fatalf("second factory: pid %d adopted %v; want the first runner's pid %d, adopted", r2.PID(), r2.Adopted(), r1.PID())
		}
		if body := procPost(t, r2, `{"prompt":"Hello","max_tokens":4,"temperature":0}`); !strings.Contains(body, `"choices"`) {
			t.Errorf("completion through the adopted runner = %s", body)
		}
		gauge, err := enginepool.NewGauge()
		if err != nil {
			t.Fatal(err)
		}
		if fp, err := gauge.Process(r2.PID()); err != nil || fp <= 0 {
			t.Errorf("footprint of the adopted runner = %d, %v", fp, err)
		}
		// Claimed: StopUnclaimed leaves it alone.
		if n, err := f2.StopUnclaimed(t.Context()); n != 0 || err != nil {
			t.Errorf("StopUnclaimed = %d, %v; want 0, nil", n, err)
		}
		if !procAlive(r2.PID()) {
			t.Fatal("StopUnclaimed stopped the adopted runner")
		}

		// Its exit is seen although it is not our child.
		if err := syscall.Kill(r2.PID(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		procWaitClosed(t, r2.Exited(), 10*time.Second, "Exited of the adopted runner after SIGKILL")
		var re *RunnerError
		if !errors.As(r2.ExitErr(), &re) || re.Phase != PhaseExit {
			t.Errorf("ExitErr = %v, want a *RunnerError of phase exit", r2.ExitErr())
		}
		t.Logf("ExitErr: %v", r2.ExitErr())
		if recs := env.records(t); len(recs) != 0 {
			t.Errorf("records left after the runner exited: %v", recs)
		}
		if _, err := os.Stat(r2.dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket directory %s left: %v", r2.dir, err)
		}
	})

	t.Run("ChangedSpecIsNotAdoptedAndStopUnclaimedStopsIt", func(t *testing.T) {
		old := adoptStart(t, env.factory(), env.spec())
		if !old.Detach() {
			t.Fatal("Detach = false")
		}
		f2 := env.factory()
		spec := env.spec()
		spec.Engine.ContextLength = 1024
		r := adoptStart(t, f2, spec)
		if r.Adopted() || r.PID() == old.PID() {
			t.Fatalf("a changed spec got pid %d adopted %v; want a new runner", r.PID(), r.Adopted())
		}
		began := time.Now()
		n, err := f2.StopUnclaimed(t.Context())
		if n != 1 || err != nil {
			t.Fatalf("StopUnclaimed = %d, %v; want 1, nil", n, err)
		}
		t.Logf("StopUnclaimed took %v", time.Since(began))
		procWaitFor(t, 10*time.Second, "the unclaimed runner to be gone", func() bool { return !procAlive(old.PID()) })
		if !procAlive(r.PID()) {
			t.Error("StopUnclaimed stopped the runner the factory started")
		}
		if recs := env.records(t); len(recs) != 1 {
			t.Errorf("records %v, want only the new runner's", recs)
		}
		if err := r.Stop(t.Context(), 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if recs := env.records(t); len(recs) != 0 {
			t.Errorf("records left after Stop: %v", recs)
		}
	})

	t.Run("DeadRunnerIsNotAdopted", func(t *testing.T) {
		old := adoptStart(t, env.factory(), env.spec())
		old.Detach()
		if err := syscall.Kill(old.PID(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		procWaitFor(t, 10*time.Second, "the runner to die", func() bool { return procGone(old.PID()) })
		if recs := env.records(t); len(recs) != 1 {
			t.Fatalf("records %v: want the dead runner's record to be left over", recs)
		}
		f2 := env.factory()
		r := adoptStart(t, f2, env.spec())
		if r.Adopted() || r.PID() == old.PID() {
			t.Fatalf("got pid %d adopted %v, want a new runner", r.PID(), r.Adopted())
		}
		if recs := env.records(t); len(recs) != 1 {
			t.Errorf("records %v, want only the new runner's", recs)
		}
		if err := r.Stop(t.Context(), 5*time.Second); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("RecycledPIDIsNeitherAdoptedNorKilled", func(t *testing.T) {
		f := env.factory()
		spec := env.spec()
		path, err := ResolveRunnerPath(env.bin)
		if err != nil {
			t.Fatal(err)
		}
		fp, err := f.fingerprint(path, spec, f.engineArgs(spec, spec.EstimatedBytes))
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name      string
			startTime func(actual uint64) uint64
			unclaimed bool // StopUnclaimed meets the record rather than Start
		}{
			{"start time differs", func(a uint64) uint64 { return a + 1 }, false},
			{"start time unknown", func(uint64) uint64 { return 0 }, false},
			{"start time differs, StopUnclaimed", func(a uint64) uint64 { return a + 1 }, true},
			{"start time unknown, StopUnclaimed", func(uint64) uint64 { return 0 }, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				sleep := exec.Command("sleep", "300")
				if err := sleep.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
				st, err := procStartTime(sleep.Process.Pid)
				if err != nil {
					t.Fatal(err)
				}
				rec := &runnerRecord{ID: "r00000000deadbeef", Model: spec.Name, PID: sleep.Process.Pid,
					StartTime: tc.startTime(st), Network: "unix", Address: filepath.Join(t.TempDir(), "r.sock"),
					Fingerprint: fp, CeilingBytes: spec.EstimatedBytes, Nonce: "0123456789abcdef", Created: time.Now()}
				if err := writeRecord(env.stateDir, rec); err != nil {
					t.Fatal(err)
				}
				f := env.factory() // a restarted agent
				if tc.unclaimed {
					if n, err := f.StopUnclaimed(t.Context()); n != 0 || err != nil {
						t.Errorf("StopUnclaimed = %d, %v; want 0, nil", n, err)
					}
				} else {
					r := adoptStart(t, f, spec)
					if r.Adopted() || r.PID() == sleep.Process.Pid {
						t.Errorf("got pid %d adopted %v, want a new runner", r.PID(), r.Adopted())
					}
					if err := r.Stop(t.Context(), 5*time.Second); err != nil {
						t.Fatal(err)
					}
				}
				if !procAlive(sleep.Process.Pid) {
					t.Fatal("the process that took the recorded pid was killed")
				}
				if _, err := os.Stat(f.recordPath(rec.ID)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("stale record kept: %v", err)
				}
			})
		}
	})

	t.Run("FailedLoadLeavesNothingBehind", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "bad.gguf")
		if err := os.WriteFile(bad, []byte(strings.Repeat("not a model ", 100)), 0o644); err != nil {
			t.Fatal(err)
		}
		spec := env.spec()
		spec.Path = bad
		r, err := env.factory().Start(t.Context(), spec, 0)
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		var re *RunnerError
		if err := r.WaitReady(t.Context()); !errors.As(err, &re) || re.Phase != PhaseLoad {
			t.Fatalf("WaitReady = %v, want a load failure", err)
		}
		procWaitClosed(t, r.Exited(), 30*time.Second, "the runner to exit after a failed load")
		// A detached runner is still our child: its exit status is known.
		if !errors.As(r.ExitErr(), &re) || re.ExitCode != RunnerExitLoadFailed {
			t.Errorf("ExitErr = %v, want exit status %d", r.ExitErr(), RunnerExitLoadFailed)
		}
		if left, _ := filepath.Glob(filepath.Join(env.stateDir, "*")); len(left) != 0 {
			t.Errorf("state directory not empty after the runner exited: %v", left)
		}
	})

	t.Run("OrphanTimeout", func(t *testing.T) {
		f := env.factory(func(c *ProcessConfig) { c.OrphanTimeout = time.Second })
		r := adoptStart(t, f, env.spec())
		// Requests (here status polls, in an agent the enforcer's) keep it alive for
		// well past its timeout.
		for until := time.Now().Add(2500 * time.Millisecond); time.Now().Before(until); time.Sleep(200 * time.Millisecond) {
			if _, err := r.Status(t.Context()); err != nil {
				t.Fatalf("the runner stopped while requests kept arriving: %v", err)
			}
		}
		r.Detach()
		began := time.Now()
		procWaitFor(t, 15*time.Second, "the orphaned runner to exit by itself", func() bool { return !procAlive(r.PID()) })
		t.Logf("orphaned runner exited %v after its last request (timeout 1s)", time.Since(began).Round(10*time.Millisecond))
		logText, err := os.ReadFile(f.logPath(r.rec.ID))
		if err != nil || !strings.Contains(string(logText), "No request within the orphan timeout") {
			t.Errorf("the runner's log (%v) does not say it stopped for the orphan timeout:\n%s", err, logText)
		}
		// Its record is left for the next agent, which cleans it up. (Until this
		// process, its parent here, has reaped it, a zombie still answers to its pid and
		// start time, and would be "stopped".)
		procWaitClosed(t, r.Exited(), 15*time.Second, "the orphaned runner to be reaped")
		if n, err := env.factory().StopUnclaimed(t.Context()); n != 0 || err != nil {
			t.Errorf("StopUnclaimed = %d, %v; want 0, nil", n, err)
		}
		if recs := env.records(t); len(recs) != 0 {
			t.Errorf("records left: %v", recs)
		}
	})
}

// A pool stopped in keep-runners mode leaves its runner running, and the pool of the
// next agent adopts it instead of loading the model again.
func TestPoolKeepRunnersOnExit(t *testing.T) {
	env := newAdoptEnv(t)
	gauge, err := enginepool.NewGauge()
	if err != nil {
		t.Fatal(err)
	}
	cfg := enginepool.Config{CeilingBytes: 4 << 30, KeepRunnersOnExit: true, AgentPID: -1}
	newPool := func(f *ProcessFactory) *enginepool.Pool {
		p, err := enginepool.New(cfg, f, gauge, nil, testr.New(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Register(env.spec()); err != nil {
			t.Fatal(err)
		}
		return p
	}

	p1 := newPool(env.factory())
	ctx1, stop1 := context.WithCancel(t.Context())
	ran1 := make(chan error, 1)
	go func() { ran1 <- p1.Run(ctx1) }()
	if err := p1.Load(t.Context(), "tiny"); err != nil {
		t.Fatal(err)
	}
	pid := modelPID(p1, "tiny")
	t.Cleanup(func() { killIfRunner(pid) })
	stop1()
	select {
	case err := <-ran1:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	if !procAlive(pid) {
		t.Fatal("the runner did not survive its pool")
	}
	if s := p1.Snapshot(); s.CommittedBytes != 0 || s.Runners != 0 || s.Models[0].State != enginepool.StateUnloaded {
		t.Errorf("detached pool: committed %d runners %d state %s; want 0, 0, Unloaded", s.CommittedBytes, s.Runners, s.Models[0].State)
	}

	f2 := env.factory()
	p2 := newPool(f2)
	ctx2, stop2 := context.WithCancel(t.Context())
	defer stop2()
	go func() { _ = p2.Run(ctx2) }()
	began := time.Now()
	if err := p2.Load(t.Context(), "tiny"); err != nil {
		t.Fatal(err)
	}
	t.Logf("load by adoption took %v", time.Since(began))
	if got := modelPID(p2, "tiny"); got != pid {
		t.Fatalf("the new pool's runner is pid %d, want the adopted %d", got, pid)
	}
	l, err := p2.Acquire(t.Context(), "tiny")
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.Runner()
	if err != nil {
		t.Fatal(err)
	}
	if !r.(*ProcessRunner).Adopted() {
		t.Error("the new pool's runner was started, not adopted")
	}
	body := procPost(t, r, `{"prompt":"Hi","max_tokens":3,"temperature":0}`)
	l.Release()
	if !strings.Contains(body, `"choices"`) {
		t.Errorf("completion = %s", body)
	}
	if n, err := f2.StopUnclaimed(t.Context()); n != 0 || err != nil {
		t.Errorf("StopUnclaimed = %d, %v", n, err)
	}
	// An ordinary close stops it.
	if err := p2.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	procWaitFor(t, 10*time.Second, "the runner to stop with the second pool", func() bool { return !procAlive(pid) })
	if recs := env.records(t); len(recs) != 0 {
		t.Errorf("records left: %v", recs)
	}
}

func modelPID(p *enginepool.Pool, name string) int {
	for _, m := range p.Snapshot().Models {
		if m.Name == name {
			return m.PID
		}
	}
	return 0
}
