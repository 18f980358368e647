//go:build cgo && !race

// Package server is the macfleet-runner process: one model loaded through llama.cpp,
// served over the private protocol of docs/runner-protocol.md (health, status, limits,
// OpenAI chat/completions/embeddings, tokenize, abort, cache clear, shutdown) on a unix
// socket or loopback TCP. It has no tests of its own (linking llama.cpp into a -race
// test binary would compile it twice); test/runner exercises the built binary.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apiengine "github.com/macfleet/macfleet/api/engine"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat"
	"github.com/macfleet/macfleet/internal/tracing/spanrelay"
	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
	"github.com/macfleet/macfleet/metal/runner/llama"
	"github.com/macfleet/macfleet/metal/runner/netdevice"
)

// Config is the runner's configuration (its command-line flags).
type Config struct {
	ModelPath string
	// Exactly one of Socket and Addr is set.
	Socket, Addr string
	// Runner is the engine settings as the runner runs them (package engine: the one
	// settings type, its bounds and the runner's flags): Ctx is the total context,
	// split evenly across the Parallel slots, zero giving every slot the model's
	// training context; Batch is n_batch.
	apiengine.Runner
	// CeilingBytes is the initial memory ceiling (0: none); /limits replaces it.
	CeilingBytes int64
	// Alias is the model name in responses (default: the request's model, else the
	// file name).
	Alias     string
	GPULayers int
	Mmap      bool
	Verbose   bool
	// ExitWithParent stops the runner gracefully when its parent process (the agent)
	// exits, so a crashed agent never leaves orphaned runners holding memory.
	ExitWithParent bool
	// Nonce is echoed on /health (an agent adopting the runner checks it).
	Nonce string
	// OrphanTimeout, when positive, stops the runner once it has received no request
	// at all (health checks and limit pushes count) for that long and none is in
	// flight: a detached runner whose agent never came back does not hold memory forever.
	OrphanTimeout time.Duration
	// PromptCache configures the prompt cache (hot and SSD tiers).
	PromptCache PromptCacheConfig
	// BackendDir holds the dynamic accelerator backends (libggml-cuda.so …) loaded
	// before the model; without any the runner computes on its compiled-in backends.
	BackendDir string
	// Split lists the workers that hold the model's last layers, in layer order
	// (docs/split-model.md); empty: the runner holds them all. SplitTimeout bounds every
	// read and write on their links (0: DefaultSplitTimeout).
	Split        []SplitWorker
	SplitTimeout time.Duration
	// SplitPipeline is how many llama contexts a split runner decodes at once, each
	// with Parallel/SplitPipeline slots on its own goroutine, so that the runner's and
	// the workers' stages overlap (docs/split-model.md, "Pipelining"); 0 or 1: one.
	SplitPipeline int
	// Stdout receives the listening event.
	Stdout io.Writer
	// TracerProvider traces generation requests (tracing.NewRelayed); nil means none.
	TracerProvider trace.TracerProvider
	// Spans is the queue the runner's spans wait in for the agent, which drains it
	// with POST /spans (package spanrelay); nil: the runner keeps no spans.
	Spans *spanrelay.Queue
	Log   logr.Logger
}

// LoadError means the model could not be loaded (the process exits with code 3).
type LoadError struct{ Err error }

func (e *LoadError) Error() string { return "loading model: " + e.Err.Error() }
func (e *LoadError) Unwrap() error { return e.Err }

var pidSelf = os.Getpid()

// maxBody bounds request bodies.
const maxBody = 64 << 20

