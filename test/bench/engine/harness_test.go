package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
	"github.com/macfleet/macfleet/test/support/chatstream"
	"github.com/macfleet/macfleet/test/support/syncbuf"
)

// workDir holds the macfleet binary and the synthesized models of one test binary.
var workDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "macfleet-bench-engine-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runnerBinary returns the absolute path of $MACFLEET_RUNNER, or skips.
func runnerBinary(b *testing.B) string {
	b.Helper()
	p := os.Getenv(runnerproc.RunnerEnv)
	if p == "" {
		b.Skip("MACFLEET_RUNNER is not set, skipping the engine benchmarks: build the runner with `make runner` " +
			"and run `MACFLEET_RUNNER=$PWD/bin/macfleet-runner hack/bench.sh engine` (or `make bench`)")
	}
	if !filepath.IsAbs(p) {
		// hack/bench.sh runs from the module root; go test runs this package from its
		// own directory.
		if _, err := os.Stat(p); err != nil {
			if root, rerr := moduleRoot(); rerr == nil {
				p = filepath.Join(root, p)
			}
		}
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		b.Fatalf("MACFLEET_RUNNER=%s: %v", p, err)
	}
	return abs
}

// moduleRoot walks up from the working directory to the directory holding go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// macfleetBinary builds ./cmd/macfleet once per test binary with CGO_ENABLED=0, as it
// ships, unless $MACFLEET_BIN names a prebuilt one.
func macfleetBinary(b *testing.B) string {
	b.Helper()
	if p := os.Getenv("MACFLEET_BIN"); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			b.Fatal(err)
		}
		return abs
	}
	buildOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("finding the go command to build macfleet: %w", err)
			return
		}
		buildPath = filepath.Join(workDir, "macfleet")
		cmd := exec.Command(goBin, "build", "-trimpath", "-o", buildPath, "github.com/macfleet/macfleet/cmd/macfleet")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building cmd/macfleet: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		b.Fatal(buildErr)
	}
	return buildPath
}

var (
	modelsMu sync.Mutex
	models   = map[string]string{}
)

// Models the benchmarks synthesize: the presets, a second mid-sized model with other
// weights, and a large one (the mid model with 56 layers, ≈ 890 MB).
const (
	modelMid   = "mid"
	modelMidB  = "mid-b"
	modelSmall = "small"
	modelLarge = "large"
)

// modelPath synthesizes one of the models above once per test binary.
func modelPath(b *testing.B, name string) string {
	b.Helper()
	modelsMu.Lock()
	defer modelsMu.Unlock()
	if p, ok := models[name]; ok {
		return p
	}
	var spec ggufsynth.Spec
	switch name {
	case modelMid:
		spec = ggufsynth.Mid()
	case modelMidB:
		spec = ggufsynth.Mid()
		spec.Seed = 2
	case modelSmall:
		spec = ggufsynth.Small()
	case modelLarge:
		spec = ggufsynth.Mid()
		spec.Name, spec.Layers = "macfleet-large", 56
	default:
		b.Fatalf("unknown benchmark model %q", name)
	}
	p := filepath.Join(workDir, name+".gguf")
	if err := ggufsynth.Write(p, spec); err != nil {
		b.Fatal(err)
	}
	// Write the file back to disk now, as a model file at rest would be: a freshly
	// written one is dirty page cache whose writeback disturbs the memory gauges.
	if err := syncFile(p); err != nil {
		b.Fatal(err)
	}
	models[name] = p
	return p
}

func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// served is one model given to `macfleet serve --model`.
type served struct {
	name     string // also the synthesized model's name
	ctx      int    // context per sequence; the runner holds ctx × parallel tokens
	parallel int
}

// agent is one `macfleet serve` process on a loopback port.
type agent struct {
	b      *testing.B
	cmd    *exec.Cmd
	stderr *syncbuf.Buffer
	exited chan struct{}
	waitEr error
	endpoint
}

