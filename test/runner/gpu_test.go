package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// The GPU suite (hack/test-gpu.sh runs it on a machine with an accelerator, with the
// backend libraries in the folder lib beside $MACFLEET_RUNNER): each test here skips
// unless MACFLEET_TEST_GPU=1. The rest of the package runs there as well, every
// runner on the GPU; the tests that assume a host without one skip (gpuSuite).

// gpuTolerance is how close the CPU's two best tokens may be for the GPU to choose the
// other: the GPU sums in another order (and the CUDA backend multiplies F16 and
// quantized weights in F16 or 8-bit activations), which moves a logit by a few
// hundredths; a wrong offload (a layer's KV on the wrong device, a missed copy) moves
// it by far more.
const gpuTolerance = 0.25

// gpuSuite is true when the package runs as the GPU suite.
func gpuSuite() bool { return os.Getenv("MACFLEET_TEST_GPU") == "1" }

func requireGPU(t *testing.T) {
	t.Helper()
	if !gpuSuite() {
		t.Skip("MACFLEET_TEST_GPU is not 1: the GPU suite runs on a machine with an accelerator (hack/test-gpu.sh)")
	}
}

// cpuOnly are the flags of a runner that computes on the CPU alone: a backend
// directory with no backend in it.
func cpuOnly(t *testing.T) []string { return []string{"--backend-dir", t.TempDir()} }

// TestGPUOffloadsEveryLayer: with the backend beside it a runner registers the GPU,
// offloads every layer (its own device buffers hold at least the model's weights) and
// reports them apart from its footprint, the card having memory of its own.
func TestGPUOffloadsEveryLayer(t *testing.T) {
	requireGPU(t)
	for _, preset := range []string{"tiny", "small"} {
		t.Run(preset, func(t *testing.T) {
			m := model(t, preset)
			r := startReady(t, m, "--ctx", "2048", "--parallel", "2")
			st := r.status()
			if len(st.Accelerators) == 0 {
				t.Fatalf("the runner registered no accelerator; backends: %q", st.Backends)
			}
			if !strings.Contains(st.Backends, "loaded (") {
				t.Errorf("backends %q name no loaded library", st.Backends)
			}
			fi, err := os.Stat(m)
			if err != nil {
				t.Fatal(err)
			}
			// The file also holds the vocabulary and metadata; the weights are most of it.
			if st.DeviceBytes < fi.Size()*8/10 {
				t.Errorf("device bytes %d for a %d-byte model: not every layer is on the GPU", st.DeviceBytes, fi.Size())
			}
			if !st.DeviceMemorySeparate {
				t.Errorf("device memory reported as unified on %s", runtime.GOOS)
			}
			used := st.Accelerators[0].TotalBytes - st.Accelerators[0].FreeBytes
			if used < st.DeviceBytes {
				t.Errorf("the card reports %d bytes in use, less than the runner's own %d", used, st.DeviceBytes)
			}
			t.Logf("%s on %s (%s): device %d MiB, footprint %d MiB, card in use %d MiB of %d MiB", preset,
				st.Accelerators[0].Name, st.Accelerators[0].Description, st.DeviceBytes>>20, st.FootprintBytes>>20,
				used>>20, st.Accelerators[0].TotalBytes>>20)
		})
	}
}

// TestGPUGreedyMatchesCPU: the GPU's greedy answer is the CPU's token for token,
// except after a step where the CPU's two best tokens were within gpuTolerance.
func TestGPUGreedyMatchesCPU(t *testing.T) {
	requireGPU(t)
	prompts := []string{"Tell me a story about the sea.", "List three colours and a number.", "Why is the sky blue?"}
	for _, preset := range []string{"tiny", "small"} {
		t.Run(preset, func(t *testing.T) {
			m := model(t, preset)
			cpu := startReady(t, m, cpuOnly(t)...)
			if st := cpu.status(); len(st.Accelerators) != 0 || st.DeviceBytes != 0 {
				t.Fatalf("the CPU reference registered %v, %d device bytes", st.Accelerators, st.DeviceBytes)
			}
			var want [][]runnerapi.TokenLogprob
			for _, p := range prompts {
				want = append(want, soloGreedy(t, cpu, p, 48))
			}
			cpu.stop()
			gpu := startReady(t, m)
			compared := 0
			for i, p := range prompts {
				got := soloGreedy(t, gpu, p, 48)
				if d := departureWithin(want[i], got, gpuTolerance); d != "" {
					t.Errorf("%q on the GPU %s", p, d)
				}
				compared += len(got)
			}
			t.Logf("%s: %d greedy tokens compared", preset, compared)
		})
	}
}

