package metal

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/runner/api"
)

// ProcessConfig configures the runner processes a ProcessFactory starts.
type ProcessConfig struct {
	// RunnerPath is the macfleet-runner binary. Empty means $MACFLEET_RUNNER, else
	// macfleet-runner next to the running executable, else macfleet-runner on $PATH.
	RunnerPath string
	// SocketDir is where each runner gets a private (0700) directory for its unix
	// socket. Empty means os.TempDir(), or /tmp when that would make the socket path
	// longer than a unix socket address can hold (104 bytes on darwin).
	SocketDir string
	// Args are appended to the protocol flags of every runner.
	Args []string
	// Env is added to the agent's own environment (KEY=VALUE).
	Env []string
	// Threads is passed as --threads; zero lets the runner choose.
	Threads int
	// Batch is passed as --batch; zero lets the runner choose.
	Batch int
	// Loopback makes runners listen on 127.0.0.1 (--addr 127.0.0.1:0) instead of a
	// unix socket, for benchmarks that compare the two.
	Loopback bool
	// Log receives every line the runner writes to stdout or stderr, at V(1), with the
	// model name and the pid. When unset, the logger of Start's context is used.
	Log logr.Logger
	// Output, when set, also receives every runner output line prefixed with
	// "[model] ", for a terminal or a log file.
	Output io.Writer
	// ListenTimeout bounds how long Start waits for the runner's listening line.
	// Default 30s.
	ListenTimeout time.Duration
	// KillAfter is how long Stop waits after SIGTERM before SIGKILL. Default 2s.
	KillAfter time.Duration

	// StateDir, when set, makes runners outlive the agent so that the next agent can
	// adopt them instead of reloading every model. Runners are started detached (their
	// own session, no parent-death signal, --exit-with-parent=false, --orphan-timeout)
	// with their output in a log file, and each one is recorded in StateDir: pid,
	// process start time, address, a fingerprint of everything the engine depends on,
	// its ceiling and a random nonce it echoes on /health. Start adopts a recorded
	// runner whose fingerprint matches and which proves to be the recorded process;
	// StopUnclaimed stops the recorded runners nobody adopted.
	StateDir string
	// PromptCacheDir is the root of the prompt cache's SSD tier: each runner with
	// the SSD tier keeps its states in a directory of its own below it, named by the
	// model file (see PromptCacheModelID). Empty: no SSD tier.
	PromptCacheDir string
	// PromptCacheSSDBytes is each runner's SSD quota, and the most a model's own
	// (ModelSpec.PromptCache.SSDBytes) may ask for; 0 means no SSD tier.
	PromptCacheSSDBytes int64

	// OrphanTimeout is passed as --orphan-timeout to detached runners: one that
	// receives no request at all for this long (the pool contacts every runner at
	// least every PollIdle, 10s) exits by itself. Default 5m; negative disables it.
	OrphanTimeout time.Duration
}

// Defaults of ProcessConfig.
const (
	DefaultListenTimeout = 30 * time.Second
	DefaultKillAfter     = 2 * time.Second
	DefaultOrphanTimeout = 5 * time.Minute
)

// RunnerEnv names the environment variable that points at the runner binary.
const RunnerEnv = "MACFLEET_RUNNER"

// Runner exit codes of docs/runner-protocol.md.
const (
	RunnerExitBadFlags   = 2
	RunnerExitLoadFailed = 3
)

// maxSocketPath is the longest unix socket path every platform accepts: sun_path is
// 104 bytes on darwin (108 on Linux), including the terminating NUL.
const maxSocketPath = 103

// controlTimeout bounds a control call (status, limits, abort, cache clear, health,
// shutdown) whose context has no deadline of its own.
const controlTimeout = 10 * time.Second

// reapWait bounds how long a killed runner may take to be reaped before Stop or Start
// give up waiting and report it.
const reapWait = 10 * time.Second

// ErrRunnerExited is returned (wrapped) by control calls to a runner whose process has
// exited.
var ErrRunnerExited = errors.New("runner process has exited")

// RunnerPhase says when a runner failed.
type RunnerPhase string

const (
	// PhaseStart: the process could not be started or never announced its socket.
	PhaseStart RunnerPhase = "start"
	// PhaseLoad: the runner failed to load its model, or exited while loading.
	PhaseLoad RunnerPhase = "load"
	// PhaseExit: the runner exited without being asked to.
	PhaseExit RunnerPhase = "exit"
)

