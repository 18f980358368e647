package estimate

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// models are synthesized once per test binary into one temp dir.
var (
	modelsOnce sync.Once
	modelsDir  string
	modelsErr  error
)

func model(t *testing.T, spec ggufsynth.Spec) string {
	t.Helper()
	modelsOnce.Do(func() { modelsDir, modelsErr = os.MkdirTemp("", "estimate-test-") })
	if modelsErr != nil {
		t.Fatal(modelsErr)
	}
	p := filepath.Join(modelsDir, spec.Name+".gguf")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if err := ggufsynth.Write(p, spec); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMain(m *testing.M) {
	code := m.Run()
	if modelsDir != "" {
		_ = os.RemoveAll(modelsDir)
	}
	os.Exit(code)
}

// fileServer serves one file with http.ServeContent (which answers HEAD and range
// requests) and counts what it was asked for and what it sent.
type fileServer struct {
	*httptest.Server
	requests    atomic.Int64
	ranged      atomic.Int64
	bytesSent   atomic.Int64
	ignoreRange bool
	// dropRanged, when positive, is the ranged request (counting from 1) whose
	// connection the server drops 16 bytes into its answer.
	dropRanged int64
}

func serveFile(t *testing.T, path string) *fileServer {
	t.Helper()
	fsrv := &fileServer{}
	fsrv.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fsrv.requests.Add(1)
		if r.Header.Get("Range") != "" {
			if n := fsrv.ranged.Add(1); n == fsrv.dropRanged {
				w = &cutWriter{ResponseWriter: w, left: 16}
			}
		}
		if fsrv.ignoreRange {
			r.Header.Del("Range")
			w = noRanges{w}
		}
		f, err := os.Open(path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer f.Close()
		fi, _ := f.Stat()
		cw := &countingWriter{ResponseWriter: w, n: &fsrv.bytesSent}
		http.ServeContent(cw, r, filepath.Base(path), fi.ModTime(), f)
	}))
	t.Cleanup(fsrv.Close)
	return fsrv
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// cutWriter drops the connection once left bytes are written: the client has its
// answer's head and a short body, as when a connection is lost mid-answer.
type cutWriter struct {
	http.ResponseWriter
	left int
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if len(p) > c.left {
		_, _ = c.ResponseWriter.Write(p[:c.left])
		http.NewResponseController(c.ResponseWriter).Flush()
		panic(http.ErrAbortHandler)
	}
	c.left -= len(p)
	return c.ResponseWriter.Write(p)
}

// noRanges hides the Accept-Ranges header ServeContent would set.
type noRanges struct{ http.ResponseWriter }

func (n noRanges) WriteHeader(code int) {
	n.Header().Del("Accept-Ranges")
	n.ResponseWriter.WriteHeader(code)
}

// kvBytes is the KV cache of spec for ctx cells: 2 × layers × kvHeads × headDim × ctx
// elements, each of bytesPerElem (f16 2; q8_0 34/32; q4_0 18/32).
func kvBytes(spec ggufsynth.Spec, ctx int64, kv KVCacheType) int64 {
	elems := 2 * int64(spec.Layers) * int64(spec.KVHeads) * int64(spec.HeadDim()) * ctx
	switch kv {
	case KVQ8_0:
		return elems / 32 * 34
	case KVQ4_0:
		return elems / 32 * 18
	}
	return elems * 2
}

