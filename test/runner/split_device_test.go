package e2e

import (
	"encoding/json"
	"errors"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/test/support/syncbuf"
)

// TestSplitWorkerReportsItsDevice: a worker tells the runner the ggml device it
// computes with, and the runner's /status shows it per worker. On this CPU-only host a
// worker left to choose (--device auto, the default) and one told --device cpu both
// compute on the CPU, and the split answers as one process.
func TestSplitWorkerReportsItsDevice(t *testing.T) {
	if runtime.GOOS != "linux" || gpuSuite() {
		t.Skip("expects a host whose ggml has no GPU (Linux): a Mac's or a GPU host's auto worker computes on its GPU")
	}
	m := specModel(t, "split-seed3", splitSpec(3))
	const prompt, maxTokens = "Tell me a story about the sea.", 24
	one := startReady(t, m)
	want := greedyWhole(t, one, prompt, maxTokens)
	one.stop()

	workers := []*worker{startWorker(t, m), startWorker(t, m, "--device", "cpu")}
	for i, w := range workers {
		if !strings.Contains(w.stderr.String(), "computing on CPU (CPU)") {
			t.Errorf("worker %d's log does not name its device: %q", i, w.stderr.String())
		}
	}
	r := startReady(t, m, splitFlags(workers, 2, 2)...)
	sameTokens(t, prompt, greedyWhole(t, r, prompt, maxTokens), want)

	// The field as it is on the wire, not only as runnerapi decodes it.
	var raw struct {
		Split []map[string]json.RawMessage `json:"split"`
	}
	if code, err := r.getJSON("/status", &raw); err != nil || code != 200 {
		t.Fatalf("GET /status: %d %v", code, err)
	}
	if len(raw.Split) != len(workers) {
		t.Fatalf("/status lists %d split workers, want %d", len(raw.Split), len(workers))
	}
	for i, ws := range raw.Split {
		var dev runnerapi.SplitWorkerDevice
		if err := json.Unmarshal(ws["device"], &dev); err != nil {
			t.Fatalf("split worker %d's device %s: %v", i, ws["device"], err)
		}
		if want := (runnerapi.SplitWorkerDevice{Type: "CPU", Name: "CPU"}); dev != want {
			t.Errorf("split worker %d's device is %+v (%s), want %+v", i, dev, ws["device"], want)
		}
	}
}

// TestSplitWorkerDeviceFlag: a worker refuses an unknown --device value as a flag
// error (exit 2), and --device gpu on a host without a GPU fails at start (exit 1),
// each with a message naming the problem, before it listens.
func TestSplitWorkerDeviceFlag(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	for _, tc := range []struct {
		name, device string
		code         int
		want         string
		linuxOnly    bool
	}{
		{name: "unknown", device: "metal", code: 2, want: `--device: unknown device "metal": want auto, cpu or gpu`},
		{name: "empty", device: "", code: 2, want: `--device: unknown device "": want auto, cpu or gpu`},
		{name: "no GPU", device: "gpu", code: 1, want: "--device gpu: no GPU device is registered", linuxOnly: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.linuxOnly && (runtime.GOOS != "linux" || gpuSuite()) {
				t.Skip("expects a host whose ggml has no GPU (Linux)")
			}
			cmd := exec.Command(runnerBinary(t), "worker", "--listen", "127.0.0.1:0", "--model", m, "--device", tc.device)
			var stdout, stderr syncbuf.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("the worker with --device %q still runs after 30s; stdout %q, stderr %q", tc.device, stdout.String(), stderr.String())
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != tc.code {
				t.Errorf("the worker with --device %q ended with %v, want exit code %d", tc.device, err, tc.code)
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("the worker's stderr %q does not contain %q", stderr.String(), tc.want)
			}
			if stdout.String() != "" {
				t.Errorf("the worker announced a listener: %q", stdout.String())
			}
		})
	}
}
