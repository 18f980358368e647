package runnerproc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// ProcessRunner is one runner process. It implements Runner.
type ProcessRunner struct {
	model string
	// cmd is the process this agent started; handle watches one it adopted.
	cmd       *exec.Cmd
	handle    procHandle
	pid       int
	dir       string
	log       logr.Logger
	factory   *ProcessFactory
	killAfter time.Duration
	startedIn time.Duration

	baseURL     string
	dialNetwork string // "unix" or "tcp"
	dialAddress string
	transport   *http.Transport
	client      *http.Client

	stderr    *tailBuffer
	stderrEOF chan struct{}
	progress  atomic.Uint64 // math.Float64bits of the last /health progress

	// rec is the runner's record in the StateDir (detached runners only).
	rec *runnerRecord
	// worker: a split worker (WorkerRunner), which has no HTTP API: Stop starts at
	// SIGTERM, its graceful stop.
	worker bool

	stopOnce sync.Once
	exited   chan struct{} // closed by reap after cmd.Wait returned
	gone     chan struct{} // closed by reap once the process has exited: the log follower drains and ends
	detached chan struct{} // closed by Detach: the log follower ends

	mu            sync.Mutex
	reaped        bool // cmd.Wait has returned: the pid may be reused, never signal it
	stopRequested bool
	stoppedBy     StopStep
	exitErr       error
	state         *os.ProcessState
	// handedOff: Detach let go of the process; it is left running and never
	// signalled, and its record stays for the next agent.
	handedOff bool
	// cacheDir is the prompt cache directory the runner holds (see claimCacheDir);
	// released once it is reaped or detached.
	cacheDir string

	// spansDropped is the runner's last reported count of spans it dropped
	// (process_spans.go).
	spanMu       sync.Mutex
	spansDropped uint64
}

// setCacheDir hands the runner its claimed prompt cache directory. It reports false
// when the runner is already gone (the caller keeps the claim and releases it).
func (r *ProcessRunner) setCacheDir(dir string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reaped || r.handedOff {
		return false
	}
	r.cacheDir = dir
	return true
}

var _ enginepool.Runner = (*ProcessRunner)(nil)

type listenEvent struct {
	Event  string `json:"event"`
	Socket string `json:"socket"`
	Addr   string `json:"addr"`
}

// readStdout forwards the runner's stdout to the log and hands the first listening
// event to Start. It reads until EOF so the runner never blocks on a full pipe.
func (r *ProcessRunner) readStdout(rd io.ReadCloser, listening chan<- listenEvent) {
	defer rd.Close()
	found := false
	readLines(rd, func(line string) {
		r.emit("stdout", line)
		if found || !strings.HasPrefix(strings.TrimSpace(line), "{") {
			return
		}
		var ev listenEvent
		if json.Unmarshal([]byte(line), &ev) == nil && ev.Event == "listening" {
			found = true
			listening <- ev
		}
	})
}

// readStderr forwards the runner's stderr to the log and keeps its tail for errors.
func (r *ProcessRunner) readStderr(rd io.ReadCloser) {
	defer close(r.stderrEOF)
	defer rd.Close()
	readLines(rd, func(line string) {
		r.stderr.add(line)
		r.emit("stderr", line)
	})
}

func (r *ProcessRunner) emit(stream, line string) {
	r.log.V(1).Info("Runner output", "stream", stream, "line", line)
	if w := r.factory.cfg.Output; w != nil {
		r.factory.outMu.Lock()
		fmt.Fprintf(w, "[%s] %s\n", r.model, line)
		r.factory.outMu.Unlock()
	}
}

// readLines calls fn for every line of rd, cutting lines longer than 64 KiB.
func readLines(rd io.Reader, fn func(string)) {
	const maxLine = 64 << 10
	br := bufio.NewReaderSize(rd, maxLine)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			fn(string(line) + "…")
			// Discard the rest of the over-long line.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			if err != nil {
				return
			}
			continue
		}
		if len(line) > 0 {
			fn(strings.TrimRight(string(line), "\r\n"))
		}
		if err != nil {
			return
		}
	}
}

