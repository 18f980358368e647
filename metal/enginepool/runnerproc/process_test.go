package runnerproc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/test/support/syncbuf"
)

// TestProcessRunner runs real processes of metal/enginepool/runnerproc/internal/fakerunner, a program that
// speaks the runner protocol and can be told to misbehave. It is built once into the
// test's temporary directory; the subtests run in parallel.
func TestProcessRunner(t *testing.T) {
	bin := procBuildFakeRunner(t)
	model := filepath.Join(t.TempDir(), "model.gguf")
	if err := os.WriteFile(model, []byte("GGUF"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := enginepool.ModelSpec{Name: "tiny", Path: model, Engine: engine.Settings{ContextLength: 1024, Parallel: 2, KVCacheType: "q8_0"}}

	t.Run("ReadyAndControlCalls", func(t *testing.T) {
		t.Parallel()
		var out syncbuf.Buffer
		f := NewProcessFactory(ProcessConfig{RunnerPath: bin, Output: &out, Threads: 2,
			Args: []string{"--fake-load-time", "200ms", "--fake-chatty"}})
		ctx := t.Context()
		began := time.Now()
		r := procStart(t, f, spec, 3<<30)
		started := time.Since(began)
		if err := r.WaitReady(ctx); err != nil {
			t.Fatalf("WaitReady: %v", err)
		}
		ready := time.Since(began)
		t.Logf("start %v (runner reported %v), ready after %v with a 200ms fake load",
			started, r.StartupDuration(), ready)
		if r.Progress() != 1 {
			t.Errorf("Progress() = %v after ready, want 1", r.Progress())
		}

		st, err := r.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// CeilingBytes: the ceiling reached the runner as --ceiling-bytes.
		want := enginepool.RunnerStatus{State: "ready", PID: r.PID(), FootprintBytes: 1 << 20, KVCellsTotal: 1024, SlotsTotal: 2,
			CeilingBytes: 3 << 30}
		if d := cmp.Diff(want, st); d != "" {
			t.Errorf("Status (-want +got):\n%s", d)
		}

		limits := enginepool.Limits{CeilingBytes: 4 << 30, HardLimitBytes: 20 << 30, HostUsedBytes: 7 << 30}
		if err := r.SetLimits(ctx, limits); err != nil {
			t.Fatal(err)
		}
		var got enginepool.Limits
		procGetJSON(t, r, "/debug/limits", &got)
		if d := cmp.Diff(limits, got); d != "" {
			t.Errorf("limits the runner received (-sent +got):\n%s", d)
		}
		cc, err := r.ClearCache(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(enginepool.CacheClearResult{BytesReclaimed: 4096, EntriesCleared: 2}, cc); d != "" {
			t.Errorf("ClearCache (-want +got):\n%s", d)
		}
		if n, err := r.Abort(ctx); err != nil || n != 0 {
			t.Errorf("Abort with nothing in flight = %d, %v; want 0, nil", n, err)
		}
		// A non-streamed completion through Client() and BaseURL().
		body := procPost(t, r, `{"prompt":"hi","max_tokens":3}`)
		if !strings.Contains(body, `"text":"t0 t1 t2 "`) {
			t.Errorf("completion = %s", body)
		}

		began = time.Now()
		if err := r.Stop(ctx, 5*time.Second); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		t.Logf("graceful stop (POST /shutdown) took %v", time.Since(began))
		procCheckGone(t, r)
		if r.StoppedBy() != StopShutdown {
			t.Errorf("StoppedBy = %q, want %q", r.StoppedBy(), StopShutdown)
		}
		// Output got every line with the model's prefix, the noise before the
		// listening line included.
		for _, line := range []string{"[tiny] fakerunner starting", "[tiny] {not json", `[tiny] {"event":"listening"`, "[tiny] fakerunner: stopped"} {
			if !strings.Contains(out.String(), line) {
				t.Errorf("output lacks %q:\n%s", line, out.String())
			}
		}
		if _, err := r.Status(ctx); !errors.Is(err, ErrRunnerExited) {
			t.Errorf("Status after Stop: %v, want ErrRunnerExited", err)
		}
	})

	t.Run("LoadFailure", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name     string
			args     []string
			path     string
			wantMsg  string
			wantExit int // -1: WaitReady saw /health fail while the runner still ran
		}{{
			name:     "exits at once",
			args:     []string{"--fake-fail-load", "unknown model architecture 'nope'"},
			wantMsg:  "unknown model architecture 'nope'",
			wantExit: RunnerExitLoadFailed,
		}, {
			name:     "reports on health first",
			args:     []string{"--fake-fail-load", "out of memory", "--fake-fail-linger", "1m"},
			wantMsg:  "out of memory",
			wantExit: -1,
		}, {
			name:     "missing model file",
			path:     filepath.Join(t.TempDir(), "absent.gguf"),
			wantMsg:  "absent.gguf: no such file or directory",
			wantExit: RunnerExitLoadFailed,
		}}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				f := NewProcessFactory(ProcessConfig{RunnerPath: bin, Args: tt.args})
				s := spec
				if tt.path != "" {
					s.Path = tt.path
				}
				r := procStart(t, f, s, 0)
				err := r.WaitReady(t.Context())
				var re *RunnerError
				if !errors.As(err, &re) {
					t.Fatalf("WaitReady = %v, want a *RunnerError", err)
				}
				// The exit status may not be known yet when /health reported the
				// failure first; it is checked on ExitErr below once the process is reaped.
				if re.Phase != PhaseLoad || !strings.Contains(re.Message, tt.wantMsg) || (tt.wantExit < 0 && re.ExitCode != tt.wantExit) {
					t.Errorf("WaitReady error %+v: want phase load, message %q, exit %d", re, tt.wantMsg, tt.wantExit)
				}
				if !strings.Contains(err.Error(), tt.wantMsg) {
					t.Errorf("error %q lacks %q", err.Error(), tt.wantMsg)
				}
				// A runner that reports the failure on /health and lingers may do so
				// before its stderr line has been read: poll the capture.
				deadline := time.Now().Add(5 * time.Second)
				for !strings.Contains(r.Stderr(), tt.wantMsg) && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if !strings.Contains(r.Stderr(), tt.wantMsg) {
					t.Errorf("stderr %q lacks %q", r.Stderr(), tt.wantMsg)
				}
				if tt.wantExit >= 0 {
					// It exited by itself: that is a failure, not a requested stop.
					<-r.Exited()
					if !errors.As(r.ExitErr(), &re) || re.ExitCode != tt.wantExit {
						t.Errorf("ExitErr = %v, want exit status %d", r.ExitErr(), tt.wantExit)
					}
				}
			})
		}
	})

	t.Run("StopEscalation", func(t *testing.T) {
		t.Parallel()
		const grace, killAfter = 300 * time.Millisecond, 300 * time.Millisecond
		tests := []struct {
			name    string
			args    []string
			want    StopStep
			atLeast time.Duration
		}{
			{"graceful", nil, StopShutdown, 0},
			{"ignores shutdown", []string{"--fake-ignore-shutdown"}, StopTerm, grace},
			{"ignores shutdown and SIGTERM", []string{"--fake-ignore-shutdown", "--fake-ignore-sigterm"}, StopKill, grace + killAfter},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				f := NewProcessFactory(ProcessConfig{RunnerPath: bin, Args: tt.args, KillAfter: killAfter})
				r := procStart(t, f, spec, 0)
				if err := r.WaitReady(t.Context()); err != nil {
					t.Fatal(err)
				}
				began := time.Now()
				if err := r.Stop(t.Context(), grace); err != nil {
					t.Fatalf("Stop: %v", err)
				}
				took := time.Since(began)
				t.Logf("stopped by %s in %v", r.StoppedBy(), took)
				procCheckGone(t, r)
				if r.StoppedBy() != tt.want {
					t.Errorf("StoppedBy = %q, want %q", r.StoppedBy(), tt.want)
				}
				if took < tt.atLeast || took > tt.atLeast+5*time.Second {
					t.Errorf("Stop took %v, want %v plus a little", took, tt.atLeast)
				}
				if err := r.ExitErr(); err != nil {
					t.Errorf("ExitErr after a requested stop = %v", err)
				}
				// Idempotent: a second Stop returns at once, not after another grace
				// period (the bound leaves room for a loaded machine).
				began = time.Now()
				if err := r.Stop(t.Context(), grace); err != nil || time.Since(began) >= grace {
					t.Errorf("second Stop = %v after %v", err, time.Since(began))
				}
			})
		}
	})

	t.Run("ConcurrentStop", func(t *testing.T) {
		t.Parallel()
		f := NewProcessFactory(ProcessConfig{RunnerPath: bin})
		r := procStart(t, f, spec, 0)
		if err := r.WaitReady(t.Context()); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Go(func() { errs <- r.Stop(t.Context(), 5*time.Second) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("concurrent Stop: %v", err)
			}
		}
		procCheckGone(t, r)
		if r.StoppedBy() != StopShutdown || r.ExitErr() != nil {
			t.Errorf("StoppedBy %q, ExitErr %v; want shutdown, nil", r.StoppedBy(), r.ExitErr())
		}
	})

	t.Run("StopContextEndKillsAtOnce", func(t *testing.T) {
		t.Parallel()
		f := NewProcessFactory(ProcessConfig{RunnerPath: bin, KillAfter: time.Minute,
			Args: []string{"--fake-ignore-shutdown", "--fake-ignore-sigterm"}})
		r := procStart(t, f, spec, 0)
		if err := r.WaitReady(t.Context()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		began := time.Now()
		if err := r.Stop(ctx, time.Minute); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		took := time.Since(began)
		t.Logf("Stop with a 200ms context and a 1m grace returned after %v", took)
		procCheckGone(t, r)
		if took > 5*time.Second || r.StoppedBy() != StopKill {
			t.Errorf("Stop took %v, StoppedBy %q; want well under the grace, sigkill", took, r.StoppedBy())
		}
	})

	t.Run("CrashMidStream", func(t *testing.T) {
		t.Parallel()
		f := NewProcessFactory(ProcessConfig{RunnerPath: bin, Args: []string{"--fake-crash-after", "3"}})
		r := procStart(t, f, spec, 0)
		if err := r.WaitReady(t.Context()); err != nil {
			t.Fatal(err)
		}
		events, err := procStream(t.Context(), r, 100)
		if err == nil {
			t.Errorf("stream ended cleanly after %q, want a broken connection", events)
		}
		if len(events) != 3 || slices.Contains(events, "[DONE]") {
			t.Errorf("stream events %q, want exactly 3 tokens and no [DONE]", events)
		}
		procWaitClosed(t, r.Exited(), 10*time.Second, "Exited after the crash")
		var re *RunnerError
		if !errors.As(r.ExitErr(), &re) || re.Phase != PhaseExit || re.Signal != "killed" || re.ExitCode != -1 {
			t.Fatalf("ExitErr = %#v, want an exit by SIGKILL", r.ExitErr())
		}
		t.Logf("ExitErr: %v", r.ExitErr())
		procCheckGone(t, r)
		// Stop after a crash returns at once and keeps the crash as the reason.
		if err := r.Stop(t.Context(), time.Second); err != nil || r.ExitErr() == nil {
			t.Errorf("Stop after crash = %v, ExitErr %v", err, r.ExitErr())
		}
	})

	t.Run("Abort", func(t *testing.T) {
		t.Parallel()
		f := NewProcessFactory(ProcessConfig{RunnerPath: bin, Args: []string{"--fake-token-interval", "20ms"}})
		r := procStart(t, f, spec, 0)
		if err := r.WaitReady(t.Context()); err != nil {
			t.Fatal(err)
		}
		type result struct {
			events []string
			err    error
		}
		results := make(chan result, 2)
		for range 2 {
			go func() {
				ev, err := procStream(t.Context(), r, 100000)
				results <- result{ev, err}
			}()
		}
		procWaitFor(t, 10*time.Second, "two requests in flight", func() bool {
			st, err := r.Status(t.Context())
			return err == nil && st.RequestsActive == 2
		})
		n, err := r.Abort(t.Context())
		if err != nil || n != 2 {
			t.Fatalf("Abort = %d, %v; want 2", n, err)
		}
		for range 2 {
			res := <-results
			if res.err != nil || len(res.events) == 0 || !strings.Contains(res.events[len(res.events)-1], `"code":"aborted"`) {
				t.Errorf("aborted stream: err %v, last events %q", res.err, res.events[max(0, len(res.events)-2):])
			}
		}
	})

	t.Run("Loopback", func(t *testing.T) {
		t.Parallel()
		f := NewProcessFactory(ProcessConfig{RunnerPath: bin, Loopback: true})
		r := procStart(t, f, spec, 0)
		if !strings.HasPrefix(r.BaseURL(), "http://127.0.0.1:") {
			t.Errorf("BaseURL = %q, want loopback TCP", r.BaseURL())
		}
		if err := r.WaitReady(t.Context()); err != nil {
			t.Fatal(err)
		}
		if body := procPost(t, r, `{"prompt":"hi","max_tokens":2}`); !strings.Contains(body, `"text":"t0 t1 "`) {
			t.Errorf("completion = %s", body)
		}
		if err := r.Stop(t.Context(), 5*time.Second); err != nil {
			t.Fatal(err)
		}
		procCheckGone(t, r)
	})

	t.Run("DiesWithAgent", func(t *testing.T) {
		t.Parallel()
		procTestDiesWithAgent(t, bin, model)
	})

	t.Run("StartFailures", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name       string
			cfg        ProcessConfig
			ctxTimeout time.Duration
			wantPID    bool
			wantExit   int
			wantErr    error
			wantText   string
		}{{
			name:     "bad flags",
			cfg:      ProcessConfig{RunnerPath: bin, Args: []string{"--no-such-flag"}},
			wantPID:  true,
			wantExit: RunnerExitBadFlags,
			wantText: "flag provided but not defined: -no-such-flag",
		}, {
			name:     "never listens",
			cfg:      ProcessConfig{RunnerPath: bin, Args: []string{"--fake-no-listen"}, ListenTimeout: 300 * time.Millisecond},
			wantPID:  true,
			wantExit: -1,
			wantText: "no listening line within 300ms",
		}, {
			name:       "context ends before listening",
			cfg:        ProcessConfig{RunnerPath: bin, Args: []string{"--fake-no-listen"}},
			ctxTimeout: 300 * time.Millisecond,
			wantPID:    true,
			wantExit:   -1,
			wantErr:    context.DeadlineExceeded,
		}, {
			name:     "no runner binary",
			cfg:      ProcessConfig{RunnerPath: filepath.Join(t.TempDir(), "absent")},
			wantExit: -1,
			wantErr:  os.ErrNotExist,
		}, {
			name:     "socket directory too long",
			cfg:      ProcessConfig{RunnerPath: bin, SocketDir: "/tmp/" + strings.Repeat("d", 90)},
			wantExit: -1,
			wantText: "too long for a unix socket path",
		}}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				ctx := t.Context()
				if tt.ctxTimeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.ctxTimeout)
					defer cancel()
				}
				r, err := NewProcessFactory(tt.cfg).Start(ctx, spec, 0)
				if err == nil {
					r.Stop(context.Background(), 0)
					t.Fatal("Start succeeded")
				}
				var re *RunnerError
				if !errors.As(err, &re) || re.Phase != PhaseStart {
					t.Fatalf("Start = %v, want a *RunnerError of phase start", err)
				}
				t.Logf("Start: %v", err)
				if (re.PID > 0) != tt.wantPID || re.ExitCode != tt.wantExit {
					t.Errorf("pid %d, exit %d; want a pid %v, exit %d", re.PID, re.ExitCode, tt.wantPID, tt.wantExit)
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Errorf("error %v does not wrap %v", err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantText) {
					t.Errorf("error %q and stderr %q lack %q", err, re.Stderr, tt.wantText)
				}
				if re.PID > 0 && !procGone(re.PID) {
					t.Errorf("pid %d still exists after a failed Start", re.PID)
				}
			})
		}
	})
}