func TestKVCacheMatchesFormula(t *testing.T) {
	for _, spec := range []ggufsynth.Spec{ggufsynth.Tiny(), ggufsynth.Small()} {
		path := model(t, spec)
		srv := serveFile(t, path)
		for _, tc := range []struct {
			ctx int32
			kv  KVCacheType
		}{
			{2048, KVF16}, {4096, KVF16}, {8192, ""}, {32768, KVF16},
			{4096, KVQ8_0}, {4096, KVQ4_0}, {16384, KVQ8_0},
		} {
			for _, where := range []string{"local", "remote"} {
				t.Run(fmt.Sprintf("%s/ctx=%d/kv=%s/%s", spec.Name, tc.ctx, tc.kv, where), func(t *testing.T) {
					p := Params{ContextLength: tc.ctx, Parallel: 2, KVCacheType: tc.kv}
					if where == "local" {
						p.Path = path
					} else {
						p.URL = srv.URL + "/model.gguf"
					}
					r, err := Estimate(t.Context(), p)
					if err != nil {
						t.Fatal(err)
					}
					if want := kvBytes(spec, int64(tc.ctx), tc.kv); r.KVCache != want {
						t.Errorf("KVCache = %d, want 2×%d layers×%d kv heads×%d head dim×%d ctx×elem = %d",
							r.KVCache, spec.Layers, spec.KVHeads, spec.HeadDim(), tc.ctx, want)
					}
					if r.ContextLength != int64(tc.ctx) {
						t.Errorf("ContextLength = %d, want %d", r.ContextLength, tc.ctx)
					}
					if sum := r.Weights + r.KVCache + r.Compute + r.Overhead; r.Total != sum {
						t.Errorf("Total %d != Weights+KVCache+Compute+Overhead %d", r.Total, sum)
					}
					if r.Weights < r.FileSize/2 || r.Overhead <= 0 || r.Compute <= 0 {
						t.Errorf("implausible breakdown %+v", r)
					}
					// Quantized V needs flash attention; llama.cpp turns it on by itself
					// where Metal has a kernel for the head size (32 and 64 here).
					if !r.FlashAttention {
						t.Errorf("FlashAttention = %v for kv %q", r.FlashAttention, tc.kv)
					}
				})
			}
		}
	}
}