// RunnerError reports a runner that could not start, failed to load its model or
// exited unexpectedly, with what the runner itself said about it.
type RunnerError struct {
	Model string
	// PID is the runner's process id, 0 when it never started.
	PID   int
	Phase RunnerPhase
	// ExitCode is the exit status; -1 when the process was killed by a signal or had
	// not exited when the error was made.
	ExitCode int
	// Signal names the signal that killed the process, e.g. "killed".
	Signal string
	// Message is the runner's own explanation: the /health error of a failed load, or
	// the last line it wrote to stderr.
	Message string
	// Stderr is the tail of the runner's stderr.
	Stderr string
	Err    error
}

func (e *RunnerError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "runner for model %q", e.Model)
	if e.PID > 0 {
		fmt.Fprintf(&b, " (pid %d)", e.PID)
	}
	switch e.Phase {
	case PhaseStart:
		b.WriteString(" failed to start")
	case PhaseLoad:
		b.WriteString(" failed to load the model")
	default:
		b.WriteString(" exited")
	}
	switch {
	case e.Signal != "":
		fmt.Fprintf(&b, ": signal %s", e.Signal)
	case e.ExitCode >= 0:
		fmt.Fprintf(&b, ": exit status %d", e.ExitCode)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	return b.String()
}

func (e *RunnerError) Unwrap() error { return e.Err }

// RunnerHTTPError is a non-2xx answer of a runner to a control call, with the fields of
// its OpenAI-shaped error body.
type RunnerHTTPError struct {
	StatusCode int
	Type       string
	Code       string
	Message    string
}

func (e *RunnerHTTPError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.StatusCode)
	}
	if e.Code != "" {
		return fmt.Sprintf("runner answered %d (%s): %s", e.StatusCode, e.Code, msg)
	}
	return fmt.Sprintf("runner answered %d: %s", e.StatusCode, msg)
}

// ResolveRunnerPath finds the runner binary: configured if set (looked up on $PATH when
// it is a bare name), else $MACFLEET_RUNNER, else macfleet-runner next to the running
// executable, else macfleet-runner on $PATH.
func ResolveRunnerPath(configured string) (string, error) {
	if configured == "" {
		configured = os.Getenv(RunnerEnv)
	}
	if configured != "" {
		if !strings.ContainsRune(configured, os.PathSeparator) {
			return exec.LookPath(configured)
		}
		return configured, nil
	}
	if exe, err := os.Executable(); err == nil {
		cand := filepath.Join(filepath.Dir(exe), "macfleet-runner")
		if fi, err := os.Stat(cand); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return cand, nil
		}
	}
	p, err := exec.LookPath("macfleet-runner")
	if err != nil {
		return "", fmt.Errorf("finding the runner (set %s or put macfleet-runner next to the agent): %w", RunnerEnv, err)
	}
	return p, nil
}

// RunnerExecutable is ResolveRunnerPath, checked: the path must be an executable
// regular file, so that an agent refuses to start without a runner instead of failing
// every load.
func RunnerExecutable(configured string) (string, error) {
	path, err := ResolveRunnerPath(configured)
	if err != nil {
		return "", err
	}
	if st, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("the runner binary: %w", err)
	} else if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("the runner binary %s is not an executable file", path)
	}
	return path, nil
}

// ProcessFactory starts each model in its own runner process (docs/runner-protocol.md)
// and talks to it over a unix socket.
type ProcessFactory struct {
	cfg   ProcessConfig
	outMu sync.Mutex // serialises lines of all runners on cfg.Output

	// claimMu guards claimed: the ids of runner records this factory started, adopted
	// or is stopping, so no record is ever taken twice.
	claimMu sync.Mutex
	claimed map[string]bool
	// cacheDirs are the prompt cache directories of the runners of this factory
	// (guarded by claimMu).
	cacheDirs map[string]bool
}

var _ RunnerFactory = (*ProcessFactory)(nil)