// TestGPUSplitHeadAndWorker: a split replica whose head keeps its layers on the GPU and
// whose worker computes on the GPU (--device gpu; two processes on one card) answers
// token for token as one GPU process.
func TestGPUSplitHeadAndWorker(t *testing.T) {
	requireGPU(t)
	m := specModel(t, "split-seed3", splitSpec(3))
	const prompt, maxTokens = "Tell me a story about the sea.", 24
	one := startReady(t, m)
	want := greedyWhole(t, one, prompt, maxTokens)
	one.stop()
	w := startWorker(t, m, "--device", "gpu")
	if s := w.stderr.String(); !strings.Contains(s, "computing on CUDA") && !strings.Contains(s, "(GPU)") {
		t.Fatalf("the worker does not compute on the GPU: %q", s)
	}
	r := startReady(t, m, splitFlags([]*worker{w}, 3)...)
	sameTokens(t, prompt, greedyWhole(t, r, prompt, maxTokens), want)
	if st := r.status(); st.DeviceBytes == 0 {
		t.Errorf("the split head holds nothing on the GPU (its own layers belong there)")
	}
}

// TestBackendDirEmpty: a runner whose backend directory holds no backend computes on
// its compiled-in backends and says so once, in its log and in /status.
func TestBackendDirEmpty(t *testing.T) {
	dir := t.TempDir()
	r := startReady(t, model(t, "tiny"), "--backend-dir", dir)
	want := "no accelerator backend in " + dir
	if st := r.status(); !strings.Contains(st.Backends, want) {
		t.Errorf("/status backends %q, want it to say %q", st.Backends, want)
	}
	if n := strings.Count(r.stderr.String(), want); n != 1 {
		t.Errorf("the log says %q %d times, want once:\n%s", want, n, tail(r.stderr.String(), 2000))
	}
	if c := completeText(t, r, "Hello", 4, nil); len(c.Choices) != 1 {
		t.Errorf("completion on the CPU: %+v", c)
	}
}

// TestBackendDirBroken: libraries that are not usable backends (garbage bytes, a
// real shared library that is no ggml backend) are named with the loader's reason
// and skipped, ggml's own base and CPU libraries are not backends at all, and the
// runner serves on the CPU.
func TestBackendDirBroken(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("builds Linux shared-library names")
	}
	dir := t.TempDir()
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Longer than an ELF header, so that the loader reads it and names what is wrong.
	write("libggml-garbage.so", []byte(strings.Repeat("this is not an ELF file\n", 100)))
	write("libggml-base.so", []byte("never opened: ggml's base library"))
	write("libggml-cpu-haswell.so", []byte("never opened: the runner's CPU backend is compiled in"))
	// A real shared library of the system: it loads, but holds no ggml backend.
	libs, _ := filepath.Glob("/usr/lib/*-linux-gnu/libz.so.1")
	if len(libs) == 0 {
		libs, _ = filepath.Glob("/lib/*-linux-gnu/libm.so.6")
	}
	if len(libs) > 0 {
		b, err := os.ReadFile(libs[0])
		if err != nil {
			t.Fatal(err)
		}
		write("libggml-system.so", b)
	}
	r := startReady(t, model(t, "tiny"), "--backend-dir", dir)
	st := r.status()
	for _, want := range []string{"libggml-garbage.so not loaded: ", "invalid ELF header"} {
		if !strings.Contains(st.Backends, want) {
			t.Errorf("/status backends %q, want %q", st.Backends, want)
		}
	}
	if len(libs) > 0 && !strings.Contains(st.Backends, "libggml-system.so not loaded: no ggml_backend_init symbol") {
		t.Errorf("/status backends %q does not name the library without a backend", st.Backends)
	}
	for _, never := range []string{"libggml-base.so", "libggml-cpu-haswell.so"} {
		if strings.Contains(st.Backends, never) {
			t.Errorf("/status backends %q names %s, which is no backend", st.Backends, never)
		}
	}
	if len(st.Accelerators) != 0 {
		t.Errorf("accelerators %v from broken libraries", st.Accelerators)
	}
	if code := r.postJSON("/v1/chat/completions", chatBody("Hi", 4, false), nil); code != http.StatusOK {
		t.Errorf("chat on the CPU beside broken backends: status %d", code)
	}
}