// TestProcessRunnerRealRunner starts the real macfleet-runner on a synthesized tiny
// model and serves completions through Client().
func TestProcessRunnerRealRunner(t *testing.T) {
	bin := os.Getenv(RunnerEnv)
	if bin == "" {
		t.Skipf("%s is unset: build the runner with `make runner` and point %s at bin/macfleet-runner (`make test` does both)", RunnerEnv, RunnerEnv)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s=%s: %v", RunnerEnv, bin, err)
	}
	model := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := ggufsynth.Write(model, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	var out syncbuf.Buffer
	f := NewProcessFactory(ProcessConfig{RunnerPath: bin, Threads: 2, Output: &out})
	spec := enginepool.ModelSpec{Name: "tiny", Path: model, Engine: engine.Settings{ContextLength: 512, Parallel: 2}}
	began := time.Now()
	r := procStart(t, f, spec, 1<<30)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := r.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady: %v\nrunner output:\n%s", err, out.String())
	}
	t.Logf("real runner: listening after %v, ready after %v", r.StartupDuration(), time.Since(began))

	st, err := r.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "ready" || st.PID != r.PID() || st.SlotsTotal != 2 || st.FootprintBytes <= 0 {
		t.Errorf("Status = %+v: want ready, pid %d, 2 slots, a footprint", st, r.PID())
	}
	gauge, err := enginepool.NewGauge()
	if err != nil {
		t.Fatal(err)
	}
	fp, err := gauge.Process(r.PID())
	if err != nil || fp <= 0 {
		t.Errorf("measured footprint %d, %v", fp, err)
	}
	t.Logf("footprint: runner says %d bytes, the gauge measures %d", st.FootprintBytes, fp)
	if d := st.FootprintBytes - fp; d > 16<<20 || d < -16<<20 {
		t.Errorf("the runner's footprint %d and the gauge's %d differ by more than 16 MiB", st.FootprintBytes, fp)
	}

	body := procPost(t, r, `{"prompt":"Hello","max_tokens":8,"temperature":0}`)
	var cr struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &cr); err != nil {
		t.Fatalf("completion %s: %v", body, err)
	}
	if len(cr.Choices) != 1 || !slices.Contains([]string{"stop", "length"}, cr.Choices[0].FinishReason) ||
		cr.Usage.PromptTokens <= 0 || cr.Usage.CompletionTokens > 8 {
		t.Errorf("completion = %s", body)
	}
	events, err := procStream(ctx, r, 8)
	if err != nil || events[len(events)-1] != "[DONE]" {
		t.Errorf("stream: %v, events %q", err, events)
	}

	if err := r.SetLimits(ctx, enginepool.Limits{CeilingBytes: 1 << 30, HardLimitBytes: 8 << 30, HostUsedBytes: 1 << 30}); err != nil {
		t.Errorf("SetLimits: %v", err)
	}
	if _, err := r.ClearCache(ctx); err != nil {
		t.Errorf("ClearCache: %v", err)
	}
	if n, err := r.Abort(ctx); err != nil || n != 0 {
		t.Errorf("Abort = %d, %v", n, err)
	}

	began = time.Now()
	if err := r.Stop(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("real runner stopped by %s in %v", r.StoppedBy(), time.Since(began))
	procCheckGone(t, r)
	if r.StoppedBy() != StopShutdown || r.ExitErr() != nil {
		t.Errorf("StoppedBy %q, ExitErr %v: want a graceful stop", r.StoppedBy(), r.ExitErr())
	}

	// A file that is not a GGUF: the load fails with the runner's own message and
	// the process exits with the protocol's load-failure status.
	bad := filepath.Join(t.TempDir(), "bad.gguf")
	if err := os.WriteFile(bad, bytes.Repeat([]byte("not a model "), 100), 0o644); err != nil {
		t.Fatal(err)
	}
	r = procStart(t, f, enginepool.ModelSpec{Name: "bad", Path: bad}, 0)
	err = r.WaitReady(ctx)
	var re *RunnerError
	if !errors.As(err, &re) || re.Phase != PhaseLoad || re.Message == "" {
		t.Fatalf("WaitReady on a bad model = %v, want a load *RunnerError with the runner's message", err)
	}
	t.Logf("bad model: %v", err)
	procWaitClosed(t, r.Exited(), 30*time.Second, "the runner to exit after a failed load")
	if !errors.As(r.ExitErr(), &re) || re.ExitCode != RunnerExitLoadFailed {
		t.Errorf("ExitErr = %v, want exit status %d", r.ExitErr(), RunnerExitLoadFailed)
	}
}

