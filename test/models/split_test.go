package models_test

import (
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/listening"
	"github.com/macfleet/macfleet/test/support/syncbuf"
)

// splitWorker is one `macfleet-runner worker` process on a loopback port, killed at
// the test's end.
type splitWorker struct {
	addr   string
	stderr *syncbuf.Buffer
}

// startSplitWorker starts bin as a split worker on model and waits for its listener.
func startSplitWorker(t *testing.T, bin, model string) *splitWorker {
	t.Helper()
	p := listening.Start(t, "split worker", exec.Command(bin, "worker", "--listen", "127.0.0.1:0", "--model", model, "--threads", "1"))
	return &splitWorker{addr: p.Addr, stderr: p.Stderr}
}

// splitRefused are the families a split runner refuses to load, with what its error
// says; the others split.
var splitRefused = map[ggufsynth.Family]string{
	// The worker does not compute the gated delta-net layers' graph: before the
	// refusal the runner loaded and then lost the worker at its first decode.
	ggufsynth.Qwen3Next: "a split of this model is refused: its recurrent layers keep a state beside the attention cache (qwen3next)",
}

// checkSplitRefused starts bin on model with layers of it on the worker at addr and
// checks that it fails its load (exit code 3) naming why.
func checkSplitRefused(t *testing.T, bin, model, addr string, layers int, why string) {
	t.Helper()
	cmd := exec.Command(bin, "--model", model, "--threads", "1", "--addr", "127.0.0.1:0", "--split-worker", addr,
		"--split-layers", strconv.Itoa(layers))
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 3 || !strings.Contains(stderr.String(), why) {
			t.Errorf("split runner ended with %v, want exit code 3 and an error saying %q; stderr:\n%s", err, why, stderr.String())
		}
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("the split runner of a model it cannot split did not fail its load; stderr:\n%s", stderr.String())
	}
}

// TestSplitPerFamily splits each family's tiny model two ways, its last layers on a
// worker over the split link (a MoE's experts and a window's local layers among
// them), and checks that the head runner answers token for token as the model in one
// process does, to prompt and to other (whose answers differ, so that the comparison
// can fail), and that the worker computed its layers; a family in splitRefused fails
// its load with the reason instead of answering.
func TestSplitPerFamily(t *testing.T) {
	eachFamily(t, func(t *testing.T, bin string, m tinyModel) {
		one := startRunner(t, bin, m.path)
		want := []string{one.greedy(prompt), one.greedy(other)}
		one.stop()
		if want[0] == want[1] {
			t.Fatalf("the answers to two prompts are alike (%q): a comparison could not fail", want[0])
		}
		layers := m.spec.Layers / 2
		w := startSplitWorker(t, bin, m.path)
		if why := splitRefused[m.family]; why != "" {
			checkSplitRefused(t, bin, m.path, w.addr, layers, why)
			return
		}
		head := startRunner(t, bin, m.path, "--split-worker", w.addr, "--split-layers", strconv.Itoa(layers))
		got := []string{head.greedy(prompt), head.greedy(other)}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("answer %d split two ways %q, in one process %q", i, got[i], want[i])
			}
		}
		st := head.status()
		if len(st.Split) != 1 || st.Split[0].Layers != layers || st.Split[0].FirstLayer != m.spec.Layers-layers ||
			st.Split[0].Computes == 0 || st.Split[0].Error != "" {
			t.Errorf("split status %+v, want one worker computing layers %d to %d", st.Split, m.spec.Layers-layers, m.spec.Layers-1)
		}
		t.Logf("%s: %d of %d layers on the worker; answers %q; worker %+v", m.family, layers, m.spec.Layers, got, st.Split)
	})
}