// reap is the only caller of cmd.Wait (or, for an adopted runner, of the handle's
// wait). It records why the process exited, cleans up after it and closes Exited.
func (r *ProcessRunner) reap() {
	if r.cmd != nil {
		_ = r.cmd.Wait() // the ProcessState says everything the error would
	} else if !r.handle.wait() {
		return // Detach closed the handle: the process runs on, someone else's now
	}
	r.mu.Lock()
	r.reaped = true
	if r.cmd != nil {
		r.state = r.cmd.ProcessState
	}
	handedOff := r.handedOff
	cacheDir := r.cacheDir
	r.cacheDir = ""
	r.mu.Unlock()
	r.factory.releaseCacheDir(cacheDir)
	close(r.gone)
	// Let the output reader catch what the runner wrote just before dying, without
	// waiting on a grandchild that may still hold the pipe.
	select {
	case <-r.stderrEOF:
	case <-time.After(time.Second):
	}
	r.mu.Lock()
	if !r.stopRequested && !handedOff {
		r.exitErr = r.describe(PhaseExit)
	}
	r.mu.Unlock()
	if !handedOff {
		os.RemoveAll(r.dir)
		if r.rec != nil {
			r.factory.dropRecord(r.rec)
		}
	}
	r.transport.CloseIdleConnections()
	close(r.exited)
	state := "unknown (adopted)"
	if r.state != nil {
		state = r.state.String()
	}
	r.log.V(1).Info("Runner exited", "state", state)
}

// describe describes the runner as a *RunnerError: its exit status once reaped,
// and its stderr. r.mu must be held.
func (r *ProcessRunner) describe(phase RunnerPhase) *RunnerError {
	e := &RunnerError{Model: r.model, PID: r.pid, Phase: phase, ExitCode: -1, Stderr: r.stderr.String()}
	if st := r.state; st != nil {
		e.ExitCode = st.ExitCode()
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			e.Signal = ws.Signal().String()
		}
	}
	if r.cmd == nil && r.reaped {
		e.Err = errors.New("exit status unknown: the runner was adopted, not started, by this agent")
	}
	// Bad flags are explained first, before the usage text.
	e.Message = r.stderr.message(e.ExitCode == RunnerExitBadFlags)
	return e
}

// exitError is describe for callers that do not hold r.mu.
func (r *ProcessRunner) exitError(phase RunnerPhase) *RunnerError {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.describe(phase)
}

// startFailure kills and reaps a runner that failed to come up, and describes it.
func (r *ProcessRunner) startFailure(cause error) error {
	r.mu.Lock()
	r.stopRequested = true // do not report our own kill as a crash
	r.mu.Unlock()
	r.signal(syscall.SIGKILL)
	select {
	case <-r.exited:
	case <-time.After(reapWait):
		r.log.Info("Runner not reaped after SIGKILL", "wait", reapWait)
	}
	e := r.exitError(PhaseStart)
	e.Err = cause
	return e
}

// signal sends sig to the runner's process group, unless the runner was already
// reaped (its pid may then belong to another process).
func (r *ProcessRunner) signal(sig syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reaped || r.handedOff {
		return
	}
	if r.handle != nil {
		// Adopted: only the process the handle names (it spawns no children).
		_ = r.handle.signal(sig)
		return
	}
	// The runner leads its own group (Setpgid or Setsid), so -pid is the group.
	if err := syscall.Kill(-r.pid, sig); err != nil {
		// The group can be gone while the leader is a zombie: signal the leader alone.
		_ = r.cmd.Process.Signal(sig)
	}
}

// PID is the runner's process id.
func (r *ProcessRunner) PID() int { return r.pid }

// BaseURL is the root the Client's requests go to.
func (r *ProcessRunner) BaseURL() string { return r.baseURL }

// Client reaches the runner over its socket. It has no overall timeout (streams last
// as long as generation does): bound requests with their contexts.
func (r *ProcessRunner) Client() *http.Client { return r.client }

// Exited is closed once the process has exited and been reaped.
func (r *ProcessRunner) Exited() <-chan struct{} { return r.exited }

// ExitErr says why the process exited: nil while it runs and after a requested stop,
// a *RunnerError otherwise.
func (r *ProcessRunner) ExitErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exitErr
}

// StartupDuration is how long the process took from exec to its listening line.
func (r *ProcessRunner) StartupDuration() time.Duration { return r.startedIn }

// Progress is the load progress (0..1) last reported on /health.
func (r *ProcessRunner) Progress() float64 {
	return math.Float64frombits(r.progress.Load())
}

// StoppedBy says how far Stop escalated; empty before a requested stop completed or
// when the runner exited on its own.
func (r *ProcessRunner) StoppedBy() StopStep {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stoppedBy
}

// Stderr is the tail of what the runner wrote to stderr.
func (r *ProcessRunner) Stderr() string { return r.stderr.String() }