// NewProcessFactory returns a RunnerFactory of runner processes.
func NewProcessFactory(cfg ProcessConfig) *ProcessFactory {
	if cfg.ListenTimeout <= 0 {
		cfg.ListenTimeout = DefaultListenTimeout
	}
	if cfg.KillAfter <= 0 {
		cfg.KillAfter = DefaultKillAfter
	}
	if cfg.OrphanTimeout == 0 {
		cfg.OrphanTimeout = DefaultOrphanTimeout
	}
	return &ProcessFactory{cfg: cfg, claimed: map[string]bool{}, cacheDirs: map[string]bool{}}
}

// Start execs a runner for spec in a new process group and returns once it listens
// (before the model is loaded: follow the load with WaitReady). ctx bounds the start
// only, not the runner's life. If anything fails after the exec, the process is
// killed and reaped before Start returns. With a StateDir, a recorded runner with the
// same fingerprint that is alive and proves its identity is adopted instead (see
// ProcessConfig.StateDir); Adopted reports it.
func (f *ProcessFactory) Start(ctx context.Context, spec ModelSpec, ceilingBytes int64) (Runner, error) {
	startErr := func(err error) error {
		return &RunnerError{Model: spec.Name, Phase: PhaseStart, ExitCode: -1, Err: err}
	}
	path, err := ResolveRunnerPath(f.cfg.RunnerPath)
	if err != nil {
		return nil, startErr(err)
	}
	log := f.cfg.Log
	if log.GetSink() == nil {
		log = logr.FromContextOrDiscard(ctx)
	}
	var cacheDir string
	handedDir := false
	defer func() {
		if !handedDir {
			f.releaseCacheDir(cacheDir)
		}
	}()
	var rec *runnerRecord
	if f.cfg.StateDir != "" {
		// The fingerprint names the file's cache directory without the index a second
		// runner of the same file gets (claimCacheDir): that depends on start order.
		fpArgs := append(f.engineArgs(spec, ceilingBytes), f.promptCacheArgs(spec, f.cacheDirBase(spec))...)
		fp, err := f.fingerprint(path, spec, fpArgs)
		if err != nil {
			return nil, startErr(err)
		}
		if r := f.adopt(ctx, spec, fp, log); r != nil {
			if r.rec != nil && r.rec.CacheDir != "" {
				cacheDir = r.rec.CacheDir
				f.claimCacheDirExact(cacheDir)
				handedDir = r.setCacheDir(cacheDir)
			}
			return r, nil
		}
		if rec, err = f.newRecord(spec.Name, fp, ceilingBytes); err != nil {
			return nil, startErr(err)
		}
	}
	cacheDir = f.claimCacheDir(spec)
	if rec != nil {
		rec.CacheDir = cacheDir
	}
	engineArgs := append(f.engineArgs(spec, ceilingBytes), f.promptCacheArgs(spec, cacheDir)...)

	// The socket directory is made even for loopback runners: it is the runner's
	// private scratch directory, removed when the process is reaped.
	dir, sock, err := makeSocketDir(f.cfg.SocketDir)
	if err != nil {
		return nil, startErr(err)
	}
	args := []string{"--model", spec.Path, "--socket", sock}
	if f.cfg.Loopback {
		args = []string{"--model", spec.Path, "--addr", "127.0.0.1:0"}
	}
	args = append(args, engineArgs...)
	if rec != nil {
		args = append(args, "--exit-with-parent=false", "--nonce", rec.Nonce)
		if f.cfg.OrphanTimeout > 0 {
			args = append(args, "--orphan-timeout", f.cfg.OrphanTimeout.String())
		}
	}

	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), f.cfg.Env...)
	// The runner writes straight into pipes (or, detached, a log file) we own, so
	// cmd.Wait never waits on a copy goroutine (a grandchild holding a pipe open
	// cannot stall the reaper).
	var outR, errR, logFile *os.File
	closeAll := func() {
		for _, file := range []*os.File{outR, errR, logFile} {
			if file != nil {
				file.Close()
			}
		}
		os.RemoveAll(dir)
		if rec != nil {
			os.Remove(f.logPath(rec.ID))
		}
	}
	if rec != nil {
		// A detached runner must not write into pipes: once the agent is gone a write
		// would kill it with SIGPIPE. Its output goes to a log file that every agent
		// owning it follows.
		logFile, err = os.OpenFile(f.logPath(rec.ID), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
		if err != nil {
			closeAll()
			return nil, startErr(fmt.Errorf("creating the runner's log: %w", err))
		}
		cmd.Stdout, cmd.Stderr = logFile, logFile
		// A session of its own: no terminal's hangup or ^C, no process group of the
		// agent's service manager reaches it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		var outW, errW *os.File
		if outR, outW, err = os.Pipe(); err != nil {
			closeAll()
			return nil, startErr(err)
		}
		if errR, errW, err = os.Pipe(); err != nil {
			outW.Close()
			closeAll()
			return nil, startErr(err)
		}
		cmd.Stdout, cmd.Stderr = outW, errW
		// A new process group: signals to the agent's group (a terminal's ^C) do not
		// reach the runner, and Stop can signal the runner together with anything it
		// spawned.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		dieWithParent(cmd.SysProcAttr)
	}
	began := time.Now()
	err = cmd.Start()
	if cmd.Stdout != nil && outR != nil {
		// Our copies of the write ends: the runner holds its own.
		cmd.Stdout.(*os.File).Close()
		cmd.Stderr.(*os.File).Close()
	}
	if err != nil {
		closeAll()
		return nil, startErr(err)
	}

	r := f.newRunner(spec.Name, cmd.Process.Pid, dir, log)
	r.cmd = cmd
	handedDir = r.setCacheDir(cacheDir)
	listening := make(chan listenEvent, 1)
	stdoutEOF := make(chan struct{})
	if rec != nil {
		logFile.Close()
		rec.PID, rec.Dir = r.pid, dir
		// A failure here only weakens a later adoption (the nonce still proves it).
		rec.StartTime, _ = procStartTime(r.pid)
		r.rec = rec
		f.claim(rec.ID)
		go r.followLog(f.logPath(rec.ID), false, listening)
		stdoutEOF = r.stderrEOF
	} else {
		go func() {
			defer close(stdoutEOF)
			r.readStdout(outR, listening)
		}()
		go r.readStderr(errR)
	}
	go r.reap()

	timer := time.NewTimer(f.cfg.ListenTimeout)
	defer timer.Stop()
	var ev listenEvent
	select {
	case ev = <-listening:
	case <-r.exited:
		// It may have announced itself and then failed fast (a load error): read what
		// it wrote before deciding, so that the failure is reported as a load failure.
		select {
		case <-stdoutEOF:
		case <-time.After(time.Second):
		}
		select {
		case ev = <-listening:
		default:
			return nil, r.startFailure(errors.New("exited before listening"))
		}
	case <-timer.C:
		return nil, r.startFailure(fmt.Errorf("no listening line within %s", f.cfg.ListenTimeout))
	case <-ctx.Done():
		return nil, r.startFailure(ctx.Err())
	}

	if err := r.setAddress(ev.Socket, ev.Addr); err != nil {
		return nil, r.startFailure(err)
	}
	if rec != nil {
		rec.Network, rec.Address = r.dialNetwork, r.dialAddress
		if err := writeRecord(f.cfg.StateDir, rec); err != nil {
			return nil, r.startFailure(err)
		}
	}
	r.startedIn = time.Since(began)
	r.log.V(1).Info("Runner listening", "runner", path, "address", r.dialAddress, "startup", r.startedIn,
		"detached", rec != nil)
	return r, nil
}

