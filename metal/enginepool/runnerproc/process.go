package runnerproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/internal/tracing/spanrelay"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
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
	// Env is the runner's environment beyond what the sandbox keeps of the agent's
	// (KEY=VALUE); with the sandbox off it is added to the agent's whole environment.
	Env []string
	// Sandbox confines every runner to its model, cache and socket directories, with
	// no network and a scrubbed environment (metal/runner/sandbox). Empty means
	// sandbox.On; sandbox.Off starts runners unconfined with the agent's environment.
	Sandbox sandbox.Mode
	// AllowUnconfined (--allow-unconfined-runners) lets runners start, unconfined but
	// with a scrubbed environment, where the sandbox is on and this machine cannot
	// confine them; without it they are refused with a *sandbox.UnconfinedError.
	AllowUnconfined bool
	// Threads is the agent's --threads for models that set none (ModelSpec.Engine.Threads);
	// zero leaves them to the thread policy.
	Threads int
	// PerformanceCores are the Mac's performance cores, for the thread policy
	// (engine.PolicyThreads); zero (no policy) lets the runner choose when neither the
	// model nor Threads does.
	PerformanceCores int
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

	// SpanRelay, when set (the agent traces), starts every runner with --trace-relay
	// and exports the spans drained from it (process_spans.go): a runner never
	// connects to the collector itself. Nil: runners make no spans.
	SpanRelay *spanrelay.Forwarder

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

// ProcessFactory starts each model in its own runner process (docs/runner-protocol.md)
// and talks to it over a unix socket.
type ProcessFactory struct {
	cfg   ProcessConfig
	outMu sync.Mutex // serialises lines of all runners on cfg.Output

	// claimMu guards claimed: the ids of runner records this factory started, adopted
	// or is stopping, so no record is ever taken twice.
	claimMu sync.Mutex
	claimed map[string]bool
	// cacheDirs count the runners of this factory holding each prompt cache
	// directory, pruning are the directories the janitor is removing (both guarded
	// by claimMu).
	cacheDirs map[string]int
	pruning   map[string]bool

	sandboxLogged sync.Once
}

var _ enginepool.RunnerFactory = (*ProcessFactory)(nil)

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
	return &ProcessFactory{cfg: cfg, claimed: map[string]bool{}, cacheDirs: map[string]int{}, pruning: map[string]bool{}}
}