// Server is one runner.
type Server struct {
	cfg    Config
	log    logr.Logger
	tracer trace.Tracer // nil: tracing off

	mu       sync.Mutex
	state    string
	progress float64
	loadErr  string
	lostErr  string // a split worker's failed link, once the runner has failed for it

	failureSeen     chan struct{}
	failureSeenOnce sync.Once
	lost            chan struct{} // closed once a split worker is lost
	stopReq         chan struct{}
	stopOnce        sync.Once
	cancelLoad      atomic.Bool

	// Set once by load, before the state becomes ready.
	model *llama.Model
	lctxs []*llama.Context // one per engine
	// devBytes is the runner's own allocation on accelerators, read once the model
	// and its contexts are loaded (llama.cpp allocates them whole at load).
	devBytes atomic.Int64
	eng      *engineSet
	pc       *promptCache // nil when it could not be opened
	split    []*netdevice.Device
	// prefixes is the prefix table this process reports on /cache/prefixes (empty
	// without a prompt cache).
	prefixes   *promptcache.PrefixTable
	info       runnerapi.ModelInfo
	tmpl       string             // llama.cpp built-in template, when chat is nil
	chat       *chat.Template     // the model's own template (nil: none that parses)
	chatInfo   runnerapi.ChatInfo // reported in /status
	markers    map[int32][]byte   // control tokens the output parser must see
	nCtxSeq    int
	nSeqCtx    int // the sequences (slots) of each context
	kvPerToken int64
	defaultID  string

	ceiling atomic.Int64

	fpMu sync.Mutex
	// reclaimedAt is when the guard last returned the heap's garbage (unix ns).
	reclaimedAt atomic.Int64
	fpAt        time.Time
	fp          int64

	// lastRequest (unix nanoseconds) and inFlight drive the orphan timeout.
	lastRequest atomic.Int64
	inFlight    atomic.Int64

	// requests are the generations in progress by runnerapi.HeaderRequestID, for /cancel.
	requests requestTable
}

// Run serves until ctx ends or /shutdown is called, then stops gracefully. It listens
// before loading the model so load progress is visible on /health.
func Run(ctx context.Context, cfg Config) error {
	s := newServer(cfg)
	// Taken before the listening line: once the agent has read it, a parent exit is
	// always noticed.
	ppid := os.Getppid()

	ln, err := listen(cfg)
	if err != nil {
		return err
	}
	if cfg.Socket != "" {
		defer os.Remove(cfg.Socket)
	}
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 30 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	if err := s.announce(ln); err != nil {
		return err
	}

	if cfg.ExitWithParent {
		go s.watchParent(ctx, ppid)
	}
	if cfg.OrphanTimeout > 0 {
		go s.watchOrphaned(ctx, cfg.OrphanTimeout)
	}
	loaded := make(chan error, 1)
	go func() { loaded <- s.load() }()

	stopping := func() {
		s.setState(runnerapi.StateStopping, "")
		s.cancelLoad.Store(true)
	}
	select {
	case err = <-loaded:
	case <-ctx.Done():
		stopping()
		err = <-loaded
	case <-s.stopReq:
		stopping()
		err = <-loaded
	case err := <-serveErr:
		return fmt.Errorf("serving: %w", err)
	}
	if err != nil {
		return s.notLoaded(ctx, srv, err)
	}
	s.setState(runnerapi.StateReady, "")
	s.log.Info("Ready", "model", s.info.Path, "slots", s.cfg.Parallel, "threads", s.cfg.Threads, "slotContext", s.nCtxSeq,
		"kvCells", s.nCtxSeq*s.cfg.Parallel, "batch", s.lctxs[0].NBatch(), "contexts", len(s.lctxs))
	return s.serve(ctx, srv, serveErr)
}