// engineArgs are the runner flags that shape the engine (everything but where it
// listens and how it relates to the agent).
func (f *ProcessFactory) engineArgs(spec ModelSpec, ceilingBytes int64) []string {
	var args []string
	addInt := func(flag string, v int64) {
		if v > 0 {
			args = append(args, flag, strconv.FormatInt(v, 10))
		}
	}
	addInt("--ctx", int64(spec.ContextLength))
	addInt("--parallel", int64(spec.Parallel))
	addInt("--ceiling-bytes", ceilingBytes)
	addInt("--threads", int64(f.cfg.Threads))
	addInt("--batch", int64(f.cfg.Batch))
	if spec.KVCacheType != "" {
		args = append(args, "--kv-type", spec.KVCacheType)
	}
	if spec.Name != "" {
		args = append(args, "--alias", spec.Name)
	}
	return append(args, f.cfg.Args...)
}

// newRunner makes the ProcessRunner of a started or adopted process; the caller sets
// cmd or handle and the address.
func (f *ProcessFactory) newRunner(model string, pid int, dir string, log logr.Logger) *ProcessRunner {
	r := &ProcessRunner{
		model:     model,
		pid:       pid,
		dir:       dir,
		log:       log.WithValues("model", model, "pid", pid),
		factory:   f,
		killAfter: f.cfg.KillAfter,
		stderr:    newTailBuffer(8, 32, 1024),
		exited:    make(chan struct{}),
		stderrEOF: make(chan struct{}),
		gone:      make(chan struct{}),
		detached:  make(chan struct{}),
	}
	r.transport = &http.Transport{
		// Never a proxy from the environment: the runner is local.
		Proxy: nil,
		// dialNetwork and dialAddress are set before Start returns the runner and
		// anything can make a request.
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, r.dialNetwork, r.dialAddress)
		},
		ForceAttemptHTTP2:   false,
		DisableCompression:  true,
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		// No response-header timeout: a non-streamed completion sends its headers only
		// when generation has finished. Callers bound requests with their contexts.
	}
	// No Timeout on the client either: streams last as long as generation does.
	r.client = &http.Client{Transport: r.transport}
	return r
}

