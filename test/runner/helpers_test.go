// Package e2e tests the built macfleet-runner binary (found through $MACFLEET_RUNNER,
// which the Makefile sets to bin/macfleet-runner) on models synthesized into temporary
// directories. The runner's own packages have no tests so `go test -race ./...` never
// compiles llama.cpp a second time.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/syncbuf"
)

var (
	modelDir     string
	modelsMu     sync.Mutex
	modelsByName = map[string]string{}
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "macfleet-e2e-models-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	modelDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runnerBinary returns $MACFLEET_RUNNER or skips the test.
func runnerBinary(t testing.TB) string {
	t.Helper()
	p := os.Getenv("MACFLEET_RUNNER")
	if p == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` (hack/build-runner.sh) and export MACFLEET_RUNNER=bin/macfleet-runner")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("MACFLEET_RUNNER=%s: %v", p, err)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// model synthesizes a preset once per test binary and returns its path.
func model(t testing.TB, preset string) string {
	t.Helper()
	modelsMu.Lock()
	defer modelsMu.Unlock()
	if p, ok := modelsByName[preset]; ok {
		return p
	}
	spec, err := ggufsynth.Preset(preset)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(modelDir, preset+".gguf")
	if err := ggufsynth.Write(p, spec); err != nil {
		t.Fatal(err)
	}
	modelsByName[preset] = p
	return p
}

// runner is one started runner process.
type runner struct {
	t       testing.TB
	cmd     *exec.Cmd
	base    string
	client  *http.Client
	stderr  *syncbuf.Buffer
	exited  chan struct{}
	waitErr error
}

// startRunner starts the runner on modelPath with extra flags, waits for its listening
// line, and registers a cleanup that stops it. It does not wait for readiness.
func startRunner(t testing.TB, modelPath string, flags ...string) *runner {
	t.Helper()
	bin := runnerBinary(t)
	useSocket := false
	for _, f := range flags {
		if f == "--socket" {
			useSocket = true
		}
	}
	// One thread: tests run beside other packages, and ggml's spinning thread barriers
	// collapse when its threads are descheduled on a busy machine.
	args := []string{"--model", modelPath, "--threads", "1"}
	if !useSocket {
		args = append(args, "--addr", "127.0.0.1:0")
	}
	args = append(args, flags...)
	cmd := exec.Command(bin, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{t: t, cmd: cmd, stderr: &syncbuf.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = r.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		r.waitErr = cmd.Wait()
		close(r.exited)
	}()
	t.Cleanup(func() {
		r.stop()
		if t.Failed() {
			t.Logf("runner stderr:\n%s", tail(r.stderr.String(), 4000))
			keepStderr(t, r.stderr.String())
		}
	})

	lines := firstLine(stdout)
	var line string
	select {
	case l, ok := <-lines:
		if !ok {
			<-r.exited
			t.Fatalf("runner exited before listening (%v); stderr:\n%s", r.waitErr, r.stderr.String())
		}
		line = l
	case <-time.After(30 * time.Second):
		t.Fatalf("runner did not announce its listener within 30s; stderr:\n%s", r.stderr.String())
	}
	var ev runnerapi.ListeningEvent
	if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Event != "listening" {
		t.Fatalf("unexpected first stdout line %q: %v", line, err)
	}
	if ev.Socket != "" {
		sock := ev.Socket
		r.client = &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
		}}
		r.base = "http://runner"
	} else {
		r.client = &http.Client{Transport: &http.Transport{}}
		r.base = "http://" + ev.Addr
	}
	return r
}

// firstLine delivers a process's first line of output (the channel closes without one
// at EOF) and discards the rest.
func firstLine(stdout io.Reader) <-chan string {
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	return lines
}

// startReady starts a runner and waits until /health says ready.
func startReady(t testing.TB, modelPath string, flags ...string) *runner {
	t.Helper()
	r := startRunner(t, modelPath, flags...)
	r.waitReady(60 * time.Second)
	return r
}

func (r *runner) waitReady(timeout time.Duration) {
	r.t.Helper()
	if err := r.readyErr(timeout); err != nil {
		r.t.Fatal(err)
	}
}

// readyErr waits until the runner is ready, or says why it is not within timeout.
// loadFailed waits up to timeout for r's /health to report a failed load (503,
// StateFailed) and returns that health.
func (r *runner) loadFailed(timeout time.Duration) runnerapi.Health {
	r.t.Helper()
	var h runnerapi.Health
	waitFor(r.t, timeout, "/health to report the failed load", func() bool {
		code, err := r.getJSON("/health", &h)
		return err == nil && code == http.StatusServiceUnavailable && h.Status == runnerapi.StateFailed
	})
	return h
}

func (r *runner) readyErr(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var h runnerapi.Health
		status, err := r.getJSON("/health", &h)
		if err == nil && status == http.StatusOK && h.Status == runnerapi.StateReady {
			return nil
		}
		if h.Status == runnerapi.StateFailed {
			return fmt.Errorf("runner failed to load: %s", h.Error)
		}
		select {
		case <-r.exited:
			return fmt.Errorf("runner exited while loading (%v); stderr:\n%s", r.waitErr, r.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("runner not ready after %v (last: %d %+v %v)", timeout, status, h, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startReadyShortLinks is startReady for a split runner given a short --split-timeout,
// which bounds the load's round trips too: on a busy machine a worker may answer one
// late, so a load that failed on the link timeout is tried again (3 times in all)
// with the same workers, which serve the next runner.
func startReadyShortLinks(t testing.TB, modelPath string, flags ...string) *runner {
	t.Helper()
	for attempt := 1; ; attempt++ {
		r := startRunner(t, modelPath, flags...)
		err := r.readyErr(60 * time.Second)
		if err == nil {
			return r
		}
		if attempt == 3 || !strings.Contains(err.Error(), "within the link timeout") {
			t.Fatal(err)
		}
		t.Logf("load %d: %v; again", attempt, err)
		r.stop()
	}
}

// stop sends SIGTERM and waits; SIGKILL after 10 s.
// checkAlive fails r's test when its runner has exited: how (its process state), and
// its stderr from the first line that is not its log's (a crash's report).
func (r *runner) checkAlive() {
	r.t.Helper()
	select {
	case <-r.exited:
		stderr := r.stderr.String()
		at := max(len(stderr)-3000, 0)
		for _, mark := range []string{"GGML_ASSERT", "panic: ", "fatal error: ", "\nSIG", "terminate called"} {
			if i := strings.Index(stderr, mark); i >= 0 && i < at+3000 {
				at = max(strings.LastIndexByte(stderr[:i], '\n')-1500, 0)
				break
			}
		}
		r.t.Fatalf("the runner exited (%v); stderr:\n%s", r.cmd.ProcessState, stderr[at:min(len(stderr), at+4000)])
	default:
	}
}

func (r *runner) stop() {
	select {
	case <-r.exited:
		return
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
	case <-time.After(10 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.exited
	}
}

// exitCode waits up to timeout for the process to exit and returns its exit code.
func (r *runner) exitCode(timeout time.Duration) int {
	r.t.Helper()
	select {
	case <-r.exited:
	case <-time.After(timeout):
		r.t.Fatalf("runner did not exit within %v", timeout)
	}
	return r.cmd.ProcessState.ExitCode()
}

func (r *runner) getJSON(path string, v any) (int, error) {
	resp, err := r.client.Get(r.base + path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(v)
}

// post sends a JSON body (a string is sent verbatim) and returns the response.
func (r *runner) post(ctx context.Context, path string, body any) (*http.Response, error) {
	var rd io.Reader
	switch b := body.(type) {
	case string:
		rd = strings.NewReader(b)
	case nil:
		rd = http.NoBody
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return r.client.Do(req)
}

// postChat posts body to the chat endpoint with the header pairs hdr.
func postChat(t testing.TB, r *runner, body map[string]any, hdr ...string) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, r.base+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// postJSON posts body and decodes a JSON answer into v; it returns the status.
func (r *runner) postJSON(path string, body, v any) int {
	r.t.Helper()
	resp, err := r.post(context.Background(), path, body)
	if err != nil {
		r.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatalf("POST %s: reading: %v", path, err)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			r.t.Fatalf("POST %s: decoding %q: %v", path, b, err)
		}
	}
	return resp.StatusCode
}

func (r *runner) status() runnerapi.Status {
	r.t.Helper()
	var st runnerapi.Status
	if code, err := r.getJSON("/status", &st); err != nil || code != http.StatusOK {
		r.t.Fatalf("GET /status: %d %v", code, err)
	}
	return st
}

// waitFor polls cond every 10 ms until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sseEvent is one parsed server-sent event: the data of one `data:` line.
type sseEvent struct {
	data string
}

// readSSE reads events until [DONE], an error event or EOF; it fails the test on any
// framing other than `data: ...\n\n`. onEvent may return false to stop reading.
func readSSE(t testing.TB, body io.Reader, onEvent func(sseEvent) bool) (events []sseEvent, done bool, err error) {
	t.Helper()
	br := bufio.NewReader(body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && line == "" {
				return events, false, nil
			}
			return events, false, err
		}
		if !strings.HasPrefix(line, "data: ") || !strings.HasSuffix(line, "\n") {
			t.Fatalf("SSE line %q is not `data: ...`", line)
		}
		blank, err := br.ReadString('\n')
		if err != nil || blank != "\n" {
			t.Fatalf("SSE event %q not followed by a blank line (got %q, %v)", line, blank, err)
		}
		data := strings.TrimSuffix(strings.TrimPrefix(line, "data: "), "\n")
		if data == "[DONE]" {
			rest, _ := io.ReadAll(br)
			if len(rest) != 0 {
				t.Fatalf("data after [DONE]: %q", rest)
			}
			return events, true, nil
		}
		ev := sseEvent{data: data}
		events = append(events, ev)
		if onEvent != nil && !onEvent(ev) {
			return events, false, nil
		}
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// chatBody is a greedy chat request.
func chatBody(prompt string, maxTokens int, stream bool) map[string]any {
	b := map[string]any{
		"model":       "test",
		"messages":    []map[string]string{{"role": "user", "content": prompt}},
		"temperature": 0,
		"max_tokens":  maxTokens,
	}
	if stream {
		b["stream"] = true
	}
	return b
}

// keepStderr writes a failed test's whole runner stderr into $MACFLEET_TEST_STDERR_DIR
// when it is set (the GPU suite keeps them: a crash's first lines name the fault, and
// the log above shows only the tail).
func keepStderr(t testing.TB, stderr string) {
	dir := os.Getenv("MACFLEET_TEST_STDERR_DIR")
	if dir == "" {
		return
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	f, err := os.CreateTemp(dir, name+"-*.stderr")
	if err != nil {
		t.Logf("keeping the runner's stderr: %v", err)
		return
	}
	defer f.Close()
	if _, err := f.WriteString(stderr); err != nil {
		t.Logf("keeping the runner's stderr: %v", err)
	}
}