func newServer(cfg Config) *Server {
	s := &Server{
		cfg: cfg, log: cfg.Log, state: runnerapi.StateLoading,
		failureSeen: make(chan struct{}), stopReq: make(chan struct{}), lost: make(chan struct{}),
		defaultID: strings.TrimSuffix(filepath.Base(cfg.ModelPath), filepath.Ext(cfg.ModelPath)),
		prefixes:  promptcache.NewPrefixTable(newEpoch()),
	}
	s.ceiling.Store(cfg.CeilingBytes)
	if cfg.TracerProvider != nil {
		s.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	s.lastRequest.Store(time.Now().UnixNano())
	return s
}

// announce writes the listening line the agent reads on stdout.
func (s *Server) announce(ln net.Listener) error {
	ev := runnerapi.ListeningEvent{Event: "listening", PID: os.Getpid()}
	if s.cfg.Socket != "" {
		ev.Socket = s.cfg.Socket
	} else {
		ev.Addr = ln.Addr().String()
	}
	line, _ := json.Marshal(ev)
	if _, err := fmt.Fprintf(s.cfg.Stdout, "%s\n", line); err != nil {
		return fmt.Errorf("announcing the listener: %w", err)
	}
	s.log.Info("Listening", "addr", ev.Addr, "socket", ev.Socket, "model", s.cfg.ModelPath)
	return nil
}

// notLoaded stops a runner whose load ended in err: stopped while loading, or failed
// (a LoadError, once the agent has read the failure on /health or a bound passed).
func (s *Server) notLoaded(ctx context.Context, srv *http.Server, err error) error {
	if s.cancelLoad.Load() {
		s.log.Info("Stopped while loading")
		if s.shutdownHTTP(srv) {
			s.free()
		}
		return nil
	}
	s.log.Error(err, "Loading the model failed")
	s.setState(runnerapi.StateFailed, err.Error())
	// Let the agent read the failure on /health (bounded: the exit code and stderr
	// tell it too).
	select {
	case <-s.failureSeen:
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
	case <-s.stopReq:
	}
	s.shutdownHTTP(srv)
	return &LoadError{Err: err}
}

// serve serves the loaded model until ctx ends, /shutdown is called or the HTTP
// server fails, then stops.
func (s *Server) serve(ctx context.Context, srv *http.Server, serveErr <-chan error) error {
	var lost error
	select {
	case <-ctx.Done():
	case <-s.stopReq:
	case err := <-serveErr:
		s.eng.close(runnerapi.Unavailable(runnerapi.CodeShuttingDown, "the runner is stopping"))
		return fmt.Errorf("serving: %w", err)
	case <-s.lost:
		lost = s.awaitLostSeen(ctx)
	}
	s.log.Info("Stopping")
	s.setState(runnerapi.StateStopping, "")
	s.eng.close(runnerapi.Unavailable(runnerapi.CodeShuttingDown, "the runner is stopping"))
	s.prefixes.Close() // releases the long polls
	s.closePromptCache()
	if s.shutdownHTTP(srv) {
		s.free()
	}
	s.log.Info("Stopped")
	return lost
}

func listen(cfg Config) (net.Listener, error) {
	if cfg.Socket == "" {
		ln, err := net.Listen("tcp", cfg.Addr)
		if err != nil {
			return nil, fmt.Errorf("listening on %s: %w", cfg.Addr, err)
		}
		return ln, nil
	}
	if fi, err := os.Lstat(cfg.Socket); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(cfg.Socket) // a stale socket of an earlier runner
	}
	ln, err := net.Listen("unix", cfg.Socket)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", cfg.Socket, err)
	}
	if err := os.Chmod(cfg.Socket, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("restricting %s: %w", cfg.Socket, err)
	}
	return ln, nil
}

// shutdownHTTP stops the listener and waits (bounded) for the handlers to return; it
// reports whether they all did.
func (s *Server) shutdownHTTP(srv *http.Server) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		_ = srv.Close()
		return false
	}
	return true
}

// free releases the context and the model. It is only called once no handler can use
// them; when handlers did not return in time the process exit frees everything.
func (s *Server) free() {
	if backendsReport.Loaded() > 0 {
		// On the GPU suite's card, llama_free crashed in the CUDA backend at shutdown
		// after many prompt-cache saves (docs/gpu.md, "Open"); the process exits
		// right after this, and the driver releases the device memory with it.
		s.log.Info("Leaving the context and the model to the process exit (a dynamic backend is loaded)")
		return
	}
	for _, c := range s.lctxs {
		c.Free()
	}
	s.lctxs = nil
	if s.model != nil {
		s.model.Free()
		s.model = nil
	}
}

func (s *Server) setState(state, errMsg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == runnerapi.StateStopping && state != runnerapi.StateStopping {
		return
	}
	s.state = state
	if errMsg != "" {
		s.loadErr = errMsg
	}
	if state == runnerapi.StateReady {
		s.progress = 1
	}
}

func (s *Server) getState() (string, float64, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state, s.progress, s.loadErr
}

// watchParent requests a stop once the process is re-parented (its parent exited).
func (s *Server) watchParent(ctx context.Context, ppid int) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.stopReq:
			return
		case <-t.C:
			if os.Getppid() != ppid {
				s.log.Info("Parent process exited; stopping", "parentPID", ppid)
				s.requestStop()
				return
			}
		}
	}
}

// watchOrphaned requests a stop once no request has arrived for timeout and none is
// in flight.
func (s *Server) watchOrphaned(ctx context.Context, timeout time.Duration) {
	t := time.NewTicker(min(time.Second, max(timeout/4, 10*time.Millisecond)))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.stopReq:
			return
		case <-t.C:
			idle := time.Since(time.Unix(0, s.lastRequest.Load()))
			if s.inFlight.Load() == 0 && idle >= timeout {
				s.log.Info("No request within the orphan timeout; stopping", "timeout", timeout)
				s.requestStop()
				return
			}
		}
	}
}

// tracked counts requests for the orphan timeout: one in flight is activity, and its
// end restarts the idle clock.
func (s *Server) tracked(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.inFlight.Add(1)
		s.lastRequest.Store(time.Now().UnixNano())
		defer func() {
			s.lastRequest.Store(time.Now().UnixNano())
			s.inFlight.Add(-1)
		}()
		next.ServeHTTP(w, r)
	})
}

