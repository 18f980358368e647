package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

// model returns n bytes that look like a GGUF file: the magic, then noise.
func model(n int, seed uint64) []byte {
	b := make([]byte, n)
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	_, _ = rand.NewChaCha8(key).Read(b)
	copy(b, ggufMagic)
	return b
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// request is what the origin saw of one request and sent back.
type request struct {
	Path, Range, IfRange, Auth string
	Status                     int
	Sent                       int64
}

// origin is an HTTP server for model files. By default it serves content with
// http.ServeContent (ranges, If-Range on the ETag); handle overrides that per request
// (n counts from 0).
type origin struct {
	*httptest.Server

	mu      sync.Mutex
	content []byte
	etag    string
	reqs    []request
	handle  func(w http.ResponseWriter, r *http.Request, n int)
}

func newOrigin(t *testing.T, content []byte) *origin {
	t.Helper()
	o := &origin{content: content, etag: `"v1"`}
	o.Server = httptest.NewServer(http.HandlerFunc(o.serveHTTP))
	t.Cleanup(o.Close)
	return o
}

func (o *origin) set(content []byte, etag string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.content, o.etag = content, etag
}

func (o *origin) requests() []request {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]request(nil), o.reqs...)
}

func (o *origin) serveHTTP(w http.ResponseWriter, r *http.Request) {
	cw := &countingWriter{ResponseWriter: w, status: http.StatusOK}
	o.mu.Lock()
	n := len(o.reqs)
	o.reqs = append(o.reqs, request{})
	handle := o.handle
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		o.reqs[n] = request{Path: r.URL.Path, Range: r.Header.Get("Range"), IfRange: r.Header.Get("If-Range"),
			Auth: r.Header.Get("Authorization"), Status: cw.status, Sent: cw.sent.Load()}
		o.mu.Unlock()
	}()
	if handle != nil {
		handle(cw, r, n)
		return
	}
	o.serveContent(cw, r)
}

var modTime = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func (o *origin) serveContent(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	content, etag := o.content, o.etag
	o.mu.Unlock()
	w.Header().Set("ETag", etag)
	http.ServeContent(w, r, "", modTime, bytes.NewReader(content))
}

// cut announces the whole content, sends its first n bytes and drops the connection.
func (o *origin) cut(w http.ResponseWriter, n int) {
	o.mu.Lock()
	content, etag := o.content, o.etag
	o.mu.Unlock()
	w.Header().Set("ETag", etag)
	w.Header().Set("Content-Length", strconv.Itoa(len(content)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(content[:n])
	w.(http.Flusher).Flush()
	panic(http.ErrAbortHandler)
}

type countingWriter struct {
	http.ResponseWriter
	status int
	sent   atomic.Int64
}

func (c *countingWriter) WriteHeader(code int) {
	c.status = code
	c.ResponseWriter.WriteHeader(code)
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.sent.Add(int64(n))
	return n, err
}

func (c *countingWriter) Flush() { c.ResponseWriter.(http.Flusher).Flush() }

// testNS is the namespace the tests fetch for.
const testNS = "team-test"

// testPolicy lets testNS use the registries, plain HTTP from the loopback test
// servers, and files under the temporary directory, and lets downloads connect to
// loopback (the tests' servers listen there; the default policy denies it).
func testPolicy(t testing.TB) *sourcepolicy.Holder {
	t.Helper()
	p, err := sourcepolicy.Compile(&v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: v1alpha1.SourcePolicySpec{
			Rules: []v1alpha1.SourcePolicyRule{{Namespaces: []string{testNS},
				Registries:      []v1alpha1.SourceRegistry{v1alpha1.RegistryHF, v1alpha1.RegistryOllama},
				Hosts:           []string{"127.0.0.1", "localhost", "elsewhere.example"},
				AllowPlainHTTP:  true,
				FileDirectories: []string{os.TempDir()}}},
			AllowedNetworks: []string{"127.0.0.0/8", "::1/128"},
		}})
	if err != nil {
		t.Fatal(err)
	}
	return sourcepolicy.NewHolder(p)
}

func newStore(t *testing.T, dir string, o *origin, mod ...func(*Options)) *Store {
	t.Helper()
	opts := Options{Log: logr.Discard(), Policy: testPolicy(t)}
	if o != nil {
		opts.HTTPClient, opts.HFEndpoint, opts.OllamaRegistry = o.Client(), o.URL+"/hub", o.URL
	}
	for _, m := range mod {
		m(&opts)
	}
	s, err := New(dir, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// progressLog records a progress callback's calls and fails the test if they overlap.
type progressLog struct {
	t     *testing.T
	in    atomic.Bool
	mu    sync.Mutex
	calls [][2]int64
}

func (p *progressLog) fn(done, total int64) {
	if p.in.Swap(true) {
		p.t.Errorf("progress callback called concurrently")
	}
	p.mu.Lock()
	p.calls = append(p.calls, [2]int64{done, total})
	p.mu.Unlock()
	p.in.Store(false)
}

func (p *progressLog) last() [2]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.calls) == 0 {
		return [2]int64{-2, -2}
	}
	return p.calls[len(p.calls)-1]
}

func (p *progressLog) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.calls)
}

// files lists the files under dir, relative, sorted.
func files(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// partialPath is where the partial download of the source raw lives.
func partialPath(t *testing.T, dir, raw string) string {
	t.Helper()
	src, err := modelsource.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "blobs", "src-"+hashName(src.String())+".partial")
}