// startAgent runs `macfleet serve` with the given models (all OnDemand, never idle out
// during the benchmark), waits for /readyz and loads every model through the admin API.
func startAgent(b *testing.B, ms ...served) *agent {
	b.Helper()
	return startAgentFlags(b, nil, ms...)
}

// startAgentFlags is startAgent with more flags of `macfleet serve`.
func startAgentFlags(b *testing.B, flags []string, ms ...served) *agent {
	b.Helper()
	return startAgentEnv(b, nil, flags, ms...)
}

// startAgentEnv is startAgentFlags with more environment variables (KEY=VALUE).
func startAgentEnv(b *testing.B, env, flags []string, ms ...served) *agent {
	b.Helper()
	runner := runnerBinary(b)
	bin := macfleetBinary(b)
	// The runners' output goes to the agent's stderr, shown if the benchmark fails.
	// The prompt cache is off: these benchmarks compare the agent with the same runner
	// called directly (test/bench/promptcache measures the cache).
	// The kernel picks the port as the agent listens, and the agent logs it: no port
	// is chosen here that another process could take first.
	// The runners get the threads a runner started directly takes by default (CPUs −
	// 1), not the agent's thread policy, so the two compare.
	args := []string{"serve", "--listen", "127.0.0.1:0", "--runner", runner, "--idle-timeout", "1h", "--runner-output",
		"--prompt-cache-hot-bytes", "0", "--prompt-cache-ssd-bytes", "0",
		"--runner-threads", strconv.Itoa(max(1, runtime.NumCPU()-1))}
	args = append(args, flags...)
	for _, m := range ms {
		args = append(args, "--model", fmt.Sprintf("%s=%s:ctx=%d,parallel=%d", m.name, modelPath(b, m.name), m.ctx, max(m.parallel, 1)))
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), runnerproc.RunnerEnv+"="+runner), env...)
	a := &agent{b: b, cmd: cmd, stderr: &syncbuf.Buffer{}, exited: make(chan struct{}),
		endpoint: endpoint{name: "agent", client: newClient(nil)}}
	cmd.Stdout, cmd.Stderr = a.stderr, a.stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() {
		a.waitEr = cmd.Wait()
		close(a.exited)
	}()
	b.Cleanup(func() {
		a.stop()
		if b.Failed() {
			b.Logf("macfleet serve output:\n%s", tail(a.stderr.String(), 6000))
		}
	})
	a.poll(30*time.Second, "the agent logs the address it serves", func() bool {
		m := servingLine.FindStringSubmatch(a.stderr.String())
		if m == nil {
			return false
		}
		a.base = "http://" + m[1]
		return true
	})
	a.poll(30*time.Second, "GET /readyz answers 200", func() bool {
		resp, err := a.client.Get(a.base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	for _, m := range ms {
		a.load(m.name)
	}
	return a
}

// stop sends SIGTERM (the agent drains and unloads every model) and waits; SIGKILL
// after 60 s. The runners die with the agent in any case.
func (a *agent) stop() {
	select {
	case <-a.exited:
		return
	default:
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exited:
	case <-time.After(60 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.exited
	}
}

// poll checks cond every 10 ms until it holds; it fails the benchmark after timeout or
// when the agent exits.
func (a *agent) poll(timeout time.Duration, what string, cond func() bool) {
	a.b.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		select {
		case <-a.exited:
			a.b.Fatalf("macfleet serve exited (%v) while waiting until %s; output:\n%s", a.waitEr, what,
				tail(a.stderr.String(), 6000))
		default:
		}
		if time.Now().After(deadline) {
			a.b.Fatalf("timed out after %v waiting until %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// statusResponse is the body of GET /api/status.
type statusResponse struct {
	Ready bool `json:"ready"`
	enginepool.Snapshot
}

// modelActionResponse is the body of POST /api/models/{id}/load and .../unload.
type modelActionResponse struct {
	Model      string                   `json:"model"`
	State      enginepool.State         `json:"state"`
	Unloaded   bool                     `json:"unloaded"`
	LastUnload *enginepool.UnloadReport `json:"lastUnload"`
}

func (a *agent) status() statusResponse {
	a.b.Helper()
	var st statusResponse
	if code := a.do(http.MethodGet, "/api/status", &st); code != http.StatusOK {
		a.b.Fatalf("GET /api/status: %d", code)
	}
	return st
}

func (a *agent) model(name string) enginepool.ModelSnapshot {
	a.b.Helper()
	for _, m := range a.status().Models {
		if m.Name == name {
			return m
		}
	}
	a.b.Fatalf("model %q is not in /api/status", name)
	return enginepool.ModelSnapshot{}
}

// load loads a model and waits until it is Ready.
func (a *agent) load(name string) {
	a.b.Helper()
	var out modelActionResponse
	if code := a.do(http.MethodPost, "/api/models/"+name+"/load", &out); code != http.StatusOK || out.State != enginepool.StateReady {
		a.b.Fatalf("POST /api/models/%s/load: %d, state %q", name, code, out.State)
	}
}

// unload unloads a model, waiting for its report, and returns the answer.
func (a *agent) unload(name string) modelActionResponse {
	a.b.Helper()
	var out modelActionResponse
	if code := a.do(http.MethodPost, "/api/models/"+name+"/unload?wait=true", &out); code != http.StatusOK {
		a.b.Fatalf("POST /api/models/%s/unload?wait=true: %d", name, code)
	}
	return out
}

// do sends an admin request with no body and decodes the JSON answer into v.
func (a *agent) do(method, path string, v any) int {
	a.b.Helper()
	code, err := a.call(context.Background(), method, path, v)
	if err != nil {
		a.b.Fatal(err)
	}
	return code
}

// call is do that returns its error, for other goroutines than the benchmark's.
func (a *agent) call(ctx context.Context, method, path string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, http.NoBody)
	if err != nil {
		return 0, err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, fmt.Errorf("%s %s: reading: %w", method, path, err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return resp.StatusCode, fmt.Errorf("%s %s: %d: decoding %q: %w", method, path, resp.StatusCode, tail(string(body), 500), err)
	}
	return resp.StatusCode, nil
}

// direct returns an endpoint talking to the socket of the runner the agent started for
// model, bypassing the agent: the same process, model and KV cache, so a comparison
// against the agent isolates what the agent's path adds.
func (a *agent) direct(model string) endpoint {
	a.b.Helper()
	m := a.model(model)
	if m.PID == 0 {
		a.b.Fatalf("model %q has no runner (state %s)", model, m.State)
	}
	args, err := processArgs(m.PID)
	if err != nil {
		a.b.Fatalf("reading the arguments of runner %d: %v", m.PID, err)
	}
	for i, arg := range args {
		if i+1 >= len(args) {
			break
		}
		switch arg {
		case "--socket":
			sock := args[i+1]
			return endpoint{name: "direct", base: "http://runner", client: newClient(func(ctx context.Context) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			})}
		case "--addr":
			return endpoint{name: "direct", base: "http://" + args[i+1], client: newClient(nil)}
		}
	}
	a.b.Fatalf("runner %d was started without --socket or --addr: %q", m.PID, args)
	return endpoint{}
}

// processArgs returns a process's command line: /proc on Linux, ps elsewhere.
func processArgs(pid int) ([]string, error) {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
		return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), nil
	}
	out, err := exec.Command("ps", "-ww", "-o", "args=", "-p", strconv.Itoa(pid)).Output()
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}

// servingLine is the log line of `macfleet serve` with the address it serves.
var servingLine = regexp.MustCompile(`"msg"="Serving the OpenAI and admin API" "addr"="([^"]+)"`)

// newClient returns an HTTP client that keeps its connections alive; dial, when set,
// replaces TCP (a unix socket).
func newClient(dial func(ctx context.Context) (net.Conn, error)) *http.Client {
	t := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 16, IdleConnTimeout: 5 * time.Minute}
	if dial != nil {
		t.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) }
	}
	return &http.Client{Transport: t}
}