type health struct {
	Status   string  `json:"status"`
	Progress float64 `json:"progress"`
	Error    string  `json:"error"`
	Nonce    string  `json:"nonce"`
}

// WaitReady polls /health until the model is loaded (nil), the load failed or the
// process exited (a *RunnerError), or ctx ends.
func (r *ProcessRunner) WaitReady(ctx context.Context) error {
	delay := 10 * time.Millisecond
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-r.exited:
			return r.loadExitError()
		case <-ctx.Done():
			return fmt.Errorf("waiting for runner of %q to load: %w", r.model, ctx.Err())
		case <-timer.C:
		}
		var h health
		// /health answers 503 while loading or failed, with the same body.
		err := r.call(ctx, http.MethodGet, "/health", nil, &h, http.StatusServiceUnavailable)
		if err == nil {
			r.progress.Store(math.Float64bits(h.Progress))
			switch h.Status {
			case "ready":
				r.progress.Store(math.Float64bits(1))
				return nil
			case "failed":
				e := r.exitError(PhaseLoad)
				if h.Error != "" {
					e.Message = h.Error
				}
				return e
			case "stopping":
				e := r.exitError(PhaseLoad)
				e.Err = errors.New("runner is stopping")
				return e
			}
		}
		timer.Reset(delay)
		delay = min(delay*2, 100*time.Millisecond)
	}
}

// loadExitError describes a runner that exited before it was ready.
func (r *ProcessRunner) loadExitError() error {
	var e *RunnerError
	if errors.As(r.ExitErr(), &e) {
		load := *e
		load.Phase = PhaseLoad
		return &load
	}
	e = r.exitError(PhaseLoad)
	e.Err = errors.New("stopped before the model was loaded")
	return e
}

// Status is GET /status.
func (r *ProcessRunner) Status(ctx context.Context) (enginepool.RunnerStatus, error) {
	var st enginepool.RunnerStatus
	err := r.call(ctx, http.MethodGet, "/status", nil, &st)
	return st, err
}

// SetLimits is POST /limits.
func (r *ProcessRunner) SetLimits(ctx context.Context, l enginepool.Limits) error {
	return r.call(ctx, http.MethodPost, "/limits", l, nil)
}

// Abort is POST /abort: every in-flight generation ends now.
func (r *ProcessRunner) Abort(ctx context.Context) (int, error) {
	var out struct {
		Aborted int `json:"aborted"`
	}
	err := r.call(ctx, http.MethodPost, "/abort", struct{}{}, &out)
	return out.Aborted, err
}

// ClearCache is POST /cache/clear.
func (r *ProcessRunner) ClearCache(ctx context.Context) (enginepool.CacheClearResult, error) {
	var out enginepool.CacheClearResult
	err := r.call(ctx, http.MethodPost, "/cache/clear", struct{}{}, &out)
	return out, err
}

// SetCacheBudget is POST /cache/budget.
func (r *ProcessRunner) SetCacheBudget(ctx context.Context, b runnerapi.CacheBudget) (runnerapi.CacheBudgetResult, error) {
	var out runnerapi.CacheBudgetResult
	err := r.call(ctx, http.MethodPost, "/cache/budget", b, &out)
	return out, err
}

// call does one control request: in (if not nil) as the JSON body, the JSON answer
// into out (if not nil). A 2xx or one of okAlso is success; any other status is a
// *RunnerHTTPError. A context without a deadline gets controlTimeout.
func (r *ProcessRunner) call(ctx context.Context, method, path string, in, out any, okAlso ...int) error {
	select {
	case <-r.exited:
		return fmt.Errorf("%s %s: %w", method, path, ErrRunnerExited)
	default:
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, controlTimeout)
		defer cancel()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.baseURL+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := r.client.Do(req)
	if err != nil {
		select {
		case <-r.exited:
			return fmt.Errorf("%s %s: %w", method, path, ErrRunnerExited)
		default:
		}
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	ok := resp.StatusCode/100 == 2
	for _, c := range okAlso {
		ok = ok || resp.StatusCode == c
	}
	if !ok {
		he := &RunnerHTTPError{StatusCode: resp.StatusCode}
		var eb struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Code    string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &eb) == nil {
			he.Message, he.Type, he.Code = eb.Error.Message, eb.Error.Type, eb.Error.Code
		} else {
			he.Message = strings.TrimSpace(string(b))
		}
		return fmt.Errorf("%s %s: %w", method, path, he)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: decoding the answer: %w", method, path, err)
		}
	}
	return nil
}
