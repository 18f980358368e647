package promptcache

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
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
	"github.com/macfleet/macfleet/test/support/testassets"
)

var (
	modelOnce sync.Once
	modelFile string
	modelErr  error
	modelDir  string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "macfleet-bench-promptcache-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	modelDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func runnerBinary(b *testing.B) string {
	p := os.Getenv("MACFLEET_RUNNER")
	if p == "" {
		b.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
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

// toolsModel synthesizes the mid preset's shape with the real Llama 3 vocabulary and
// Llama 3.1 chat template (tools, tool calls and their results), once.
func toolsModel(b *testing.B) string {
	toolsOnce.Do(func() {
		spec, err := testassets.Llama31Spec()
		if err != nil {
			toolsErr = err
			return
		}
		mid := ggufsynth.Mid()
		spec.Embd, spec.Layers, spec.Heads, spec.KVHeads, spec.FF, spec.Ctx = mid.Embd, mid.Layers, mid.Heads, mid.KVHeads, mid.FF, mid.Ctx
		toolsFile = filepath.Join(modelDir, "mid-llama31.gguf")
		toolsErr = ggufsynth.Write(toolsFile, spec)
	})
	if toolsErr != nil {
		b.Fatal(toolsErr)
	}
	return toolsFile
}

var (
	toolsOnce sync.Once
	toolsFile string
	toolsErr  error
)

// midModel synthesizes the mid preset once.
func midModel(b *testing.B) string {
	modelOnce.Do(func() {
		modelFile = filepath.Join(modelDir, "mid.gguf")
		modelErr = ggufsynth.Write(modelFile, ggufsynth.Mid())
	})
	if modelErr != nil {
		b.Fatal(modelErr)
	}
	return modelFile
}

// runner is one macfleet-runner process on a loopback port.
type runner struct {
	b      *testing.B
	cmd    *exec.Cmd
	base   string
	client *http.Client
	stderr *syncbuf.Buffer
	exited chan struct{}
}

func startRunner(b *testing.B, bin, model string, threads string, flags ...string) *runner {
	args := append([]string{"--model", model, "--addr", "127.0.0.1:0", "--threads", threads, "--parallel", "1",
		"--ctx", "4096"}, flags...)
	cmd := exec.Command(bin, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	r := &runner{b: b, cmd: cmd, stderr: &syncbuf.Buffer{}, exited: make(chan struct{}),
		client: &http.Client{Transport: &http.Transport{}}}
	cmd.Stderr = r.stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() {
		_ = cmd.Wait()
		close(r.exited)
	}()
	b.Cleanup(r.stop)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("runner did not announce its listener: %v\n%s", err, r.stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	var ev runnerapi.ListeningEvent
	if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Addr == "" {
		b.Fatalf("listening line %q: %v", line, err)
	}
	r.base = "http://" + ev.Addr
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var h runnerapi.Health
		if code, err := r.get("/health", &h); err == nil && code == http.StatusOK {
			return r
		}
		if time.Now().After(deadline) {
			b.Fatalf("runner not ready: %s", r.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
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
	case <-time.After(15 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.exited
	}
}

func (r *runner) get(path string, v any) (int, error) {
	resp, err := r.client.Get(r.base + path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(v)
}

func (r *runner) post(path string, body, v any) {
	buf, err := json.Marshal(body)
	if err != nil {
		r.b.Fatal(err)
	}
	resp, err := r.client.Post(r.base+path, "application/json", bytes.NewReader(buf))
	if err != nil {
		r.b.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		r.b.Fatalf("POST %s: %d %s", path, resp.StatusCode, data)
	}
	if v != nil {
		if err := json.Unmarshal(data, v); err != nil {
			r.b.Fatalf("POST %s: %q: %v", path, data, err)
		}
	}
}

func (r *runner) status() runnerapi.Status {
	var st runnerapi.Status
	if code, err := r.get("/status", &st); err != nil || code != http.StatusOK {
		r.b.Fatalf("status: %d %v", code, err)
	}
	return st
}

// body is a chat request of msgs, with the tools when the conversation has them.
func body(msgs msgs, fields map[string]any) map[string]any {
	b := map[string]any{"model": "mid", "messages": msgs, "temperature": 0}
	if hasToolCalls(msgs) {
		b["tools"] = []any{weatherTool}
	}
	for k, v := range fields {
		b[k] = v
	}
	return b
}

func (r *runner) tokens(msgs msgs) int {
	var tr runnerapi.TokenizeResponse
	r.post("/tokenize", map[string]any{"chat": body(msgs, nil)}, &tr)
	return tr.Count
}

// chat runs a greedy chat completion and returns the reply.
func (r *runner) chat(msgs msgs, maxTokens int) string {
	var c runnerapi.ChatCompletion
	r.post("/v1/chat/completions", body(msgs, map[string]any{"max_tokens": maxTokens}), &c)
	if len(c.Choices) != 1 {
		r.b.Fatalf("chat: %+v", c)
	}
	return c.Choices[0].Message.Text()
}

// ttft streams a one-token greedy chat and returns the time until the response
// arrives (the runner sends the status line with the first token) and the prompt
// tokens the runner did not prefill.
func (r *runner) ttft(msgs msgs) (time.Duration, int) { return r.ttftWith(msgs, nil) }

// ttftWith is ttft with extra request headers.
func (r *runner) ttftWith(msgs msgs, headers http.Header) (time.Duration, int) {
	buf, _ := json.Marshal(body(msgs, map[string]any{"max_tokens": 1, "stream": true,
		"stream_options": map[string]any{"include_usage": true}}))
	req, err := http.NewRequest(http.MethodPost, r.base+"/v1/chat/completions", bytes.NewReader(buf))
	if err != nil {
		r.b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header[k] = v
	}
	start := time.Now()
	resp, err := r.client.Do(req)
	if err != nil {
		r.b.Fatal(err)
	}
	d := time.Since(start)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		r.b.Fatalf("stream: %d %s", resp.StatusCode, data)
	}
	cached := -1
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c struct {
			Usage *runnerapi.Usage `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &c) == nil && c.Usage != nil {
			cached = 0
			if c.Usage.PromptTokensDetails != nil {
				cached = c.Usage.PromptTokensDetails.CachedTokens
			}
		}
	}
	if cached < 0 {
		r.b.Fatal("the stream carried no usage")
	}
	return d, cached
}
