package estimate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/listening"
)

// maxRatio is how far above the measured peak a first estimate may be (issue 10).
const maxRatio = 1.3

// footprintCase is a model and the engine settings it is estimated and run with.
type footprintCase struct {
	spec ggufsynth.Spec
	// ctx is the total context of parallel slots (1 when 0).
	ctx      int32
	parallel int32
	kv       KVCacheType
}

// footprintCases are the synthesized presets and GGUFs with the shapes of real
// architectures: grouped-query attention at Llama 3's 4:1 with an untied output
// projection (output.weight, as in the 8B models), and quantized weights with a tied
// output (as the small Llama 3.2, Qwen and Gemma models ship), one of them with a
// quantized KV cache (flash attention).
func footprintCases() []footprintCase {
	q8 := ggufsynth.Small()
	q8.Name, q8.DType = "small-q8_0", ggufsynth.Q8_0
	q4 := ggufsynth.Small()
	q4.Name, q4.DType = "small-q4_0", ggufsynth.Q4_0
	return []footprintCase{
		{spec: ggufsynth.Tiny(), ctx: 2048},
		{spec: ggufsynth.Small(), ctx: 2048},
		{spec: ggufsynth.Mid(), ctx: 1024},
		{spec: ggufsynth.Spec{Name: "gqa-untied", Vocab: 8192, Embd: 512, Layers: 4, Heads: 8, KVHeads: 2,
			FF: 1408, Ctx: 2048, DType: ggufsynth.F16, Seed: 1, Untied: true}, ctx: 2048},
		{spec: q8, ctx: 2048},
		{spec: q4, ctx: 2048, kv: KVQ8_0},
	}
}

// The first estimate of every case is at least the peak footprint its runner reaches
// under the heaviest work it accepts, and at most maxRatio times it. The peak is the
// kernel's high-water mark of the runner's resident memory (VmHWM; the runner's CPU
// backend here) after a prompt that fills the context — every micro-batch full, the
// attention mask at its widest — and an embedding input, whose every token is an
// output row.
func TestEstimateCoversMeasuredPeak(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the peak is read from /proc/PID/status")
	}
	bin := os.Getenv("MACFLEET_RUNNER")
	if bin == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner`")
	}
	for _, tc := range footprintCases() {
		t.Run(tc.spec.Name, func(t *testing.T) {
			path := model(t, tc.spec)
			est, err := Estimate(t.Context(), Params{Path: path, ContextLength: tc.ctx, Parallel: tc.parallel, KVCacheType: tc.kv})
			if err != nil {
				t.Fatal(err)
			}
			peak := measurePeak(t, bin, path, tc)
			ratio := float64(est.Total) / float64(peak)
			t.Logf("%s ctx %d parallel %d kv %s: estimate %.1f MiB (weights %.1f, kv %.1f, compute %.1f, overhead %.1f), measured peak %.1f MiB: %.2fx",
				tc.spec.Name, tc.ctx, est.Parallel, est.KVCacheType, mib(est.Total), mib(est.Weights), mib(est.KVCache), mib(est.Compute),
				mib(est.Overhead), mib(peak), ratio)
			if est.Total < peak {
				t.Errorf("estimate %d bytes is below the measured peak %d: the enforcer would find the runner over its reservation", est.Total, peak)
			}
			if ratio > maxRatio {
				t.Errorf("estimate is %.2fx the measured peak, want at most %.1fx", ratio, maxRatio)
			}
		})
	}
}

// measurePeak runs the runner on path with tc's settings, fills the context of one
// slot with a prompt, embeds an input of two embedding chunks, and returns its peak
// resident bytes.
func measurePeak(t *testing.T, bin, path string, tc footprintCase) int64 {
	t.Helper()
	args := []string{"--model", path, "--addr", "127.0.0.1:0", "--threads", "1", "--ctx", strconv.Itoa(int(tc.ctx)), "--parallel", strconv.Itoa(int(max(tc.parallel, 1)))}
	if tc.kv != "" {
		args = append(args, "--kv-type", string(tc.kv))
	}
	cmd := exec.Command(bin, args...)
	p := listening.Start(t, "runner", cmd)
	base, exited := "http://"+p.Addr, p.Exited
	waitReady(t, base, exited)

	// The slot's whole context but the generated tokens.
	const generate = 8
	post(t, base+"/v1/completions", map[string]any{
		"prompt": tokens(tc.spec, int(tc.ctx/max(tc.parallel, 1))-generate-1), "max_tokens": generate, "temperature": 0,
	})
	post(t, base+"/v1/embeddings", map[string]any{"input": [][]int{tokens(tc.spec, 2*runnerapi.EmbedChunk)}})
	return peakRSS(t, cmd.Process.Pid)
}

// tokens is n ordinary token ids of spec's vocabulary.
func tokens(spec ggufsynth.Spec, n int) []int {
	ids := make([]int, n)
	span := spec.Vocab - ggufsynth.FirstNormalToken
	for i := range ids {
		ids[i] = ggufsynth.FirstNormalToken + (i*7919)%span
	}
	return ids
}

func waitReady(t *testing.T, base string, exited <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if resp, err := http.Get(base + "/health"); err == nil {
			var h runnerapi.Health
			err := json.NewDecoder(resp.Body).Decode(&h)
			_ = resp.Body.Close()
			if err == nil && h.Status == runnerapi.StateReady {
				return
			}
			if h.Status == runnerapi.StateFailed {
				t.Fatalf("the runner failed to load: %s", h.Error)
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the runner was not ready within 2m")
		}
		select {
		case <-exited:
			t.Fatal("the runner exited while loading")
		case <-tick.C:
		}
	}
}

func post(t *testing.T, url string, body any) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s: %s", url, resp.Status, out.String())
	}
}

// peakRSS is the VmHWM line of /proc/PID/status: the most the process ever held
// resident, in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "VmHWM:" && f[2] == "kB" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}