func TestDims(t *testing.T) {
	spec := ggufsynth.Mid()
	r, err := Estimate(t.Context(), Params{Path: model(t, spec), ContextLength: 4096})
	if err != nil {
		t.Fatal(err)
	}
	want := Dims{
		Architecture: "llama", Layers: int64(spec.Layers), Heads: int64(spec.Heads), KVHeads: int64(spec.KVHeads),
		HeadDimK: int64(spec.HeadDim()), HeadDimV: int64(spec.HeadDim()), Embd: int64(spec.Embd),
		Vocab: int64(spec.Vocab), CtxTrain: int64(spec.Ctx), Params: spec.Params(),
	}
	if diff := cmp.Diff(want, r.Dims); diff != "" {
		t.Errorf("Dims mismatch (-want +got):\n%s", diff)
	}
	if want := kvBytes(spec, 4096, KVF16); r.KVCache != want {
		t.Errorf("KVCache = %d, want %d", r.KVCache, want)
	}
	fi, _ := os.Stat(model(t, spec))
	if r.FileSize != fi.Size() {
		t.Errorf("FileSize = %d, want %d", r.FileSize, fi.Size())
	}
	// Every tensor once: the tied output projection is the token embedding itself.
	// Matrices are f16, the norm vectors f32.
	norms := int64(spec.Embd) * int64(1+2*spec.Layers)
	if want := 2*(spec.Params()-norms) + 4*norms; r.Weights != want {
		t.Errorf("Weights = %d, want the tensors' %d bytes", r.Weights, want)
	}
	t.Logf("mid: total %.1f MiB = weights %.1f + kv %.1f + compute %.1f + overhead %.1f (file %.1f MiB)",
		mib(r.Total), mib(r.Weights), mib(r.KVCache), mib(r.Compute), mib(r.Overhead), mib(r.FileSize))
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// The default context is the model's training context.
func TestDefaults(t *testing.T) {
	spec := ggufsynth.Tiny()
	r, err := Estimate(t.Context(), Params{Path: model(t, spec)})
	if err != nil {
		t.Fatal(err)
	}
	if r.ContextLength != int64(spec.Ctx) || r.Parallel != 1 || r.KVCacheType != KVF16 {
		t.Errorf("defaults: ctx %d parallel %d kv %q, want %d, 1, f16", r.ContextLength, r.Parallel, r.KVCacheType, spec.Ctx)
	}
	if want := kvBytes(spec, int64(spec.Ctx), KVF16); r.KVCache != want {
		t.Errorf("KVCache = %d, want %d", r.KVCache, want)
	}
}

func TestGrowsWithContextNotParallel(t *testing.T) {
	path := model(t, ggufsynth.Small())
	est := func(ctx, par int32) Result {
		t.Helper()
		r, err := Estimate(t.Context(), Params{Path: path, ContextLength: ctx, Parallel: par})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	prev := est(1024, 1)
	for _, ctx := range []int32{2048, 4096, 8192, 16384} {
		r := est(ctx, 1)
		if r.Total <= prev.Total || r.KVCache <= prev.KVCache {
			t.Errorf("ctx %d: total %d kv %d, not above ctx/2: total %d kv %d", ctx, r.Total, r.KVCache, prev.Total, prev.KVCache)
		}
		prev = r
	}
	// contextLength is the total context shared by the slots (llama.cpp n_ctx), so more
	// slots never shrink the estimate and do not multiply the KV cache.
	base := est(8192, 1)
	for _, par := range []int32{2, 4, 16} {
		r := est(8192, par)
		if r.Total < base.Total || r.KVCache != base.KVCache {
			t.Errorf("parallel %d: total %d kv %d; parallel 1: total %d kv %d", par, r.Total, r.KVCache, base.Total, base.KVCache)
		}
	}
}

// A remote estimate reads the header with range requests: a few MiB of a 175 MiB model.
// TestRemoteReadSurvivesADroppedRequest: one range request of the header's read losing
// its connection is read again, not reported as a corrupt header.
func TestRemoteReadSurvivesADroppedRequest(t *testing.T) {
	path := model(t, ggufsynth.Mid())
	local, err := Estimate(t.Context(), Params{Path: path, ContextLength: 8192, Parallel: 4})
	if err != nil {
		t.Fatal(err)
	}
	srv := serveFile(t, path)
	srv.dropRanged = 1
	remote, err := Estimate(t.Context(), Params{URL: srv.URL + "/mid.gguf", ContextLength: 8192, Parallel: 4})
	if err != nil {
		t.Fatalf("a dropped range request failed the estimate: %v", err)
	}
	if diff := cmp.Diff(local, remote); diff != "" {
		t.Errorf("remote and local estimates differ (-local +remote):\n%s", diff)
	}
	if n := srv.ranged.Load(); n < 2 {
		t.Errorf("the server saw %d ranged requests: the dropped one was not read again", n)
	}
}

func TestRemoteUsesRangeRequests(t *testing.T) {
	path := model(t, ggufsynth.Mid())
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := serveFile(t, path)
	remote, err := Estimate(t.Context(), Params{URL: srv.URL + "/mid.gguf", ContextLength: 8192, Parallel: 4})
	if err != nil {
		t.Fatal(err)
	}
	local, err := Estimate(t.Context(), Params{Path: path, ContextLength: 8192, Parallel: 4})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(local, remote); diff != "" {
		t.Errorf("remote and local estimates differ (-local +remote):\n%s", diff)
	}
	sent, reqs, ranged := srv.bytesSent.Load(), srv.requests.Load(), srv.ranged.Load()
	t.Logf("served %d of %d bytes (%.2f%%) in %d requests, %d with Range", sent, fi.Size(), 100*float64(sent)/float64(fi.Size()), reqs, ranged)
	if ranged == 0 {
		t.Errorf("the server saw no Range header in %d requests", reqs)
	}
	if sent > fi.Size()/20 {
		t.Errorf("served %d bytes of a %d byte model, want under 5%%", sent, fi.Size())
	}
}

func TestErrors(t *testing.T) {
	tiny := model(t, ggufsynth.Tiny())
	good := serveFile(t, tiny)

	noRange := serveFile(t, tiny)
	noRange.ignoreRange = true

	textPath := filepath.Join(t.TempDir(), "readme.gguf")
	if err := os.WriteFile(textPath, []byte("<html>not a model</html>"), 0o644); err != nil {
		t.Fatal(err)
	}
	text := serveFile(t, textPath)

	data, err := os.ReadFile(tiny)
	if err != nil {
		t.Fatal(err)
	}
	truncPath := filepath.Join(t.TempDir(), "trunc.gguf")
	if err := os.WriteFile(truncPath, data[:200], 0o644); err != nil {
		t.Fatal(err)
	}
	trunc := serveFile(t, truncPath)

	dead := "http://" + testenv.ReservePort(t).Addr + "/m.gguf"

	notFound := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notFound.Close)

	as := func(target any) func(error) bool {
		return func(err error) bool { return errors.As(err, target) }
	}
	tests := []struct {
		name    string
		p       Params
		is      func(error) bool
		wantMsg string
	}{
		{"unreachable", Params{URL: dead}, as(new(*modelsource.UnreachableError)), "unreachable"},
		{"404", Params{URL: notFound.URL + "/m.gguf"}, func(err error) bool {
			var se *modelsource.StatusError
			return errors.As(err, &se) && se.NotFound()
		}, "404 Not Found"},
		{"not a GGUF remote", Params{URL: text.URL + "/x.gguf"}, as(new(*NotGGUFError)), `not a GGUF file (it does not start with the GGUF magic)`},
		{"not a GGUF local", Params{Path: textPath}, as(new(*NotGGUFError)), "not a GGUF file"},
		{"no range support", Params{URL: noRange.URL + "/x.gguf"}, as(new(*NoRangeError)), "does not support HTTP range requests"},
		{"truncated remote", Params{URL: trunc.URL + "/x.gguf"}, as(new(*ParseError)), "parsing the GGUF header"},
		{"truncated local", Params{Path: truncPath}, as(new(*ParseError)), "parsing the GGUF header"},
		{"missing local", Params{Path: filepath.Join(t.TempDir(), "none.gguf")}, func(err error) bool { return errors.Is(err, fs.ErrNotExist) }, "no such file"},
		{"no location", Params{}, as(new(*ParamsError)), "exactly one of URL and Path"},
		{"both locations", Params{URL: good.URL, Path: tiny}, as(new(*ParamsError)), "exactly one of URL and Path"},
		{"bad kv type", Params{Path: tiny, KVCacheType: "q5_1"}, as(new(*ParamsError)), `unknown KV cache type "q5_1"`},
		{"negative ctx", Params{Path: tiny, ContextLength: -1}, as(new(*ParamsError)), "negative"},
		{"negative batch", Params{Path: tiny, Batch: -1}, as(new(*ParamsError)), "batch -1 is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			_, err := Estimate(t.Context(), tt.p)
			if err == nil || !tt.is(err) {
				t.Fatalf("Estimate error = %v (%T), wrong type", err, err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not contain %q", err, tt.wantMsg)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v to fail", d)
			}
		})
	}
}

