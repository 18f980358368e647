package standalone_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/agent/standalone"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

func tinyModel(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := ggufsynth.Write(p, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBuildSpec(t *testing.T) {
	path := tinyModel(t)
	tiny := ggufsynth.Tiny()
	dims := enginepool.ModelDims{Layers: tiny.Layers, Embedding: tiny.Embd, Heads: tiny.Heads, KVHeads: tiny.KVHeads,
		Vocab: tiny.Vocab, KVTypeSize: 2}
	tests := []struct {
		name string
		in   config.Model
		want enginepool.ModelSpec
		// estimated: the estimate is read from the header (positive), else want's.
		estimated bool
	}{
		{
			name: "training context per slot",
			in:   config.Model{Name: "t", Path: path, Settings: engine.Settings{Parallel: 2, KVCacheType: "f16"}, Residency: "Pinned"},
			want: enginepool.ModelSpec{Name: "t", Path: path, Engine: engine.Settings{ContextLength: int32(tiny.Ctx), Parallel: 2, KVCacheType: "f16"},
				Residency: enginepool.Pinned, Dims: dims, PromptCache: enginepool.PromptCacheSpec{Enabled: true}},
			estimated: true,
		},
		{
			name: "explicit settings and memory",
			in: config.Model{Name: "t", Aliases: []string{"a"}, Path: path, Settings: engine.Settings{ContextLength: 1024, KVCacheType: "q8_0", Threads: 3},
				Residency: "OnDemand", IdleTimeout: config.Duration(time.Minute), Memory: 3 << 20},
			want: enginepool.ModelSpec{Name: "t", Aliases: []string{"a"}, Path: path, Engine: engine.Settings{ContextLength: 1024, Parallel: 1,
				KVCacheType: "q8_0", Threads: 3}, Residency: enginepool.OnDemand, IdleTimeout: time.Minute, EstimatedBytes: 3 << 20,
				Dims: enginepool.ModelDims{Layers: dims.Layers, Embedding: dims.Embedding, Heads: dims.Heads,
					KVHeads: dims.KVHeads, Vocab: dims.Vocab, KVTypeSize: 34.0 / 32},
				PromptCache: enginepool.PromptCacheSpec{Enabled: true}},
		},
		{
			name: "prompt cache capped, without an SSD tier",
			in: config.Model{Name: "t", Path: path, Settings: engine.Settings{ContextLength: 512, KVCacheType: "f16"}, Residency: "OnDemand", Memory: 1 << 20,
				PromptCache: &config.PromptCache{HotBytes: ptr.To(config.Size(64 << 20)), SSDBytes: ptr.To(config.Size(0))}},
			want: enginepool.ModelSpec{Name: "t", Path: path, Engine: engine.Settings{ContextLength: 512, Parallel: 1, KVCacheType: "f16"},
				Residency: enginepool.OnDemand, EstimatedBytes: 1 << 20, Dims: dims,
				PromptCache: enginepool.PromptCacheSpec{Enabled: true, HotBytes: 64 << 20, SSDBytes: -1}},
		},
		{
			name: "prompt cache off",
			in: config.Model{Name: "t", Path: path, Settings: engine.Settings{ContextLength: 512, KVCacheType: "f16"}, Residency: "OnDemand", Memory: 1 << 20,
				PromptCache: &config.PromptCache{Enabled: ptr.To(false)}},
			want: enginepool.ModelSpec{Name: "t", Path: path, Engine: engine.Settings{ContextLength: 512, Parallel: 1, KVCacheType: "f16"},
				Residency: enginepool.OnDemand, EstimatedBytes: 1 << 20, Dims: dims},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := standalone.BuildSpec(context.Background(), tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if tt.estimated {
				if got.EstimatedBytes <= 0 {
					t.Errorf("estimate %d, want a positive figure from the header", got.EstimatedBytes)
				}
				tt.want.EstimatedBytes = got.EstimatedBytes
			}
			// The weights (for the thread policy) are read from the header.
			if got.WeightBytes <= 0 || got.WeightBytes > got.EstimatedBytes && tt.estimated {
				t.Errorf("weights %d, want a positive figure from the header within the estimate %d", got.WeightBytes, got.EstimatedBytes)
			}
			tt.want.WeightBytes = got.WeightBytes
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("spec (-want +got):\n%s", d)
			}
		})
	}
	// A larger context costs more memory.
	small, _ := standalone.BuildSpec(context.Background(), config.Model{Name: "s", Path: path, Settings: engine.Settings{ContextLength: 512, KVCacheType: "f16"}})
	large, _ := standalone.BuildSpec(context.Background(), config.Model{Name: "l", Path: path, Settings: engine.Settings{ContextLength: 16384, KVCacheType: "f16"}})
	if large.EstimatedBytes <= small.EstimatedBytes {
		t.Errorf("estimate for 16384 tokens %d <= for 512 tokens %d", large.EstimatedBytes, small.EstimatedBytes)
	}

	notGGUF := filepath.Join(t.TempDir(), "x.gguf")
	if err := os.WriteFile(notGGUF, []byte("not a model at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := standalone.BuildSpec(context.Background(), config.Model{Name: "x", Path: notGGUF}); err == nil ||
		!strings.Contains(err.Error(), `model "x"`) {
		t.Errorf("BuildSpec of a non-GGUF file: %v; want an error naming the model", err)
	}
}

// syncBuffer collects log lines from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) line(prefix, args string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintln(&s.b, prefix, args)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRunServesAndShutsDown runs the standalone agent on real runners: a Resident model
// loads at start (ready once it has), an OnDemand one on its first request; a signal
// (ctx) drains a stream in flight, unloads both with reports in the log, and leaves
// no runner behind.
func TestRunServesAndShutsDown(t *testing.T) {
	runner := os.Getenv(runnerproc.RunnerEnv)
	if runner == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	path := tinyModel(t)
	cfg, err := config.Config{
		Runner:        runner,
		RunnerThreads: 1,
		MemoryCeiling: 2 << 30,
		Listen:        "127.0.0.1:0",
		Models: []config.Model{
			{Name: "resident", Path: path, Settings: engine.Settings{ContextLength: 4096}, Residency: config.ResidencyResident},
			{Name: "lazy", Path: path, Settings: engine.Settings{ContextLength: 32768}},
		},
	}.Complete()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- standalone.Run(ctx, cfg, standalone.Options{
			Log:      funcr.New(logs.line, funcr.Options{}),
			Listener: ln,
			Pool:     enginepool.Config{DrainTimeout: time.Second, SettleTimeout: time.Second},
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			t.Error("Run did not return")
		}
	})

	get := func(path string) (int, []byte) {
		resp, err := http.Get(base + path)
		if err != nil {
			return 0, nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if code, _ := get("/readyz"); code == http.StatusOK {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned before it was ready: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after a minute:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	status := func() server.StatusResponse {
		_, b := get("/api/status")
		var s server.StatusResponse
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatalf("status %s: %v", b, err)
		}
		return s
	}
	states := map[string]enginepool.State{}
	s := status()
	for _, m := range s.Models {
		states[m.Name] = m.State
	}
	if d := cmp.Diff(map[string]enginepool.State{"resident": enginepool.StateReady, "lazy": enginepool.StateAbsent}, states); d != "" {
		t.Errorf("states once ready (-want +got):\n%s", d)
	}
	if s.Ceiling.Bound != enginepool.BoundConfigured || s.Ceiling.Bytes != 2<<30 {
		t.Errorf("ceiling %+v; want the configured 2Gi", s.Ceiling)
	}

	// The OnDemand model loads on its first request: a stream left running.
	body := `{"model":"lazy","stream":true,"max_tokens":30000,"temperature":0,"messages":[{"role":"user","content":"go on"}]}`
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if first, err := br.ReadString('\n'); resp.StatusCode != http.StatusOK || err != nil || !strings.HasPrefix(first, "data: {") {
		t.Fatalf("stream: %d %q %v", resp.StatusCode, first, err)
	}
	var pids []int
	for _, m := range status().Models {
		pids = append(pids, m.PID)
	}

	cancel() // SIGINT
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), `data: {"error"`) {
		t.Errorf("the stream in flight at shutdown ended without an error event; its tail: %q", tail(string(rest), 300))
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("Run did not return after shutdown:\n%s", logs.String())
	}
	done <- nil // for the cleanup
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("the API still answers after Run returned")
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
			t.Errorf("runner %d still exists after shutdown (kill 0: %v)", pid, err)
		}
	}
	out := logs.String()
	for _, want := range []string{
		`"msg"="Model loaded" "model"="resident"`, `"msg"="Model loaded" "model"="lazy"`,
		`"msg"="Model unloaded" "model"="resident" "reason"="shutdown"`,
		`"msg"="Model unloaded" "model"="lazy" "reason"="shutdown"`,
		`"msg"="Stopped"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, `"msg"="Model loaded"`) && !strings.Contains(l, `"residentBytes"=`) ||
			strings.Contains(l, `"msg"="Model unloaded"`) && !strings.Contains(l, `"freedBytes"=`) {
			t.Errorf("log line without measured bytes: %s", l)
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func TestRunRefusesBadSetups(t *testing.T) {
	path := tinyModel(t)
	junk := filepath.Join(t.TempDir(), "junk.gguf")
	if err := os.WriteFile(junk, []byte("no model here"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  config.Config
		want string
	}{
		{name: "runner missing", cfg: config.Config{Runner: filepath.Join(t.TempDir(), "nope"),
			Models: []config.Model{{Name: "m", Path: path}}}, want: "runner"},
		{name: "not a model", cfg: config.Config{Runner: "/bin/true",
			Models: []config.Model{{Name: "m", Path: junk}}}, want: `model "m"`},
		{name: "runner not executable", cfg: config.Config{Runner: junk,
			Models: []config.Model{{Name: "m", Path: path}}}, want: "not an executable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tt.cfg.Listen = "127.0.0.1:0"
			err := standalone.Run(ctx, tt.cfg, standalone.Options{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run = %v; want an error about %s", err, tt.want)
			}
		})
	}
}
