package server_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/agent/standalone"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// tinyModel is a synthesized ggufsynth.Tiny model shared by the package's tests.
var tinyModel string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "macfleet-server-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tinyModel = filepath.Join(dir, "tiny.gguf")
	if err := ggufsynth.Write(tinyModel, ggufsynth.Tiny()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runnerPath returns $MACFLEET_RUNNER or skips the test.
func runnerPath(t *testing.T) string {
	t.Helper()
	p := os.Getenv(runnerproc.RunnerEnv)
	if p == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("MACFLEET_RUNNER=%s: %v", p, err)
	}
	return p
}

// tinySpec is the pool spec of the tiny model under name, built the way `macfleet
// serve` builds it (estimate and dimensions from the GGUF header).
func tinySpec(t *testing.T, m config.Model) enginepool.ModelSpec {
	t.Helper()
	if m.Path == "" {
		m.Path = tinyModel
	}
	if m.KVCacheType == "" {
		m.KVCacheType = "f16"
	}
	if m.Residency == "" {
		m.Residency = config.ResidencyOnDemand
	}
	spec, err := standalone.BuildSpec(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

type agentOptions struct {
	specs  []enginepool.ModelSpec
	apiKey string
	// reviewToken is Options.ReviewToken.
	reviewToken func(context.Context, string) (tenancy.Identity, error)
	// resolveModel and deploymentOf are Options.ResolveModel and DeploymentOf.
	resolveModel func(*http.Request, string) (string, error)
	deploymentOf func(string) string
	// inlineImages is Options.InlineImages.
	inlineImages server.InlineImagesFunc
	maxBody      int64
	pool         enginepool.Config
	// serverCert, when set, serves over TLS with it and authenticates callers by their
	// client certificates (Options.ClientCertificates), as the cluster agent does.
	serverCert *pki.Source
	// peers is Options.Peers.
	peers *server.PeerOptions
	// splitLink is Options.SplitLink.
	splitLink http.Handler
	// noEnforcer leaves the pool's enforcer loop (Run) off.
	noEnforcer bool
	// needsRunner: false for tests that never load a model.
	noRunner bool
}

// testAgent is a pool of real runner processes behind the real server on a loopback
// listener.
type testAgent struct {
	t    *testing.T
	pool *enginepool.Pool
	srv  *server.Server
	url  string
	reg  *prometheus.Registry
	key  string
	// factory knows every runner the pool started.
	factory *recordingFactory
	// gatedURL serves the same API, but its responses stall after their first write
	// (headers and the first event) until release is called.
	gatedURL string
	release  func()
}

// recordingFactory remembers the runners it started, so tests can ask a runner
// directly about its slots.
type recordingFactory struct {
	enginepool.RunnerFactory
	mu      sync.Mutex
	runners map[int]enginepool.Runner
}

func (f *recordingFactory) Start(ctx context.Context, spec enginepool.ModelSpec, ceiling int64) (enginepool.Runner, error) {
	r, err := f.RunnerFactory.Start(ctx, spec, ceiling)
	if err == nil {
		f.mu.Lock()
		f.runners[r.PID()] = r
		f.mu.Unlock()
	}
	return r, err
}

func (f *recordingFactory) runner(pid int) enginepool.Runner {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.runners[pid]
}

// auth is the Authorization header the harness's own admin calls send.
func (a *testAgent) auth() []string {
	if a.key == "" {
		return nil
	}
	return []string{"Authorization", "Bearer " + a.key}
}

func startAgent(t *testing.T, o agentOptions) *testAgent {
	t.Helper()
	var rp string
	if !o.noRunner {
		rp = runnerPath(t)
	}
	gauge, err := enginepool.NewGauge()
	if err != nil {
		t.Fatal(err)
	}
	cfg := o.pool
	if cfg.CeilingBytes == 0 {
		cfg.CeilingBytes = 4 << 30
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.DrainTimeout, 20*time.Second)
	def(&cfg.BackoffInitial, 100*time.Millisecond)
	def(&cfg.StopGrace, 3*time.Second)
	def(&cfg.PollActive, 200*time.Millisecond)
	// One thread per runner: on a busy 2-core machine, llama.cpp's worker threads
	// waiting on each other make decoding far slower than one thread alone.
	factory := &recordingFactory{RunnerFactory: runnerproc.NewProcessFactory(runnerproc.ProcessConfig{RunnerPath: rp,
		SocketDir: t.TempDir(), Threads: 1}), runners: map[int]enginepool.Runner{}}
	pool, err := enginepool.New(cfg, factory, gauge, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	specs := o.specs
	if specs == nil {
		specs = []enginepool.ModelSpec{tinySpec(t, config.Model{Name: "tiny", Aliases: []string{"tiny-alias"}, Settings: engine.Settings{ContextLength: 4096, Parallel: 2}})}
	}
	for _, s := range specs {
		if err := pool.Register(s); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	srv, err := server.New(pool, server.Options{APIKey: o.apiKey, ReviewToken: o.reviewToken, MaxBodyBytes: o.maxBody, Registerer: reg,
		ResolveModel: o.resolveModel, DeploymentOf: o.deploymentOf, InlineImages: o.inlineImages, ClientCertificates: o.serverCert != nil, Peers: o.peers, SplitLink: o.splitLink})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetReady(true)
	ts := httptest.NewUnstartedServer(srv.Handler())
	if o.serverCert != nil {
		ts.Listener = tls.NewListener(ts.Listener, o.serverCert.ServerConfig())
	}
	ts.Start()
	url := ts.URL
	if o.serverCert != nil {
		url = strings.Replace(url, "http://", "https://", 1)
	}
	// A second server of the same handler whose connections stall after their first
	// write until release: a stream opened there holds its handler mid-response.
	gate := make(chan struct{})
	gts := httptest.NewUnstartedServer(srv.Handler())
	gts.Listener = &gatedListener{Listener: gts.Listener, gate: gate}
	gts.Start()

	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	if o.noEnforcer {
		close(runDone)
	} else {
		go func() {
			defer close(runDone)
			_ = pool.Run(ctx)
		}()
	}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(gate) }) }
	t.Cleanup(func() {
		release()
		gts.CloseClientConnections()
		ts.CloseClientConnections()
		cancel()
		<-runDone
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		if err := pool.Close(cctx); err != nil {
			t.Errorf("closing the pool: %v", err)
		}
		gts.Close()
		ts.Close()
		if s := pool.Snapshot(); s.Runners != 0 {
			t.Errorf("%d runner processes left after closing the pool", s.Runners)
		}
	})
	return &testAgent{t: t, pool: pool, srv: srv, url: url, reg: reg, key: o.apiKey, factory: factory,
		gatedURL: gts.URL, release: release}
}

// gatedListener's connections pass their first write, then block every further one
// until gate is closed.
type gatedListener struct {
	net.Listener
	gate chan struct{}
}

func (l *gatedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &gatedConn{Conn: c, gate: l.gate}, nil
}

type gatedConn struct {
	net.Conn
	gate   chan struct{}
	writes int
}

func (c *gatedConn) Write(b []byte) (int, error) {
	if c.writes++; c.writes > 1 {
		<-c.gate
	}
	return c.Conn.Write(b)
}

// do sends a JSON request and returns the response with its body read.
func (a *testAgent) do(method, path string, body any, header ...string) (*http.Response, []byte) {
	a.t.Helper()
	return testenv.Do(a.t, method, a.url+path, body, header...)
}

// status is GET /api/status.
func (a *testAgent) status() server.StatusResponse {
	a.t.Helper()
	resp, b := a.do(http.MethodGet, "/api/status", nil, a.auth()...)
	if resp.StatusCode != http.StatusOK {
		a.t.Fatalf("GET /api/status: %d %s", resp.StatusCode, b)
	}
	var s server.StatusResponse
	if err := json.Unmarshal(b, &s); err != nil {
		a.t.Fatalf("decoding /api/status: %v\n%s", err, b)
	}
	return s
}

func (a *testAgent) model(name string) enginepool.ModelSnapshot {
	a.t.Helper()
	for _, m := range a.status().Models {
		if m.Name == name {
			return m
		}
	}
	a.t.Fatalf("model %q is not in /api/status", name)
	return enginepool.ModelSnapshot{}
}

// metric reads one sample of /metrics by name and labels; ok is false if absent.
// Histograms give their sample count.
func (a *testAgent) metric(name string, labels ...string) (float64, bool) {
	a.t.Helper()
	resp, b := a.do(http.MethodGet, "/metrics", nil, a.auth()...)
	if resp.StatusCode != http.StatusOK {
		a.t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		a.t.Fatalf("parsing /metrics: %v", err)
	}
	fam, ok := fams[name]
	if !ok {
		return 0, false
	}
	for _, m := range fam.GetMetric() {
		if !labelsMatch(m, labels) {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// expectMetric waits for a metric to reach want: request metrics are recorded once
// the handler returns and pool events after their waiters are released, so both may
// trail the response the test just read.
func (a *testAgent) expectMetric(want float64, name string, labels ...string) {
	a.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, _ := a.metric(name, labels...)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			a.t.Errorf("%s%v = %v, want %v", name, labels, got, want)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func labelsMatch(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// eventually polls cond every 20ms until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runnerStatus asks the model's runner for its own status (slots, requests) through
// a lease of the test's own, released at once.
func (a *testAgent) runnerStatus(model string) enginepool.RunnerStatus {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := a.pool.Acquire(ctx, model)
	if err != nil {
		a.t.Fatalf("acquiring %s: %v", model, err)
	}
	defer l.Release()
	rn, err := l.Runner()
	if err != nil {
		a.t.Fatal(err)
	}
	st, err := rn.Status(ctx)
	if err != nil {
		a.t.Fatalf("runner status: %v", err)
	}
	return st
}

// tokenCount tokenizes through the model's runner, as the prefill guard does.
func (a *testAgent) tokenCount(model string, req runnerapi.TokenizeRequest) int {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := a.pool.Acquire(ctx, model)
	if err != nil {
		a.t.Fatal(err)
	}
	defer l.Release()
	rn, err := l.Runner()
	if err != nil {
		a.t.Fatal(err)
	}
	b, _ := json.Marshal(req)
	hreq, _ := http.NewRequestWithContext(ctx, http.MethodPost, rn.BaseURL()+"/tokenize", bytes.NewReader(b))
	resp, err := rn.Client().Do(hreq)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out runnerapi.TokenizeResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		a.t.Fatal(err)
	}
	return out.Count
}

// sseStream reads a raw SSE response event by event.
type sseStream struct {
	t    *testing.T
	resp *http.Response
	br   *bufio.Reader
}

// openStream POSTs body to path and expects an SSE response. A gated stream's
// handler blocks after its first event until a.release().
func (a *testAgent) openStream(ctx context.Context, gated bool, path string, body any) *sseStream {
	a.t.Helper()
	b, _ := json.Marshal(body)
	base := a.url
	if gated {
		base = a.gatedURL
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(b))
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatalf("POST %s: %v", path, err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		rb, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		a.t.Fatalf("POST %s: %d %s %s; want a 200 event stream", path, resp.StatusCode, resp.Header.Get("Content-Type"), rb)
	}
	a.t.Cleanup(func() { resp.Body.Close() })
	return &sseStream{t: a.t, resp: resp, br: bufio.NewReader(resp.Body)}
}

// next returns the data of the next event, checking the framing ("data: ...\n\n");
// io.EOF at the end of the body.
func (s *sseStream) next() (string, error) {
	s.t.Helper()
	line, err := s.br.ReadString('\n')
	if err != nil {
		if err == io.EOF && line == "" {
			return "", io.EOF
		}
		return "", fmt.Errorf("reading an event: %q: %w", line, err)
	}
	data, ok := strings.CutPrefix(line, "data: ")
	if !ok || !strings.HasSuffix(data, "\n") {
		return "", fmt.Errorf("event line %q is not `data: ...\\n`", line)
	}
	blank, err := s.br.ReadString('\n')
	if err != nil || blank != "\n" {
		return "", fmt.Errorf("event %q is not followed by a blank line (%q, %v)", line, blank, err)
	}
	return strings.TrimSuffix(data, "\n"), nil
}

// all reads every remaining event up to EOF.
func (s *sseStream) all() []string {
	s.t.Helper()
	var out []string
	for {
		d, err := s.next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			s.t.Fatal(err)
		}
		out = append(out, d)
	}
}

// errorBody is the OpenAI error body.
type errorBody struct {
	Error struct {
		Message        string  `json:"message"`
		Type           string  `json:"type"`
		Code           string  `json:"code"`
		Param          *string `json:"param"`
		EstimatedBytes int64   `json:"estimated_bytes"`
		LimitBytes     int64   `json:"limit_bytes"`
		CeilingBound   string  `json:"ceiling_bound"`
	} `json:"error"`
}

func decodeError(t *testing.T, b []byte) errorBody {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" {
		t.Fatalf("not an OpenAI error body: %s (%v)", b, err)
	}
	return e
}

func chatBody(model string, maxTokens int, stream bool) map[string]any {
	b := map[string]any{"model": model, "max_tokens": maxTokens, "temperature": 0,
		"messages": []map[string]string{{"role": "user", "content": "Say something."}}}
	if stream {
		b["stream"] = true
	}
	return b
}

// waitGroup of goroutines whose failures are reported at the end.
type goGroup struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

func (g *goGroup) Go(f func() error) {
	g.wg.Go(func() {
		if err := f(); err != nil {
			g.mu.Lock()
			g.errs = append(g.errs, err)
			g.mu.Unlock()
		}
	})
}

func (g *goGroup) Wait(t *testing.T) {
	t.Helper()
	g.wg.Wait()
	for _, err := range g.errs {
		t.Error(err)
	}
}