// Without a Metal flash-attention kernel for the head size, llama.cpp materializes
// the attention scores of a whole micro-batch — context × batch × heads f32 — and the
// compute buffer holds them; with one (or with a quantized KV cache, which forces
// flash attention) it does not.
func TestComputeHoldsScoresWithoutFlashAttention(t *testing.T) {
	spec := ggufsynth.Tiny()
	spec.Name, spec.Embd, spec.FF = "tiny-head24", 96, 256 // 4 heads of 24
	path := model(t, spec)
	const ctx = 2048
	scores := int64(ctx) * DefaultBatch * int64(spec.Heads) * 4
	f16, err := Estimate(t.Context(), Params{Path: path, ContextLength: ctx})
	if err != nil {
		t.Fatal(err)
	}
	if f16.FlashAttention || f16.Compute < scores {
		t.Errorf("head size 24, f16 KV: flash attention %v, compute %d; want off and at least the %d bytes of scores", f16.FlashAttention, f16.Compute, scores)
	}
	q8, err := Estimate(t.Context(), Params{Path: path, ContextLength: ctx, KVCacheType: KVQ8_0})
	if err != nil {
		t.Fatal(err)
	}
	if !q8.FlashAttention || q8.Compute >= scores {
		t.Errorf("head size 24, q8_0 KV: flash attention %v, compute %d; want on and below %d", q8.FlashAttention, q8.Compute, scores)
	}
}
