package clustermode_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/macfleet/macfleet/agent/janitor"
	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
	"github.com/macfleet/macfleet/test/support/testenv"
)

func fileSHA(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// The janitor removes the stored file of a replica deleted from this node once the
// retention has passed, keeps the file of the replica still bound however old it is,
// and removes the prompt cache directory of a model gone.
func TestJanitorRemovesTheFilesOfDeletedReplicas(t *testing.T) {
	second := filepath.Join(t.TempDir(), "second.gguf")
	spec := ggufsynth.Tiny()
	spec.Seed = 2
	if err := ggufsynth.Write(second, spec); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"/keep.gguf": tinyModel, "/gone.gguf": second}
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		http.ServeFile(w, r, p)
	}))
	t.Cleanup(origin.Close)

	// The store dates its files with a fake clock: stepping it ages them.
	clk := clocktesting.NewFakeClock(time.Now())
	storeDir := t.TempDir()
	var storeLog logBuffer
	st, err := store.New(storeDir, store.Options{Clock: clk, Policy: loopbackPolicy(t), Log: funcr.New(storeLog.line, funcr.Options{Verbosity: 2})})
	if err != nil {
		t.Fatal(err)
	}
	// The prompt cache directory of a model that left this Mac two days ago.
	cacheDir := t.TempDir()
	stale := filepath.Join(cacheDir, runnerproc.PromptCacheModelID(filepath.Join(storeDir, "blobs", "sha256-"+strings.Repeat("ab", 32))))
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, "state"), make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-48 * time.Hour)
	for _, p := range []string{filepath.Join(stale, "state"), stale} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}

	a := startAgent(t, agentOptions{store: st, promptCacheDir: cacheDir, janitor: janitor.Options{
		StoreRetention: time.Hour, PromptCacheRetention: 24 * time.Hour, Interval: 100 * time.Millisecond, FirstDelay: time.Millisecond}})
	ns := testenv.NewNamespace(t, env.Client)
	keepSHA, goneSHA := fileSHA(t, tinyModel), fileSHA(t, second)
	newReplica(t, ns, "keep-0", a.node, replicaOpts{deployment: "keep", source: origin.URL + "/keep.gguf", sha: keepSHA})
	gone := newReplica(t, ns, "gone-0", a.node, replicaOpts{deployment: "gone", source: origin.URL + "/gone.gguf"})
	for _, n := range []string{"keep-0", "gone-0"} {
		waitReplica(t, time.Minute, ns, n, func(mr *v1alpha1.ModelReplica) (bool, string) {
			return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady)
		})
	}
	keepBlob := filepath.Join(storeDir, "blobs", "sha256-"+keepSHA)
	goneBlob := filepath.Join(storeDir, "blobs", "sha256-"+goneSHA)
	for _, p := range []string{keepBlob, goneBlob} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("the stored model: %v", err)
		}
	}
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		_, err := os.Stat(stale)
		return os.IsNotExist(err), fmt.Sprintf("the stale prompt cache directory: %v", err)
	})

	if err := env.Client.Delete(t.Context(), gone); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		_, present := a.model(ns + "/gone-0")
		return !present, "the deleted replica's pool entry is still there"
	})
	// Passes run meanwhile: the deleted replica's file is young and stays.
	if _, err := os.Stat(goneBlob); err != nil {
		t.Fatalf("the deleted replica's file went before the retention: %v", err)
	}
	clk.Step(2 * time.Hour)
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		_, err := os.Stat(goneBlob)
		return os.IsNotExist(err), fmt.Sprintf("the deleted replica's file: %v", err)
	})
	if _, err := os.Stat(keepBlob); err != nil {
		t.Errorf("the bound replica's file: %v, want it kept", err)
	}
	if code, body := a.chat("keep", auth...); code != http.StatusOK {
		t.Errorf("chat with the bound replica after the prune: %d %s", code, body)
	}
	if !strings.Contains(storeLog.String(), "Pruned the model store") {
		t.Errorf("the store logged no prune:\n%s", storeLog.String())
	}
	resp, body := a.do(http.MethodGet, "/metrics", nil, auth...)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	for series, want := range map[string]float64{
		janitor.MetricGCRemoved + `{kind="blob"}`:             1,
		janitor.MetricGCFreed + `{kind="blob"}`:               float64(sizeOf(t, second)),
		janitor.MetricGCRemoved + `{kind="prompt_cache_dir"}`: 1,
		janitor.MetricGCFreed + `{kind="prompt_cache_dir"}`:   4096,
	} {
		if got, ok := metricValue(string(body), series); !ok || got != want {
			t.Errorf("%s = %v (found %v), want %v:\n%s", series, got, ok, want, grepLines(string(body), "macfleet_agent_gc_"))
		}
	}
}

func sizeOf(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// metricValue finds a series in a Prometheus text exposition.
func metricValue(body, series string) (float64, bool) {
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