// setAddress points the client at where the runner says it listens.
func (r *ProcessRunner) setAddress(socket, addr string) error {
	switch {
	case socket != "":
		// Normally the path we gave; a runner may report it resolved (on macOS /tmp
		// is a symlink to /private/tmp), and it listens where it says.
		r.dialNetwork, r.dialAddress = "unix", socket
		r.baseURL = "http://runner"
	case addr != "":
		r.dialNetwork, r.dialAddress = "tcp", addr
		r.baseURL = "http://" + addr
	default:
		return errors.New("listening line names neither a socket nor an address")
	}
	return nil
}

// makeSocketDir creates a private directory for one runner's socket and returns it
// with the socket path, keeping the path short enough for a unix socket address.
func makeSocketDir(base string) (dir, sock string, err error) {
	const suffix = "/mf0123456789/r.sock" // the longest name MkdirTemp and we add
	if base == "" {
		base = os.TempDir()
		if len(base)+len(suffix) > maxSocketPath {
			base = "/tmp"
		}
	}
	if len(base)+len(suffix) > maxSocketPath {
		return "", "", fmt.Errorf("socket directory %s is too long for a unix socket path (%d bytes at most)", base, maxSocketPath)
	}
	dir, err = os.MkdirTemp(base, "mf")
	if err != nil {
		return "", "", fmt.Errorf("creating the runner's socket directory: %w", err)
	}
	return dir, filepath.Join(dir, "r.sock"), nil
}

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

var _ Runner = (*ProcessRunner)(nil)

// StopStep is how far Stop had to escalate before the runner exited.
type StopStep string

const (
	// StopShutdown: the runner exited after POST /shutdown.
	StopShutdown StopStep = "shutdown"
	// StopTerm: it needed SIGTERM.
	StopTerm StopStep = "sigterm"
	// StopKill: it needed SIGKILL.
	StopKill StopStep = "sigkill"
)

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
func (r *ProcessRunner) Status(ctx context.Context) (RunnerStatus, error) {
	var st RunnerStatus
	err := r.call(ctx, http.MethodGet, "/status", nil, &st)
	return st, err
}