// requestStop asks Run to stop gracefully.
func (s *Server) requestStop() { s.stopOnce.Do(func() { close(s.stopReq) }) }

// load loads the model and creates the context and the engine.
func (s *Server) load() error {
	cfg := s.cfg
	s.loadBackends()
	llama.Init(cfg.Verbose)
	st, err := os.Stat(cfg.ModelPath)
	if err != nil {
		return err
	}
	start := time.Now()
	if s.split, err = s.splitDevices(context.Background()); err != nil {
		return err
	}
	params := llama.ModelParams{
		GPULayers: cfg.GPULayers, Mmap: cfg.Mmap,
		Progress: func(p float32) bool {
			s.mu.Lock()
			// The context is created after the weights: keep 5% for it.
			s.progress = 0.95 * float64(p)
			s.mu.Unlock()
			return !s.cancelLoad.Load()
		},
	}
	if err := s.splitParams(&params); err != nil {
		return err
	}
	m, err := llama.LoadModel(cfg.ModelPath, params)
	if err != nil {
		if serr := s.splitLost(); serr != nil {
			return fmt.Errorf("%w (%w)", err, serr)
		}
		return err
	}
	s.model = m
	if err := s.checkSplit(m); err != nil {
		return err
	}
	if m.HasEncoder() {
		return errors.New("encoder-decoder models are not supported")
	}
	if err := s.newContexts(m); err != nil {
		return err
	}
	lctx := s.lctxs[0]
	kvSize, _ := llama.KVTypeSize(cfg.KVType)
	headDim := m.NEmbd() / max(m.NHead(), 1)
	s.kvPerToken = int64(float64(2*m.NLayer()*m.NHeadKV()*headDim) * kvSize)
	s.nCtxSeq = lctx.NCtxSeq()
	s.setupChat(m)
	kvType := cfg.KVType
	if kvType == "" {
		kvType = "f16"
	}
	s.info = runnerapi.ModelInfo{
		Path: cfg.ModelPath, SizeBytes: st.Size(), NCtxTrain: m.NCtxTrain(), NEmbd: m.NEmbd(),
		NLayer: m.NLayer(), NHead: m.NHead(), NHeadKV: m.NHeadKV(), NVocab: m.NVocab(),
		KVType: kvType, ChatTemplate: m.ChatTemplate() != "", KVBytesPerToken: s.kvPerToken,
	}
	s.devBytes.Store(s.deviceBytes())
	s.eng = s.newEngineSet(m)
	s.openPromptCache()
	s.eng.start()
	s.log.Info("Model loaded", "desc", m.Desc(), "params", m.NParams(), "took", time.Since(start).Round(time.Millisecond),
		"gpus", llama.GPUCount(), "deviceBytes", s.devBytes.Load())
	return nil
}

// pickTemplate returns the template to format chats with: the model's own when
// llama.cpp recognises it, else chatml (the empty template).
func (s *Server) pickTemplate(t string) string {
	if t == "" {
		return ""
	}
	if _, err := llama.ApplyChatTemplate(t, []llama.ChatMessage{{Role: "user", Content: "hi"}}, true); err != nil {
		s.log.Info("The model's chat template is not supported; using chatml", "error", err.Error())
		return ""
	}
	return t
}

// readyEngine returns the engine when the runner serves requests.
func (s *Server) readyEngine() (*engineSet, *runnerapi.Error) {
	state, progress, loadErr := s.getState()
	switch state {
	case runnerapi.StateReady:
		return s.eng, nil
	case runnerapi.StateLoading:
		return nil, runnerapi.Unavailable(runnerapi.CodeLoading, "the model is loading (%.0f%%)", 100*progress)
	case runnerapi.StateFailed:
		if lost := s.splitLostMessage(); lost != "" {
			return nil, runnerapi.Unavailable(runnerapi.CodeSplitWorkerLost, "%s", lost)
		}
		return nil, runnerapi.Unavailable(runnerapi.CodeLoadFailed, "the model failed to load: %s", loadErr)
	default:
		return nil, runnerapi.Unavailable(runnerapi.CodeShuttingDown, "the runner is stopping")
	}
}

func (s *Server) modelName(requested string) string {
	if s.cfg.Alias != "" {
		return s.cfg.Alias
	}
	if requested != "" {
		return requested
	}
	return s.defaultID
}