// Start execs a runner for spec in a new process group and returns once it listens
// (before the model is loaded: follow the load with WaitReady). ctx bounds the start
// only, not the runner's life. If anything fails after the exec, the process is
// killed and reaped before Start returns. With a StateDir, a recorded runner with the
// same fingerprint that is alive and proves its identity is adopted instead (see
// ProcessConfig.StateDir); Adopted reports it.
func (f *ProcessFactory) Start(ctx context.Context, spec enginepool.ModelSpec, ceilingBytes int64) (enginepool.Runner, error) {
	path, err := ResolveRunnerPath(f.cfg.RunnerPath)
	if err != nil {
		return nil, startError(spec.Name, err)
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
	if spec.SplitWorker {
		return f.startWorker(ctx, path, spec, log)
	}
	var rec *runnerRecord
	// A split head's runner is not detached: its workers' addresses end with the agent.
	if f.cfg.StateDir != "" && len(spec.SplitWorkers) == 0 {
		var r *ProcessRunner
		if r, rec, err = f.adoptOrRecord(ctx, path, spec, ceilingBytes, log); err != nil {
			return nil, startError(spec.Name, err)
		}
		if r != nil {
			if r.rec != nil && r.rec.CacheDir != "" {
				cacheDir = r.rec.CacheDir
				f.claimCacheDirExact(cacheDir)
				handedDir = r.setCacheDir(cacheDir)
			}
			f.startSpanRelay(r)
			return r, nil
		}
	}
	cacheDir = f.claimCacheDir(spec)
	if rec != nil {
		rec.CacheDir = cacheDir
	}
	r, handed, err := f.launch(ctx, path, spec, ceilingBytes, launchOptions{cacheDir: cacheDir, rec: rec}, log)
	handedDir = handed
	if err != nil {
		return nil, err
	}
	f.startSpanRelay(r)
	return r, nil
}

func startError(model string, err error) error {
	return &RunnerError{Model: model, Phase: PhaseStart, ExitCode: -1, Err: err}
}

// adoptOrRecord adopts a recorded runner with spec's fingerprint, or else makes the
// record of the runner about to be started (detached, for the next agent to adopt).
func (f *ProcessFactory) adoptOrRecord(ctx context.Context, path string, spec enginepool.ModelSpec, ceilingBytes int64, log logr.Logger) (*ProcessRunner, *runnerRecord, error) {
	// The fingerprint names the file's cache directory without the index a runner
	// starting while the janitor removes it gets (claimCacheDir), or an earlier
	// agent gave a second runner of the file.
	fpArgs := append(f.engineArgs(spec, ceilingBytes), f.promptCacheArgs(spec, f.cacheDirBase(spec))...)
	fp, err := f.fingerprint(path, spec, fpArgs)
	if err != nil {
		return nil, nil, err
	}
	if r := f.adopt(ctx, spec, fp, log); r != nil {
		return r, nil, nil
	}
	rec, err := f.newRecord(spec.Name, fp, ceilingBytes)
	return nil, rec, err
}

// runnerArgs is the runner's whole command line: where it listens, the engine
// (engineArgs), its prompt cache, tracing, and — detached (rec) — how it outlives
// the agent.
func (f *ProcessFactory) runnerArgs(spec enginepool.ModelSpec, ceilingBytes int64, sock, cacheDir string, rec *runnerRecord) []string {
	if spec.SplitWorker {
		return f.workerArgs(spec)
	}
	args := []string{"--model", spec.Path, "--socket", sock}
	if f.cfg.Loopback {
		args = []string{"--model", spec.Path, "--addr", "127.0.0.1:0"}
	}
	args = append(args, f.engineArgs(spec, ceilingBytes)...)
	args = append(args, f.promptCacheArgs(spec, cacheDir)...)
	if len(spec.SplitWorkers) > 0 {
		args = append(args, splitArgs(spec.SplitWorkers)...)
		// A whole replica ignores the split pipeline: only a split head takes it.
		args = append(args, spec.Engine.SplitArgs()...)
	}
	if f.cfg.SpanRelay != nil {
		// Not an engine argument: whether the agent traces is no reason to reload a
		// model, and an adopted runner without it is only not traced.
		args = append(args, "--trace-relay")
	}
	if rec != nil {
		args = append(args, "--exit-with-parent=false", "--nonce", rec.Nonce)
		if f.cfg.OrphanTimeout > 0 {
			args = append(args, "--orphan-timeout", f.cfg.OrphanTimeout.String())
		}
	}
	return args
}

// launchOptions are what a launch gives the new process beside its spec: the cache
// directory it takes over, its record (detached runners), and a split worker's secret
// (on its standard input).
type launchOptions struct {
	cacheDir string
	rec      *runnerRecord
	secret   []byte
}

// launch execs a new runner and waits for its listening line. handed says whether
// the runner took over o.cacheDir (it releases it when reaped), also on failure.
func (f *ProcessFactory) launch(ctx context.Context, path string, spec enginepool.ModelSpec, ceilingBytes int64,
	o launchOptions, log logr.Logger) (r *ProcessRunner, handed bool, err error) {
	cacheDir, rec := o.cacheDir, o.rec
	// The socket directory is made even for loopback runners: it is the runner's
	// private scratch directory, removed when the process is reaped.
	dir, sock, err := makeSocketDir(f.cfg.SocketDir)
	if err != nil {
		return nil, false, startError(spec.Name, err)
	}
	cmd := f.command(ctx, path, f.runnerArgs(spec, ceilingBytes, sock, cacheDir, rec), spec, cacheDir, dir, splitPorts(spec))
	if o.secret != nil {
		cmd.Stdin = secretInput(o.secret)
	} else if in := splitTokensInput(spec.SplitWorkers); in != nil {
		cmd.Stdin = in
	}
	out, err := f.attachOutput(cmd, rec, dir)
	if err != nil {
		return nil, false, startError(spec.Name, err)
	}
	began := time.Now()
	err = cmd.Start()
	out.closeWriteEnds(cmd)
	if err != nil {
		out.closeAll()
		return nil, false, startError(spec.Name, err)
	}

	r = f.newRunner(spec.Name, cmd.Process.Pid, dir, log)
	r.cmd = cmd
	handed = r.setCacheDir(cacheDir)
	listening, stdoutEOF := f.follow(r, rec, out)
	go r.reap()

	ev, err := awaitListening(ctx, r, f.cfg.ListenTimeout, listening, stdoutEOF)
	if err != nil {
		return nil, handed, err
	}
	if err := r.setAddress(ev.Socket, ev.Addr); err != nil {
		return nil, handed, r.startFailure(err)
	}
	if rec != nil {
		rec.Network, rec.Address = r.dialNetwork, r.dialAddress
		if err := writeRecord(f.cfg.StateDir, rec); err != nil {
			return nil, handed, r.startFailure(err)
		}
	}
	r.startedIn = time.Since(began)
	r.log.V(1).Info("Runner listening", "runner", path, "address", r.dialAddress, "startup", r.startedIn,
		"detached", rec != nil)
	return r, handed, nil
}

// runnerOutput is where a starting runner writes: pipes we read, or — detached — a
// log file that every agent owning it follows.
type runnerOutput struct {
	outR, errR, logFile *os.File
	dir                 string
	logPath             string
}

// closeAll undoes attachOutput and removes the runner's directory and log: the
// start failed.
func (o *runnerOutput) closeAll() {
	for _, file := range []*os.File{o.outR, o.errR, o.logFile} {
		if file != nil {
			file.Close()
		}
	}
	os.RemoveAll(o.dir)
	if o.logPath != "" {
		os.Remove(o.logPath)
	}
}

// closeWriteEnds closes our copies of the pipes' write ends once the runner was
// exec'd (or failed to be): the runner holds its own.
func (o *runnerOutput) closeWriteEnds(cmd *exec.Cmd) {
	if cmd.Stdout != nil && o.outR != nil {
		cmd.Stdout.(*os.File).Close()
		cmd.Stderr.(*os.File).Close()
	}
}

// attachOutput points cmd's output at pipes, or for a detached runner (rec) at its
// log file, and sets its process group or session. The runner writes straight into
// files we own, so cmd.Wait never waits on a copy goroutine (a grandchild holding a
// pipe open cannot stall the reaper).
func (f *ProcessFactory) attachOutput(cmd *exec.Cmd, rec *runnerRecord, dir string) (*runnerOutput, error) {
	out := &runnerOutput{dir: dir}
	if rec != nil {
		out.logPath = f.logPath(rec.ID)
		// A detached runner must not write into pipes: once the agent is gone a write
		// would kill it with SIGPIPE. Its output goes to a log file that every agent
		// owning it follows.
		var err error
		out.logFile, err = os.OpenFile(out.logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
		if err != nil {
			out.closeAll()
			return nil, fmt.Errorf("creating the runner's log: %w", err)
		}
		cmd.Stdout, cmd.Stderr = out.logFile, out.logFile
		// A session of its own: no terminal's hangup or ^C, no process group of the
		// agent's service manager reaches it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		return out, nil
	}
	var outW, errW *os.File
	var err error
	if out.outR, outW, err = os.Pipe(); err != nil {
		out.closeAll()
		return nil, err
	}
	if out.errR, errW, err = os.Pipe(); err != nil {
		outW.Close()
		out.closeAll()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	// A new process group: signals to the agent's group (a terminal's ^C) do not
	// reach the runner, and Stop can signal the runner together with anything it
	// spawned.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	dieWithParent(cmd.SysProcAttr)
	return out, nil
}

// follow starts reading a started runner's output for its listening line (and its
// stderr tail). stdoutEOF is closed once its output has been read to the end.
func (f *ProcessFactory) follow(r *ProcessRunner, rec *runnerRecord, out *runnerOutput) (<-chan listenEvent, <-chan struct{}) {
	listening := make(chan listenEvent, 1)
	if rec != nil {
		out.logFile.Close()
		rec.PID, rec.Dir = r.pid, out.dir
		// A failure here only weakens a later adoption (the nonce still proves it).
		rec.StartTime, _ = procStartTime(r.pid)
		r.rec = rec
		f.claim(rec.ID)
		go r.followLog(f.logPath(rec.ID), false, listening)
		return listening, r.stderrEOF
	}
	stdoutEOF := make(chan struct{})
	go func() {
		defer close(stdoutEOF)
		r.readStdout(out.outR, listening)
	}()
	go r.readStderr(out.errR)
	return listening, stdoutEOF
}

// awaitListening waits for the runner's listening line, up to timeout and ctx. A
// runner that exits first may still have announced itself before failing fast (a
// load error): what it wrote is read before deciding, so that the failure is
// reported as a load failure.
func awaitListening(ctx context.Context, r *ProcessRunner, timeout time.Duration, listening <-chan listenEvent, stdoutEOF <-chan struct{}) (listenEvent, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case ev := <-listening:
		return ev, nil
	case <-r.exited:
		select {
		case <-stdoutEOF:
		case <-time.After(time.Second):
		}
		select {
		case ev := <-listening:
			return ev, nil
		default:
			return listenEvent{}, r.startFailure(errors.New("exited before listening"))
		}
	case <-timer.C:
		return listenEvent{}, r.startFailure(fmt.Errorf("no listening line within %s", timeout))
	case <-ctx.Done():
		return listenEvent{}, r.startFailure(ctx.Err())
	}
}

// startSpanRelay drains r's spans while it runs, when the agent traces; r's client
// tells the drain when an answer has been read. Called before r is handed out.
func (f *ProcessFactory) startSpanRelay(r *ProcessRunner) {
	if f.cfg.SpanRelay == nil {
		return
	}
	answered := make(chan struct{}, 1)
	r.client = &http.Client{Transport: answeredTransport{next: r.transport, answered: answered}}
	go r.relaySpans(answered)
}

// engineArgs are the runner flags that shape the engine (everything but where it
// listens and how it relates to the agent).
func (f *ProcessFactory) engineArgs(spec enginepool.ModelSpec, ceilingBytes int64) []string {
	args := spec.Engine.WithRunnerThreads(f.cfg.Threads, f.cfg.PerformanceCores, spec.WeightBytes).Args(f.cfg.Batch)
	if ceilingBytes > 0 {
		args = append(args, "--ceiling-bytes", strconv.FormatInt(ceilingBytes, 10))
	}
	if spec.Name != "" {
		args = append(args, "--alias", spec.Name)
	}
	if spec.ProjectorPath != "" {
		args = append(args, "--mmproj", spec.ProjectorPath)
	}
	if spec.DraftPath != "" {
		args = append(args, "--draft", spec.DraftPath)
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
