package estimate

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/internal/modelsource"
)

// fuzzSeeds are a real header and crafted ones, each limit's bomb among them.
func fuzzSeeds(f *testing.F) {
	dir := f.TempDir()
	p := filepath.Join(dir, "tiny.gguf")
	if err := ggufsynth.Write(p, ggufsynth.Tiny()); err != nil {
		f.Fatal(err)
	}
	whole, err := os.ReadFile(p)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(whole[:32<<10]) // the header and tensor infos, without most of the weights
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	f.Add(new(ggufsynth.Raw).StringLen("general.name", 3<<30, nil).Bytes())
	f.Add(new(ggufsynth.Raw).String("general.architecture", "llama").Uint64("llama.block_count", 1<<40).
		Uint32("llama.embedding_length", 64).Tensor("token_embd.weight", 0, 64, 16).Bytes())
	f.Add(new(ggufsynth.Raw).ArrayLen("llama.feed_forward_length", ggufsynth.RawUint32, 1<<40, nil).Bytes())
	f.Add((&ggufsynth.Raw{DeclaredKVs: 1 << 40}).Bytes())
}

// checkEstimate: an estimate either fails with one of the estimator's typed errors or
// has parts that add up.
func checkEstimate(t *testing.T, r Result, err error) {
	t.Helper()
	if err != nil {
		var (
			notGGUF *NotGGUFError
			parse   *ParseError
			unsup   *UnsupportedModelError
			unreach *modelsource.UnreachableError
		)
		if !errors.As(err, &notGGUF) && !errors.As(err, &parse) && !errors.As(err, &unsup) && !errors.As(err, &unreach) {
			t.Fatalf("Estimate: %T %v, want a NotGGUFError, ParseError, UnsupportedModelError or UnreachableError", err, err)
		}
		return
	}
	if r.Total <= 0 || r.Total != r.Weights+r.KVCache+r.Compute+r.Overhead {
		t.Fatalf("estimate %+v: the total is not the sum of its positive parts", r)
	}
}

// FuzzEstimateLocal: any file given as a model either fails with one of the
// estimator's typed errors or gives an estimate whose parts add up, never a panic (a
// GGUF header comes from whoever published the model).
func FuzzEstimateLocal(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "m.gguf")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := Estimate(t.Context(), Params{Path: path, ContextLength: 512})
		checkEstimate(t, r, err)
	})
}

// FuzzEstimateRemote: the same for a model server that answers range requests with
// the input followed by zeros, for a file it says is 64 GiB (so that nothing is
// bounded by the file's real size), and reading it allocates at most a few times
// the limits' largest single allowance (a string of MaxStringBytes), whatever the
// header declares.
func FuzzEstimateRemote(f *testing.F) {
	fuzzSeeds(f)
	var cur atomic.Pointer[[]byte]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "m.gguf", time.Time{}, io.NewSectionReader(&remoteHeader{bytes: *cur.Load(), size: 64 << 30}, 0, 64<<30))
	}))
	defer srv.Close()
	f.Fuzz(func(t *testing.T, data []byte) {
		cur.Store(&data)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		r, err := Estimate(t.Context(), Params{URL: srv.URL + "/m.gguf", ContextLength: 512})
		runtime.ReadMemStats(&after)
		checkEstimate(t, r, err)
		if a := after.TotalAlloc - before.TotalAlloc; !raceEnabled && a > 4*Limits.MaxStringBytes+uint64(Limits.MaxHeaderBytes) {
			t.Fatalf("reading a %d-byte header allocated %d MiB", len(data), a>>20)
		}
	})
}