// endpoint speaks the OpenAI API: the agent, or a runner directly.
type endpoint struct {
	name   string
	base   string
	client *http.Client
	// traced sends every request with a sampled traceparent of a new trace, as a
	// traced agent calls its runner.
	traced bool
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// stream is the timing of one streamed completion, every offset from the moment the
// request was sent.
type stream = chatstream.Result

// chat streams a greedy chat completion of maxTokens tokens (test/support/chatstream).
// onPiece, when set, is called after every text chunk with the number of chunks so far.
// The stream must end with [DONE] and report its usage.
func (e endpoint) chat(ctx context.Context, model, prompt string, maxTokens int, onPiece func(n int)) (stream, error) {
	var header http.Header
	if e.name == "agent" {
		// As the gateway names every request it forwards, so that it can be cancelled
		// with its usage: the agent and the runner keep it in their tables.
		header = http.Header{"X-Macfleet-Request-Id": {rand.Text()}}
	}
	if e.traced {
		var id [24]byte
		_, _ = rand.Read(id[:])
		header = http.Header{"Traceparent": {fmt.Sprintf("00-%x-%x-01", id[:16], id[16:])}}
	}
	return chatstream.Do(ctx, e.client, e.base, e.name,
		chatstream.Request{Model: model, Prompt: prompt, MaxTokens: maxTokens, Seed: 1, Header: header}, onPiece)
}

// mustChat is chat that fails the benchmark on an error, and unless the generation
// ran to maxTokens: every figure compares generations of the same length.
func (e endpoint) mustChat(b *testing.B, model, prompt string, maxTokens int, onPiece func(int)) stream {
	b.Helper()
	s, err := e.chat(context.Background(), model, prompt, maxTokens, onPiece)
	if err != nil {
		b.Fatal(err)
	}
	if s.CompletionTokens != maxTokens || s.FinishReason != "length" {
		b.Fatalf("%s: prompt %q generated %d of %d tokens (finish %q): pick a prompt that runs to max_tokens",
			e.name, prompt, s.CompletionTokens, maxTokens, s.FinishReason)
	}
	return s
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// reportOthers reports the CPU other processes used during the measurement and
// returns it for the benchmark's log line.
func reportOthers(b *testing.B, m *cpuMeter) string {
	if c, ok := m.others(); ok {
		b.ReportMetric(c, "other-cpus")
	}
	return m.describe()
}

// tokenize times POST /tokenize of the chat prompt: the round trip the agent makes to
// the runner before proxying a chat completion (its prefill guard counts the tokens).
// The runner serves one model: its /tokenize takes no "model" (an unknown field is a 400).
func (e endpoint) tokenize(b *testing.B, prompt string) time.Duration {
	b.Helper()
	body, err := json.Marshal(map[string]any{"messages": []chatMessage{{Role: "user", Content: prompt}}})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	resp, err := e.client.Post(e.base+"/tokenize", "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatalf("%s: POST /tokenize: %v", e.name, err)
	}
	defer resp.Body.Close()
	var out struct {
		Count int `json:"count"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || out.Count == 0 {
		b.Fatalf("%s: POST /tokenize: %s, count %d, %v", e.name, resp.Status, out.Count, err)
	}
	return time.Since(start)
}

// chatPair runs the same greedy chat on two endpoints at once, so that whatever else
// runs on the machine slows both alike, and fails the benchmark unless both ran to
// genTokens.
func chatPair(b *testing.B, first, second endpoint, model string) (stream, stream) {
	b.Helper()
	var s2 stream
	var err2 error
	done := make(chan struct{})
	go func() {
		defer close(done)
		s2, err2 = second.chat(context.Background(), model, prompt, genTokens, nil)
	}()
	s1 := first.mustChat(b, model, prompt, genTokens, nil)
	<-done
	if err2 != nil {
		b.Fatal(err2)
	}
	if s2.CompletionTokens != genTokens {
		b.Fatalf("%s generated %d of %d tokens", second.name, s2.CompletionTokens, genTokens)
	}
	return s1, s2
}

// pairedDecode is what pairs of chats measured: each side's decode rates, the pairs'
// ratios (first / second) and the CPU time (clock ticks) each side's runner spent.
type pairedDecode struct {
	first, second, ratios   []float64
	firstTicks, secondTicks int64
	cpuUnknown              bool
}

// run runs n chatPairs of first and second, whose runners are processes firstPID and
// secondPID, and adds up what they measured. Which of the two is sent first
// alternates from pair to pair.
func (p *pairedDecode) run(b *testing.B, n int, first, second endpoint, firstPID, secondPID int) {
	b.Helper()
	ticks := func() (f, s int64) {
		f, _, _, fErr := procTicks(firstPID)
		s, _, _, sErr := procTicks(secondPID)
		p.cpuUnknown = p.cpuUnknown || fErr != nil || sErr != nil
		return f, s
	}
	for i := range n {
		f0, s0 := ticks()
		var f, s stream
		if i%2 == 0 {
			f, s = chatPair(b, first, second, modelMid)
		} else {
			s, f = chatPair(b, second, first, modelMid)
		}
		f1, s1 := ticks()
		p.firstTicks, p.secondTicks = p.firstTicks+f1-f0, p.secondTicks+s1-s0
		p.first, p.second = append(p.first, f.DecodeRate()), append(p.second, s.DecodeRate())
		p.ratios = append(p.ratios, f.DecodeRate()/s.DecodeRate())
	}
}

// report reports what the pairs measured as metrics (each side's median decode rate
// under firstName and secondName, the median pair ratio, the CPU ratio, the other
// processes' CPU since cpu started) and returns one sentence of it for b.Logf, with
// the verdict on the target ratio ≥ 0.98.
func (p *pairedDecode) report(b *testing.B, cpu *cpuMeter, firstName, secondName string) string {
	b.Helper()
	ratio := median(p.ratios)
	b.ReportMetric(0, "ns/op")
	others := reportOthers(b, cpu)
	b.ReportMetric(median(p.first), firstName+"-tok/s")
	b.ReportMetric(median(p.second), secondName+"-tok/s")
	b.ReportMetric(ratio, "tok/s-ratio")
	cpuNote := p.cpuRatio(b)
	ratios := slices.Sorted(slices.Values(p.ratios))
	return fmt.Sprintf("%s: decode %.1f vs %.1f tok/s over %d pairs of %d tokens, median pair ratio %.3f "+
		"(quartiles %.3f–%.3f; target ≥ 0.98: %s); %s",
		others, median(p.first), median(p.second), len(ratios), genTokens, ratio, ratios[len(ratios)/4], ratios[len(ratios)*3/4],
		verdict(ratio >= 0.98), cpuNote)
}

// cpuRatio is the first runner's CPU time per token over the second's (both generated
// the same number of tokens), reported as the metric cpu-ratio, and a note saying it.
func (p *pairedDecode) cpuRatio(b *testing.B) string {
	if p.cpuUnknown || p.firstTicks <= 0 || p.secondTicks <= 0 {
		return "CPU time per token: not measured (no /proc)"
	}
	r := float64(p.firstTicks) / float64(p.secondTicks)
	b.ReportMetric(r, "cpu-ratio")
	return fmt.Sprintf("CPU time per token %.3f× (%d vs %d ticks)", r, p.firstTicks, p.secondTicks)
}
