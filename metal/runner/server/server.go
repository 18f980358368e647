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
	"time"

	apiengine "github.com/macfleet/macfleet/api/engine"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/tracing/spanrelay"
	"github.com/macfleet/macfleet/metal/runner/llama"
	"github.com/macfleet/macfleet/metal/runner/netdevice"
)

// Config is the runner's configuration (its command-line flags).
type Config struct {
	ModelPath string
	// Projector is the model's multimodal projector (mmproj GGUF) that reads the
	// images of chat messages (empty: none, images are refused).
	Projector string
	// Draft is a draft model for speculative decoding: a smaller GGUF of the same
	// vocabulary (empty: none; slots draft by prompt lookup only).
	Draft string
	// DraftDevice is where the draft model computes (placeDraft; "" is auto).
	DraftDevice netdevice.DeviceChoice
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

// Server is one runner: it wires the parts that own the runner's state (its
// lifecycle, the memory guard, the split workers' links, the prompt cache, the
// generation handlers), loads the model into them and serves their endpoints on one
// mux.
type Server struct {
	cfg Config
	log logr.Logger

	run   *runState
	mem   *memGuard
	split *splitLinks
	cache *cacheStore
	gen   *generator

	// Set once by load, before the state becomes ready.
	model   *llama.Model
	lctxs   []*llama.Context // one per engine
	nSeqCtx int              // the sequences (slots) of each context
	lm      *loadedModel     // what the requests and /status read of the model
	draft   *drafter         // the draft model (nil: none)
	eng     *engineSet
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
		go s.run.watchParent(ctx, ppid)
	}
	if cfg.OrphanTimeout > 0 {
		go s.run.watchOrphaned(ctx, cfg.OrphanTimeout)
	}
	loaded := make(chan error, 1)
	go func() { loaded <- s.load() }()

	select {
	case err = <-loaded:
	case <-ctx.Done():
		s.run.stopLoading()
		err = <-loaded
	case <-s.run.stopReq:
		s.run.stopLoading()
		err = <-loaded
	case err := <-serveErr:
		return fmt.Errorf("serving: %w", err)
	}
	if err != nil {
		return s.notLoaded(ctx, srv, err)
	}
	s.run.ready(s.eng)
	s.log.Info("Ready", "model", s.lm.info.Path, "slots", s.cfg.Parallel, "threads", s.cfg.Threads, "slotContext", s.lm.nCtxSeq,
		"kvCells", s.lm.nCtxSeq*s.cfg.Parallel, "batch", s.lctxs[0].NBatch(), "contexts", len(s.lctxs))
	return s.serve(ctx, srv, serveErr)
}