// SetLimits is POST /limits.
func (r *ProcessRunner) SetLimits(ctx context.Context, l Limits) error {
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
func (r *ProcessRunner) ClearCache(ctx context.Context) (CacheClearResult, error) {
	var out CacheClearResult
	err := r.call(ctx, http.MethodPost, "/cache/clear", struct{}{}, &out)
	return out, err
}

// SetCacheBudget is POST /cache/budget.
func (r *ProcessRunner) SetCacheBudget(ctx context.Context, b api.CacheBudget) (api.CacheBudgetResult, error) {
	var out api.CacheBudgetResult
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

// Stop stops the runner and returns once it has been reaped: POST /shutdown and wait
// up to grace; SIGTERM the process group and wait KillAfter; SIGKILL the group. A
// grace of zero or less kills at once. Stop is idempotent and safe to call
// concurrently: the first call's grace drives the escalation, every call returns when
// the process is gone, and a call whose ctx ends kills the runner at once. It returns
// an error only if the process could not be reaped after SIGKILL.
func (r *ProcessRunner) Stop(ctx context.Context, grace time.Duration) error {
	r.mu.Lock()
	if r.handedOff {
		r.mu.Unlock()
		return fmt.Errorf("runner of %q (pid %d) was detached: it is not this agent's to stop", r.model, r.pid)
	}
	r.stopRequested = true
	r.mu.Unlock()
	r.stopOnce.Do(func() { go r.stopSequence(grace) })
	select {
	case <-r.exited:
		return nil
	case <-ctx.Done():
	}
	r.log.Info("Stop interrupted: killing the runner", "reason", context.Cause(ctx))
	r.noteStep(StopKill)
	r.signal(syscall.SIGKILL)
	select {
	case <-r.exited:
		return nil
	case <-time.After(reapWait):
		return fmt.Errorf("runner of %q (pid %d) not reaped %s after SIGKILL", r.model, r.pid, reapWait)
	}
}

// stopSequence escalates from a graceful shutdown to SIGKILL. It runs once.
func (r *ProcessRunner) stopSequence(grace time.Duration) {
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-r.exited:
			return true
		case <-t.C:
			return false
		}
	}
	if grace > 0 {
		r.noteStep(StopShutdown)
		deadline := time.Now().Add(grace)
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := r.call(ctx, http.MethodPost, "/shutdown", struct{}{}, nil)
		cancel()
		if err != nil && !errors.Is(err, ErrRunnerExited) {
			// A runner already stopping may drop the answer; one that is wedged
			// gets SIGTERM once the grace is over either way.
			r.log.V(1).Info("Shutdown request failed", "err", err.Error())
		}
		if wait(time.Until(deadline)) {
			return
		}
		r.noteStep(StopTerm)
		r.signal(syscall.SIGTERM)
		if wait(r.killAfter) {
			return
		}
	}
	r.noteStep(StopKill)
	r.signal(syscall.SIGKILL)
	if !wait(reapWait) {
		r.log.Info("Runner not reaped after SIGKILL", "wait", reapWait)
	}
}

// noteStep records the furthest escalation reached, unless the process is already gone.
func (r *ProcessRunner) noteStep(s StopStep) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reaped {
		return
	}
	if stepRank(s) > stepRank(r.stoppedBy) {
		r.stoppedBy = s
	}
}

func stepRank(s StopStep) int {
	switch s {
	case StopShutdown:
		return 1
	case StopTerm:
		return 2
	case StopKill:
		return 3
	}
	return 0
}

// tailBuffer keeps the first and the last lines written to it (a runner's first
// error is often followed by a long trace or usage text), each cut to a maximum length.
type tailBuffer struct {
	mu      sync.Mutex
	head    []string
	tail    []string
	dropped int
	maxHead int
	maxTail int
	maxLine int
}

func newTailBuffer(maxHead, maxTail, maxLine int) *tailBuffer {
	return &tailBuffer{maxHead: maxHead, maxTail: maxTail, maxLine: maxLine}
}

func (t *tailBuffer) add(line string) {
	if len(line) > t.maxLine {
		line = line[:t.maxLine] + "…"
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.head) < t.maxHead {
		t.head = append(t.head, line)
		return
	}
	if len(t.tail) == t.maxTail {
		t.tail = append(t.tail[:0], t.tail[1:]...)
		t.dropped++
	}
	t.tail = append(t.tail, line)
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := slices.Clone(t.head)
	if t.dropped > 0 {
		lines = append(lines, fmt.Sprintf("… (%d lines)", t.dropped))
	}
	return strings.Join(append(lines, t.tail...), "\n")
}

// errorWords mark the stderr line most likely to say why a runner failed.
var errorWords = []string{"error", "fail", "fatal", "panic", "invalid", "flag provided", "cannot", "unable"}

// message is the last line that reads like an error, else the last non-blank line;
// with first, the first non-blank line.
func (t *tailBuffer) message(first bool) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := append(slices.Clone(t.head), t.tail...)
	if first {
		for _, l := range lines {
			if s := strings.TrimSpace(l); s != "" {
				return s
			}
		}
	}
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.ToLower(lines[i])
		for _, w := range errorWords {
			if strings.Contains(l, w) {
				return strings.TrimSpace(lines[i])
			}
		}
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if s := strings.TrimSpace(lines[i]); s != "" {
			return s
		}
	}
	return ""
}