const (
	procHelperRunnerEnv = "MACFLEET_TEST_HELPER_RUNNER"
	procHelperModelEnv  = "MACFLEET_TEST_HELPER_MODEL"
)

// TestProcessRunnerHelperAgent is not a test of its own: TestProcessRunner/DiesWithAgent
// runs the test binary with it as a stand-in agent that starts one runner, prints its
// pid and waits to be killed.
func TestProcessRunnerHelperAgent(t *testing.T) {
	bin := os.Getenv(procHelperRunnerEnv)
	if bin == "" {
		t.Skip("helper process of TestProcessRunner/DiesWithAgent")
	}
	r, err := NewProcessFactory(ProcessConfig{RunnerPath: bin}).Start(context.Background(),
		enginepool.ModelSpec{Name: "orphan", Path: os.Getenv(procHelperModelEnv)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("runner-pid %d %s\n", r.PID(), r.(*ProcessRunner).dir)
	time.Sleep(time.Minute) // until the parent test kills this process
}

func TestResolveRunnerPath(t *testing.T) {
	dir := t.TempDir()
	onPath := filepath.Join(dir, "macfleet-runner")
	if err := os.WriteFile(onPath, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)

	t.Setenv(RunnerEnv, "/opt/from-env")
	if got, err := ResolveRunnerPath("/opt/configured"); err != nil || got != "/opt/configured" {
		t.Errorf("configured path: %q, %v", got, err)
	}
	if got, err := ResolveRunnerPath(""); err != nil || got != "/opt/from-env" {
		t.Errorf("from %s: %q, %v", RunnerEnv, got, err)
	}
	if got, err := ResolveRunnerPath("macfleet-runner"); err != nil || got != onPath {
		t.Errorf("bare name: %q, %v; want %q", got, err, onPath)
	}
	t.Setenv(RunnerEnv, "")
	if got, err := ResolveRunnerPath(""); err != nil || got != onPath {
		t.Errorf("from PATH: %q, %v; want %q", got, err, onPath)
	}
	t.Setenv("PATH", t.TempDir())
	if _, err := ResolveRunnerPath(""); err == nil {
		t.Error("no runner anywhere: want an error")
	}
}

// procBuildFakeRunner builds metal/enginepool/runnerproc/internal/fakerunner into t.TempDir().
func procBuildFakeRunner(t *testing.T) string {
	t.Helper()
	return procBuildHelper(t, "fakerunner")
}

// procBuildHelper builds the program metal/enginepool/runnerproc/internal/NAME into t.TempDir(), without
// the race detector.
func procBuildHelper(t *testing.T, name string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build %s: %v", name, err)
	}
	out := filepath.Join(t.TempDir(), name)
	cmd := exec.Command(goBin, "build", "-o", out, "./internal/"+name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", name, err, b)
	}
	return out
}

// procStart starts a runner and stops it (at once) when the test ends.
func procStart(t *testing.T, f *ProcessFactory, spec enginepool.ModelSpec, ceiling int64) *ProcessRunner {
	t.Helper()
	r, err := f.Start(t.Context(), spec, ceiling)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	pr := r.(*ProcessRunner)
	t.Cleanup(func() {
		if err := pr.Stop(context.Background(), 0); err != nil {
			t.Errorf("cleanup Stop: %v", err)
		}
	})
	return pr
}

// procCheckGone checks that the runner was reaped: Exited is closed, its pid no longer
// exists (a zombie would still answer kill(pid, 0)), and its socket directory is gone.
func procCheckGone(t *testing.T, r *ProcessRunner) {
	t.Helper()
	select {
	case <-r.Exited():
	default:
		t.Fatal("Exited not closed")
	}
	if !procGone(r.PID()) {
		t.Errorf("pid %d still exists", r.PID())
	}
	if _, err := os.Stat(r.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket directory %s not removed: %v", r.dir, err)
	}
}

func procGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func procWaitClosed(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
	}
}

func procWaitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func procGetJSON(t *testing.T, r enginepool.Runner, path string, out any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, r.BaseURL()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := r.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

func procPost(t *testing.T, r enginepool.Runner, body string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, r.BaseURL()+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := r.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %d %s %v", resp.StatusCode, b, err)
	}
	return string(b)
}

// procStream runs a streamed completion and returns the data of its SSE events; err is
// set when the stream broke off instead of ending.
func procStream(ctx context.Context, r enginepool.Runner, maxTokens int) ([]string, error) {
	body, _ := json.Marshal(map[string]any{"prompt": "hi", "max_tokens": maxTokens, "stream": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.BaseURL()+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := r.Client().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, data)
		}
	}
	if err := sc.Err(); err != nil {
		return events, err
	}
	if len(events) == 0 || (events[len(events)-1] != "[DONE]" && !strings.Contains(events[len(events)-1], `"error"`)) {
		return events, io.ErrUnexpectedEOF
	}
	return events, nil
}