func newServer(cfg Config) *Server {
	run := newRunState(cfg.Log, cfg.Nonce)
	mem := newMemGuard(cfg.CeilingBytes)
	cache := newCacheStore(cfg, run)
	gen := &generator{run: run, mem: mem, cache: cache,
		names: modelNames{alias: cfg.Alias, defaultID: strings.TrimSuffix(filepath.Base(cfg.ModelPath), filepath.Ext(cfg.ModelPath))}}
	if cfg.TracerProvider != nil {
		gen.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	return &Server{cfg: cfg, log: cfg.Log, run: run, mem: mem, split: newSplitLinks(cfg), cache: cache, gen: gen}
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
	if s.run.cancelLoad.Load() {
		s.log.Info("Stopped while loading")
		if s.shutdownHTTP(srv) {
			s.free()
		}
		return nil
	}
	s.log.Error(err, "Loading the model failed")
	s.run.set(runnerapi.StateFailed, err.Error())
	s.run.awaitFailureSeen(ctx)
	s.shutdownHTTP(srv)
	return &LoadError{Err: err}
}

// serve serves the loaded model until ctx ends, /shutdown is called or the HTTP
// server fails, then stops.
func (s *Server) serve(ctx context.Context, srv *http.Server, serveErr <-chan error) error {
	var lost error
	select {
	case <-ctx.Done():
	case <-s.run.stopReq:
	case err := <-serveErr:
		s.eng.close(runnerapi.Unavailable(runnerapi.CodeShuttingDown, "the runner is stopping"))
		return fmt.Errorf("serving: %w", err)
	case <-s.run.lost:
		// Let the agent read the failure on /health, as after a failed load.
		s.run.awaitFailureSeen(ctx)
		lost = &SplitLostError{Err: s.run.lostMessage()}
	}
	s.log.Info("Stopping")
	s.run.set(runnerapi.StateStopping, "")
	s.eng.close(runnerapi.Unavailable(runnerapi.CodeShuttingDown, "the runner is stopping"))
	s.cache.close() // releases the prefix table's long polls, flushes the SSD queue
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
	s.draft.free() // first: it computes on the first context's thread pool
	s.draft = nil
	for _, c := range s.lctxs {
		c.Free()
	}
	s.lctxs = nil
	if s.model != nil {
		s.model.Free()
		s.model = nil
	}
}

// load loads the model and creates the context and the engine.
func (s *Server) load() error {
	cfg := s.cfg
	loadBackends(cfg.BackendDir, s.log)
	llama.Init(cfg.Verbose)
	st, err := os.Stat(cfg.ModelPath)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := s.split.connect(context.Background()); err != nil {
		return err
	}
	params := llama.ModelParams{GPULayers: cfg.GPULayers, Mmap: cfg.Mmap, Progress: s.run.loadProgress}
	if err := s.split.params(&params); err != nil {
		return err
	}
	m, err := llama.LoadModel(cfg.ModelPath, params)
	if err != nil {
		if serr := s.split.lostLink(); serr != nil {
			return fmt.Errorf("%w (%w)", err, serr)
		}
		return err
	}
	s.model = m
	if err := s.split.check(m); err != nil {
		return err
	}
	if m.HasEncoder() {
		return errors.New("encoder-decoder models are not supported")
	}
	if err := s.newContexts(m); err != nil {
		return err
	}
	chat := newChatRenderer(m, s.log)
	if chat.proj, err = loadProjector(cfg.Projector, m, cfg.Threads, cfg.GPULayers != 0, len(cfg.Split) > 0); err != nil {
		return err
	}
	chat.info.Vision = chat.proj != nil
	if s.draft, err = loadDraft(cfg.Draft, m, s.lctxs[0], cfg); err != nil {
		return err
	}
	kvSize, _ := llama.KVTypeSize(cfg.KVType)
	headDim := m.NEmbd() / max(m.NHead(), 1)
	kvPerToken := int64(float64(2*m.NLayer()*m.NHeadKV()*headDim) * kvSize)
	kvType := cfg.KVType
	if kvType == "" {
		kvType = "f16"
	}
	s.lm = &loadedModel{model: m, nCtxSeq: s.lctxs[0].NCtxSeq(), chat: chat, info: runnerapi.ModelInfo{
		Path: cfg.ModelPath, SizeBytes: st.Size(), NCtxTrain: m.NCtxTrain(), NEmbd: m.NEmbd(),
		NLayer: m.NLayer(), NHead: m.NHead(), NHeadKV: m.NHeadKV(), NVocab: m.NVocab(),
		KVType: kvType, ChatTemplate: m.ChatTemplate() != "", KVBytesPerToken: kvPerToken,
	}}
	s.gen.m = s.lm
	s.mem.loaded(kvPerToken, deviceBytes(m, s.lctxs)+s.draft.deviceBytes())
	s.eng = s.newEngineSet(m)
	s.eng.engs[0].drafter = s.draft // a split runner, the only one with several, has none
	pc := s.cache.open(m, kvType, s.nSeqCtx, s.lm.nCtxSeq)
	for _, e := range s.eng.engs {
		e.pc = pc
	}
	s.eng.start()
	s.log.Info("Model loaded", "desc", m.Desc(), "params", m.NParams(), "took", time.Since(start).Round(time.Millisecond),
		"gpus", llama.GPUCount(), "deviceBytes", s.mem.devBytes.Load())
	return nil
}
