package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/internal/modelsource"
)

func TestResumeAfterCut(t *testing.T) {
	content := model(3<<20+17, 1)
	const cutAt = 1<<20 + 123
	o := newOrigin(t, content)
	o.handle = func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 0 {
			o.cut(w, cutAt)
		}
		o.serveContent(w, r)
	}
	dir := t.TempDir()
	url := o.URL + "/models/m.gguf"

	_, err := newStore(t, dir, o).Fetch(t.Context(), testNS, url, sum(content), nil)
	if err == nil || !Retryable(err) {
		t.Fatalf("first Fetch error = %v, want a retryable error", err)
	}
	partial := partialPath(t, dir, url)
	fi, err := os.Stat(partial)
	if err != nil || fi.Size() != cutAt {
		t.Fatalf("partial after the cut: %v, size %d; want %d bytes", err, sizeOf(fi), cutAt)
	}
	var meta partialMeta
	if err := json.Unmarshal(readFile(t, partial+".json"), &meta); err != nil {
		t.Fatal(err)
	}
	if meta.HashOffset != cutAt || meta.ETag != `"v1"` || meta.Total != int64(len(content)) {
		t.Errorf("partial metadata = offset %d etag %s total %d, want the hash state at %d, the ETag and the size",
			meta.HashOffset, meta.ETag, meta.Total, cutAt)
	}

	// A restarted store resumes where the first one stopped.
	var prog progressLog
	prog.t = t
	p, err := newStore(t, dir, o).Fetch(t.Context(), testNS, url, sum(content), prog.fn)
	if err != nil {
		t.Fatalf("second Fetch: %v", err)
	}
	want := []request{
		{Path: "/models/m.gguf", Status: 200, Sent: cutAt},
		{Path: "/models/m.gguf", Range: fmt.Sprintf("bytes=%d-", cutAt), IfRange: `"v1"`, Status: 206, Sent: int64(len(content) - cutAt)},
	}
	if diff := cmp.Diff(want, o.requests()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	if !bytes.Equal(readFile(t, p), content) {
		t.Errorf("the fetched file differs from the served one")
	}
	if got := prog.last(); got != [2]int64{int64(len(content)), int64(len(content))} {
		t.Errorf("last progress = %v, want the final size twice", got)
	}
	if first := prog.calls[0]; first[0] != cutAt {
		t.Errorf("first progress = %v, want to start at the resumed offset %d", first, cutAt)
	}
	if diff := cmp.Diff([]string{"blobs/sha256-" + sum(content), "refs/" + hashName(url) + ".json", "used/sha256-" + sum(content)}, files(t, dir)); diff != "" {
		t.Errorf("store files (-want +got):\n%s", diff)
	}
}

func sizeOf(fi os.FileInfo) int64 {
	if fi == nil {
		return -1
	}
	return fi.Size()
}

func TestResumeStartsOver(t *testing.T) {
	v1, v2 := model(1<<20, 2), model(1<<20+5, 3)
	tests := []struct {
		name string
		// second serves the resume request.
		second      func(o *origin, w http.ResponseWriter, r *http.Request)
		wantContent []byte
	}{{
		name: "server without range support",
		second: func(o *origin, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("ETag", `"v1"`)
			_, _ = w.Write(v1)
		},
		wantContent: v1,
	}, {
		name: "file changed on the server",
		second: func(o *origin, w http.ResponseWriter, r *http.Request) {
			o.set(v2, `"v2"`)
			o.serveContent(w, r)
		},
		wantContent: v2,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newOrigin(t, v1)
			o.handle = func(w http.ResponseWriter, r *http.Request, n int) {
				if n == 0 {
					o.cut(w, 300_000)
				}
				tt.second(o, w, r)
			}
			s := newStore(t, t.TempDir(), o)
			url := o.URL + "/m.gguf"
			if _, err := s.Fetch(t.Context(), testNS, url, "", nil); err == nil {
				t.Fatal("first Fetch succeeded through a cut connection")
			}
			p, err := s.Fetch(t.Context(), testNS, url, "", nil)
			if err != nil {
				t.Fatalf("second Fetch: %v", err)
			}
			reqs := o.requests()
			if len(reqs) != 2 || reqs[1].Range != "bytes=300000-" || reqs[1].Status != 200 {
				t.Fatalf("requests = %+v, want a second one asking for a range and answered 200", reqs)
			}
			if !bytes.Equal(readFile(t, p), tt.wantContent) {
				t.Errorf("fetched file is not the content served last")
			}
			if want := filepath.Join(s.Dir(), "blobs", "sha256-"+sum(tt.wantContent)); p != want {
				t.Errorf("path = %s, want %s", p, want)
			}
			if diff := cmp.Diff([]string{"blobs/sha256-" + sum(tt.wantContent), "refs/" + hashName(url) + ".json",
				"used/sha256-" + sum(tt.wantContent)}, files(t, s.Dir())); diff != "" {
				t.Errorf("store files (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCompletePartialIsNotDownloadedAgain(t *testing.T) {
	content := model(200_000, 4)
	o := newOrigin(t, content)
	dir := t.TempDir()
	s := newStore(t, dir, o)
	url := o.URL + "/m.gguf"
	// An agent that died between the last byte and the rename left this.
	partial := partialPath(t, dir, url)
	if err := os.WriteFile(partial, content, 0o644); err != nil {
		t.Fatal(err)
	}
	meta, _ := json.Marshal(partialMeta{URL: url, ETag: `"v1"`, Total: int64(len(content))})
	if err := os.WriteFile(partial+".json", meta, 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := s.Fetch(t.Context(), testNS, url, sum(content), nil)
	if err != nil {
		t.Fatal(err)
	}
	if reqs := o.requests(); len(reqs) != 1 || reqs[0].Status != http.StatusRequestedRangeNotSatisfiable || reqs[0].Sent > 100 {
		t.Errorf("requests = %+v, want one range request past the end", reqs)
	}
	if !bytes.Equal(readFile(t, p), content) {
		t.Errorf("fetched file differs")
	}
}

func TestChecksumMismatch(t *testing.T) {
	content := model(500_000, 5)
	o := newOrigin(t, content)
	s := newStore(t, t.TempDir(), o)
	wrong := sum([]byte("something else"))
	src := o.URL + "/m.gguf"
	_, err := s.Fetch(t.Context(), testNS, src, strings.ToUpper(wrong), nil)
	var ce *ChecksumError
	if !errors.As(err, &ce) {
		t.Fatalf("Fetch error = %v, want a *ChecksumError", err)
	}
	if diff := cmp.Diff(ChecksumError{Source: src, Expected: wrong, Got: sum(content), Of: "the downloaded file"}, *ce); diff != "" {
		t.Errorf("ChecksumError (-want +got):\n%s", diff)
	}
	if Retryable(err) {
		t.Errorf("Retryable(%v) = true", err)
	}
	for _, d := range []string{wrong, sum(content)} {
		if !strings.Contains(err.Error(), d) {
			t.Errorf("message %q does not name %s", err, d)
		}
	}
	if got := files(t, s.Dir()); len(got) != 0 {
		t.Errorf("files left after a mismatch: %v", got)
	}
}

func TestConcurrentFetchesShareOneDownload(t *testing.T) {
	content := model(2<<20, 6)
	o := newOrigin(t, content)
	release := make(chan struct{})
	o.handle = func(w http.ResponseWriter, r *http.Request, n int) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		o.serveContent(w, r)
	}
	s := newStore(t, t.TempDir(), o)
	src, sha := o.URL+"/m.gguf", sum(content)

	const callers = 5
	type result struct {
		path string
		err  error
	}
	results := make([]result, callers)
	logs := make([]*progressLog, callers)
	cancelFirst, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	for i := range callers {
		logs[i] = &progressLog{t: t}
		ctx := t.Context()
		if i == 0 {
			ctx = cancelFirst
		}
		wg.Go(func() {
			p, err := s.Fetch(ctx, testNS, src, sha, logs[i].fn)
			results[i] = result{p, err}
		})
	}
	eventually(t, "all callers to wait for one download", func() bool { return s.waiting("src:"+src+"@sha256:"+sha) == callers })
	// One caller giving up does not stop the download for the others.
	cancel()
	eventually(t, "the cancelled caller to leave", func() bool { return s.waiting("src:"+src+"@sha256:"+sha) == callers-1 })
	close(release)
	wg.Wait()

	if !errors.Is(results[0].err, context.Canceled) {
		t.Errorf("cancelled caller: %v, want context.Canceled", results[0].err)
	}
	for i, r := range results[1:] {
		if r.err != nil || r.path != filepath.Join(s.Dir(), "blobs", "sha256-"+sha) {
			t.Errorf("caller %d: %q, %v", i+1, r.path, r.err)
		}
		if got := logs[i+1].last(); got != [2]int64{int64(len(content)), int64(len(content))} {
			t.Errorf("caller %d: last progress %v", i+1, got)
		}
	}
	if reqs := o.requests(); len(reqs) != 1 {
		t.Errorf("%d requests, want 1: %+v", len(reqs), reqs)
	}
}

func TestAgentsSharingADirectoryDownloadOnce(t *testing.T) {
	content := model(1<<20, 7)
	o := newOrigin(t, content)
	release := make(chan struct{})
	o.handle = func(w http.ResponseWriter, r *http.Request, n int) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		o.serveContent(w, r)
	}
	dir := t.TempDir()
	a := newStore(t, dir, o)
	var waitingForLock sync.Once
	blocked := make(chan struct{})
	b := newStore(t, dir, o, func(opts *Options) {
		opts.Log = funcr.New(func(_, args string) {
			if strings.Contains(args, "Waiting for another download") {
				waitingForLock.Do(func() { close(blocked) })
			}
		}, funcr.Options{Verbosity: 2})
	})
	src, sha := o.URL+"/m.gguf", sum(content)
	errs := make(chan error, 2)
	go func() { _, err := a.Fetch(t.Context(), testNS, src, sha, nil); errs <- err }()
	eventually(t, "the first agent's request", func() bool { return len(o.requests()) == 1 })
	go func() { _, err := b.Fetch(t.Context(), testNS, src, sha, nil); errs <- err }()
	select {
	case <-blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("the second agent did not wait for the first one's lock")
	}
	close(release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if reqs := o.requests(); len(reqs) != 1 {
		t.Errorf("%d requests, want 1", len(reqs))
	}
}

func TestHuggingFace(t *testing.T) {
	content := model(100_000, 8)
	o := newOrigin(t, content)
	s := newStore(t, t.TempDir(), o, func(opts *Options) { opts.HFToken = "hf_secret" })
	p, err := s.Fetch(t.Context(), testNS, "hf://org/repo/dir/m.gguf@v2", sum(content), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []request{{Path: "/hub/org/repo/resolve/v2/dir/m.gguf", Auth: "Bearer hf_secret", Status: 200, Sent: int64(len(content))}}
	if diff := cmp.Diff(want, o.requests()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	if !bytes.Equal(readFile(t, p), content) {
		t.Errorf("fetched file differs")
	}

	// Without a token of its own, the store asks its token source for each hf://
	// request (the fleet's Secret), and sends none where the source has none.
	for _, tc := range []struct{ source, want string }{{"hf_fleet", "Bearer hf_fleet"}, {"", ""}} {
		o := newOrigin(t, content)
		asked := 0
		s := newStore(t, t.TempDir(), o, func(opts *Options) {
			opts.HFTokenSource = func(context.Context) string { asked++; return tc.source }
		})
		if _, err := s.Fetch(t.Context(), testNS, "hf://org/repo/dir/m.gguf@v2", sum(content), nil); err != nil {
			t.Fatal(err)
		}
		if reqs := o.requests(); len(reqs) != 1 || reqs[0].Auth != tc.want || asked != 1 {
			t.Errorf("token source %q: requests %+v after %d asks, want one with %q", tc.source, reqs, asked, tc.want)
		}
	}
	// A token of its own wins over the source.
	o2 := newOrigin(t, content)
	s2 := newStore(t, t.TempDir(), o2, func(opts *Options) {
		opts.HFToken = "hf_own"
		opts.HFTokenSource = func(context.Context) string {
			t.Error("the token source was asked beside --hf-token")
			return "hf_fleet"
		}
	})
	if _, err := s2.Fetch(t.Context(), testNS, "hf://org/repo/dir/m.gguf@v2", sum(content), nil); err != nil {
		t.Fatal(err)
	}
	if reqs := o2.requests(); len(reqs) != 1 || reqs[0].Auth != "Bearer hf_own" {
		t.Errorf("with a token of its own: %+v", reqs)
	}
}

func TestOllama(t *testing.T) {
	content := model(300_000, 9)
	digest := sum(content)
	tests := []struct {
		name string
		// layerDigest is the model layer's digest in the manifest.
		layerDigest string
		sha         string
		wantErr     string
		wantBlobGET bool
	}{
		{name: "digest verified", layerDigest: "sha256:" + digest, wantBlobGET: true},
		{name: "digest and sha256 agree", layerDigest: "sha256:" + digest, sha: digest, wantBlobGET: true},
		{name: "blob does not match its digest", layerDigest: "sha256:" + sum([]byte("x")), wantBlobGET: true,
			wantErr: "sha256 mismatch for ollama://tiny:q4: expected " + sum([]byte("x")) + ", the downloaded file has " + digest},
		{name: "manifest contradicts sha256", layerDigest: "sha256:" + digest, sha: sum([]byte("y")),
			wantErr: "expected " + sum([]byte("y")) + ", the registry manifest has " + digest},
		{name: "not sha256", layerDigest: "sha512:abcd", wantErr: `digest "sha512:abcd" of the registry's model layer is not a SHA-256`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newOrigin(t, content)
			o.handle = func(w http.ResponseWriter, r *http.Request, n int) {
				switch r.URL.Path {
				case "/v2/library/tiny/manifests/q4":
					fmt.Fprintf(w, `{"schemaVersion":2,"layers":[
						{"mediaType":"application/vnd.ollama.image.template","digest":"sha256:%s","size":3},
						{"mediaType":"application/vnd.ollama.image.model","digest":%q,"size":%d}]}`,
						sum([]byte("tpl")), tt.layerDigest, len(content))
				case "/v2/library/tiny/blobs/" + tt.layerDigest:
					o.serveContent(w, r)
				default:
					http.NotFound(w, r)
				}
			}
			dir := t.TempDir()
			p, err := newStore(t, dir, o).Fetch(t.Context(), testNS, "ollama://tiny:q4", tt.sha, nil)
			reqs := o.requests()
			if got := len(reqs) == 2 && strings.Contains(reqs[1].Path, "/blobs/"); got != tt.wantBlobGET {
				t.Errorf("requests %+v: blob fetched = %v, want %v", reqs, got, tt.wantBlobGET)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || Retryable(err) {
					t.Fatalf("Fetch error = %v, want a non-retryable error containing %q", err, tt.wantErr)
				}
				if got := files(t, dir); len(got) != 0 {
					t.Errorf("files left: %v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(dir, "blobs", "sha256-"+digest); p != want {
				t.Errorf("path = %s, want %s", p, want)
			}
			// A restarted agent finds the model without asking the registry.
			o.Close()
			var prog progressLog
			prog.t = t
			p2, err := newStore(t, dir, nil, noNetwork(t)).Fetch(t.Context(), testNS, "ollama://library/tiny:q4", "", prog.fn)
			if err != nil || p2 != p {
				t.Errorf("after restart: %q, %v; want %q", p2, err, p)
			}
			if got := prog.last(); got != [2]int64{int64(len(content)), int64(len(content))} {
				t.Errorf("progress after restart = %v, want the size", got)
			}
		})
	}
}

// noNetwork gives a store a client that fails the test on any request.
func noNetwork(t *testing.T) func(*Options) {
	return func(o *Options) {
		o.HTTPClient = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			t.Errorf("unexpected request %s %s", r.Method, r.URL)
			return nil, errors.New("no network in this test")
		})}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestRestartFindsCompletedFiles(t *testing.T) {
	a, b := model(100_000, 10), model(120_000, 11)
	o := newOrigin(t, nil)
	o.handle = func(w http.ResponseWriter, r *http.Request, n int) {
		o.set(map[string][]byte{"/a.gguf": a, "/b.gguf": b}[r.URL.Path], `"x"`)
		o.serveContent(w, r)
	}
	dir := t.TempDir()
	s := newStore(t, dir, o)
	pa, err := s.Fetch(t.Context(), testNS, o.URL+"/a.gguf", sum(a), nil)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := s.Fetch(t.Context(), testNS, o.URL+"/b.gguf", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	urlA, urlB := o.URL+"/a.gguf", o.URL+"/b.gguf"
	o.Close()

	s2 := newStore(t, dir, nil, noNetwork(t))
	for _, c := range []struct{ src, sha, want string }{
		{urlA, sum(a), pa},
		{urlB, "", pb},
		{urlB, sum(b), pb},
	} {
		p, err := s2.Fetch(t.Context(), testNS, c.src, c.sha, nil)
		if err != nil || p != c.want {
			t.Errorf("Fetch(%s, %q) after restart = %q, %v; want %q", c.src, c.sha, p, err, c.want)
		}
	}
}

// A stored file is handed only to the sources it was verified from: another source
// naming its digest downloads from itself and gets what it serves, checked against
// the digest, and shares the stored file only once it served the same bytes.
func TestADigestIsNotACapability(t *testing.T) {
	private, public := model(100_000, 12), model(100_000, 13)
	o := newOrigin(t, nil)
	o.handle = func(w http.ResponseWriter, r *http.Request, n int) {
		o.set(map[string][]byte{"/private/a.gguf": private, "/public/b.gguf": public, "/mirror/a.gguf": private}[r.URL.Path], `"x"`)
		o.serveContent(w, r)
	}
	s := newStore(t, t.TempDir(), o)
	pa, err := s.Fetch(t.Context(), testNS, o.URL+"/private/a.gguf", sum(private), nil)
	if err != nil {
		t.Fatal(err)
	}
	before := len(o.requests())

	_, err = s.Fetch(t.Context(), testNS, o.URL+"/public/b.gguf", sum(private), nil)
	var ce *ChecksumError
	if !errors.As(err, &ce) || ce.Got != sum(public) {
		t.Fatalf("another source naming the stored digest: %v; want a checksum error for what that source serves", err)
	}
	if got := len(o.requests()) - before; got != 1 {
		t.Errorf("%d requests for the other source, want 1 (its own download)", got)
	}

	// A mirror that serves the same bytes downloads once, then shares the file.
	for i := range 2 {
		before = len(o.requests())
		p, err := s.Fetch(t.Context(), testNS, o.URL+"/mirror/a.gguf", sum(private), nil)
		if err != nil || p != pa {
			t.Fatalf("fetch %d of a mirror of the stored file: %q, %v; want %q", i, p, err, pa)
		}
		if want := 1 - i; len(o.requests())-before != want {
			t.Errorf("fetch %d of the mirror made %d requests, want %d", i, len(o.requests())-before, want)
		}
	}
	if !bytes.Equal(readFile(t, pa), private) {
		t.Error("the stored file changed")
	}
}

func TestCancelKeepsPartial(t *testing.T) {
	content := model(2<<20, 12)
	const half = 1 << 20
	o := newOrigin(t, content)
	o.handle = func(w http.ResponseWriter, r *http.Request, n int) {
		if n > 0 {
			o.serveContent(w, r)
			return
		}
		w.Header().Set("ETag", `"v1"`)
		w.Header().Set("Content-Length", fmt.Sprint(len(content)))
		_, _ = w.Write(content[:half])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}
	dir := t.TempDir()
	s := newStore(t, dir, o)
	src := o.URL + "/m.gguf"
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, err := s.Fetch(ctx, testNS, src, "", func(done, total int64) {
		if done >= half {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || !Retryable(err) {
		t.Fatalf("Fetch error = %v, want a retryable context.Canceled", err)
	}
	partial := filepath.Join(dir, "blobs", "src-"+hashName(src)+".partial")
	if fi, err := os.Stat(partial); err != nil || fi.Size() != half {
		t.Fatalf("partial after cancel: %v, size %d; want %d", err, sizeOf(fi), half)
	}
	p, err := s.Fetch(t.Context(), testNS, src, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if reqs := o.requests(); len(reqs) != 2 || reqs[1].Range != fmt.Sprintf("bytes=%d-", half) || reqs[1].Sent != int64(len(content)-half) {
		t.Errorf("requests = %+v, want the second to fetch only the second half", reqs)
	}
	if !bytes.Equal(readFile(t, p), content) {
		t.Errorf("fetched file differs")
	}
}

func TestStalledDownload(t *testing.T) {
	content := model(100_000, 13)
	o := newOrigin(t, content)
	o.handle = func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Length", fmt.Sprint(len(content)))
		_, _ = w.Write(content[:1000])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}
	s := newStore(t, t.TempDir(), o, func(opts *Options) { opts.StallTimeout = 200 * time.Millisecond })
	_, err := s.Fetch(t.Context(), testNS, o.URL+"/m.gguf", "", nil)
	var se *StalledError
	if !errors.As(err, &se) || !Retryable(err) {
		t.Fatalf("Fetch error = %v, want a retryable *StalledError", err)
	}
}

func TestFetchErrors(t *testing.T) {
	o := newOrigin(t, nil)
	o.handle = func(w http.ResponseWriter, r *http.Request, n int) {
		var code int
		_, rest, _ := strings.Cut(r.URL.Path, "/status/")
		if _, err := fmt.Sscanf(rest, "%d", &code); err == nil {
			http.Error(w, "no", code)
			return
		}
		_, _ = w.Write([]byte("<html>please log in</html>"))
	}
	tests := []struct {
		src, sha      string
		wantErr       string
		wantRetryable bool
	}{
		{src: o.URL + "/status/404/m.gguf", wantErr: "GET " + o.URL + "/status/404/m.gguf: 404 Not Found"},
		{src: o.URL + "/status/401/m.gguf", wantErr: "401 Unauthorized"},
		{src: o.URL + "/status/403/m.gguf", wantErr: "403 Forbidden"},
		{src: o.URL + "/status/500/m.gguf", wantErr: "500 Internal Server Error", wantRetryable: true},
		{src: o.URL + "/status/503/m.gguf", wantErr: "503 Service Unavailable", wantRetryable: true},
		{src: o.URL + "/status/429/m.gguf", wantErr: "429 Too Many Requests", wantRetryable: true},
		{src: o.URL + "/login.gguf", wantErr: `/login.gguf is not a GGUF file: it does not start with the GGUF magic`},
		{src: o.URL + "/login.gguf", sha: sum([]byte("model")), wantErr: `/login.gguf is not a GGUF file`},
		{src: "http://127.0.0.1:1/m.gguf", wantErr: "unreachable", wantRetryable: true},
		{src: "ollama://nope", wantErr: "resolving ollama://nope: ollama manifest " + o.URL + "/v2/library/nope/manifests/latest: not JSON"},
		{src: "ollama://status/503", wantErr: "resolving ollama://status/503: GET " + o.URL + "/v2/status/503/manifests/latest: 503 Service Unavailable", wantRetryable: true},
		{src: "s3://bucket/m.gguf", wantErr: `invalid model source "s3://bucket/m.gguf": unknown scheme`},
		{src: "hf://org/repo", wantErr: "invalid model source"},
		{src: "", wantErr: "invalid model source"},
		{src: o.URL + "/m.gguf", sha: "abc", wantErr: `digest "abc" is not a SHA-256`},
		{src: o.URL + "/m.gguf", sha: strings.Repeat("g", 64), wantErr: "is not a SHA-256"},
	}
	for _, tt := range tests {
		t.Run(tt.src+tt.sha, func(t *testing.T) {
			s := newStore(t, t.TempDir(), o)
			p, err := s.Fetch(t.Context(), testNS, tt.src, tt.sha, nil)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Fetch = %q, %v; want an error containing %q", p, err, tt.wantErr)
			}
			if got := Retryable(err); got != tt.wantRetryable {
				t.Errorf("Retryable(%v) = %v, want %v", err, got, tt.wantRetryable)
			}
			if got := files(t, filepath.Join(s.Dir(), "blobs")); len(got) != 0 && !strings.Contains(tt.src, "127.0.0.1:1") {
				t.Errorf("files left: %v", got)
			}
		})
	}
}

func TestLocalFiles(t *testing.T) {
	dir := t.TempDir()
	content := model(50_000, 14)
	good := filepath.Join(dir, "My Models", "m.gguf")
	if err := os.MkdirAll(filepath.Dir(good), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, content, 0o644); err != nil {
		t.Fatal(err)
	}
	notGGUF := filepath.Join(dir, "notes.gguf")
	if err := os.WriteFile(notGGUF, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	goodURL := "file://" + strings.ReplaceAll(good, " ", "%20")
	tests := []struct {
		name, src, sha string
		wantErr        string
	}{
		{name: "with sha256", src: goodURL, sha: sum(content)},
		{name: "without sha256", src: goodURL},
		{name: "wrong sha256", src: goodURL, sha: sum([]byte("other")),
			wantErr: "sha256 mismatch for " + goodURL + ": expected " + sum([]byte("other")) + ", the file has " + sum(content)},
		{name: "missing", src: "file://" + dir + "/missing.gguf", wantErr: "model file " + dir + "/missing.gguf does not exist"},
		{name: "directory", src: "file://" + dir, wantErr: "is not a regular file"},
		{name: "not GGUF", src: "file://" + notGGUF, wantErr: notGGUF + ` is not a GGUF file: it does not start with the GGUF magic`},
		{name: "relative", src: "file://models/m.gguf", wantErr: "invalid model source"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t, filepath.Join(t.TempDir(), "store"), nil, noNetwork(t))
			var prog progressLog
			prog.t = t
			p, err := s.Fetch(t.Context(), testNS, tt.src, tt.sha, prog.fn)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || Retryable(err) {
					t.Fatalf("Fetch = %q, %v; want a non-retryable error containing %q", p, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p != good {
				t.Errorf("path = %q, want the file itself %q", p, good)
			}
			if got := prog.last(); got != [2]int64{int64(len(content)), int64(len(content))} {
				t.Errorf("last progress = %v", got)
			}
			if got := files(t, filepath.Join(s.Dir(), "blobs")); len(got) != 0 {
				t.Errorf("a file:// source was copied: %v", got)
			}
		})
	}
}

func TestLocalVerificationIsRemembered(t *testing.T) {
	content := model(100_000, 15)
	path := filepath.Join(t.TempDir(), "m.gguf")
	write := func(b []byte, mtime time.Time) {
		t.Helper()
		// WriteFile truncates in place: the inode stays.
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	write(content, modTime)
	storeDir := t.TempDir()
	src := "file://" + path
	if _, err := newStore(t, storeDir, nil).Fetch(t.Context(), testNS, src, sum(content), nil); err != nil {
		t.Fatal(err)
	}

	// Same size, mtime and inode: a restarted store trusts the hash it recorded and
	// does not read the file (which would find the change).
	tampered := bytes.Clone(content)
	tampered[len(tampered)-1] ^= 0xff
	write(tampered, modTime)
	var prog progressLog
	prog.t = t
	if _, err := newStore(t, storeDir, nil).Fetch(t.Context(), testNS, src, sum(content), prog.fn); err != nil {
		t.Fatalf("Fetch with an unchanged size and mtime: %v (the file was hashed again)", err)
	}
	if prog.len() != 1 {
		t.Errorf("progress calls = %v, want only the final one (no hashing)", prog.calls)
	}

	// A new mtime makes it hash again and find the change.
	write(tampered, modTime.Add(time.Second))
	_, err := newStore(t, storeDir, nil).Fetch(t.Context(), testNS, src, sum(content), nil)
	var ce *ChecksumError
	if !errors.As(err, &ce) || ce.Got != sum(tampered) {
		t.Errorf("Fetch after the file changed = %v, want a *ChecksumError with the new digest", err)
	}
}

func TestLocalHashingCancelled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	content := model(16<<20, 16)
	if err := os.WriteFile(path, content, 0o644); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, t.TempDir(), nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, err := s.Fetch(ctx, testNS, "file://"+path, sum([]byte("x")), func(done, total int64) {
		if done > 0 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Fetch error = %v, want context.Canceled", err)
	}
	// Whether or not the hash finished before the cancellation reached it, the next
	// Fetch gets the right answer.
	_, err = s.Fetch(t.Context(), testNS, "file://"+path, sum([]byte("x")), nil)
	var ce *ChecksumError
	if !errors.As(err, &ce) || ce.Got != sum(content) {
		t.Errorf("Fetch after a cancelled one = %v, want a *ChecksumError naming the file's digest", err)
	}
}

func TestRetryable(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{&ChecksumError{}, false},
		{fmt.Errorf("wrapped: %w", &ChecksumError{}), false},
		{&DigestError{}, false},
		{&FormatError{}, false},
		{&LocalFileError{}, false},
		{&modelsource.ParseError{}, false},
		{&modelsource.ManifestError{}, false},
		{&modelsource.StatusError{StatusCode: 404}, false},
		{&modelsource.StatusError{StatusCode: 410}, false},
		{&modelsource.StatusError{StatusCode: 502}, true},
		{&modelsource.StatusError{StatusCode: 408}, true},
		{&modelsource.UnreachableError{Err: errors.New("refused")}, true},
		{&DiskSpaceError{}, true},
		{&StalledError{}, true},
		{&IncompleteError{}, true},
		{context.Canceled, true},
		{errors.New("something"), true},
	}
	for _, tt := range tests {
		if got := Retryable(tt.err); got != tt.want {
			t.Errorf("Retryable(%#v) = %v, want %v", tt.err, got, tt.want)
		}
	}
	if got, want := (&DiskSpaceError{Dir: "/d", Need: 4_100_000_000, Free: 1_234_567}).Error(),
		"not enough disk space in /d: the download needs 4.1 GB more, 1.2 MB free"; got != want {
		t.Errorf("DiskSpaceError = %q, want %q", got, want)
	}
}

func TestThrottle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type call struct {
		done, total int64
		at          time.Duration
		want        bool
	}
	tests := []struct {
		name  string
		calls []call
	}{{
		name: "every percent",
		calls: []call{
			{0, 1000, 0, true}, {5, 1000, 1, false}, {10, 1000, 2, true}, {19, 1000, 3, false},
			{20, 1000, 4, true}, {1000, 1000, 5, true}, {1000, 1000, 6, false},
		},
	}, {
		name: "every interval",
		calls: []call{
			{0, -1, 0, true}, {100, -1, 100 * time.Millisecond, false},
			{200, -1, 500 * time.Millisecond, true}, {200, -1, 2 * time.Second, false}, {300, -1, 2 * time.Second, true},
		},
	}, {
		name:  "total becomes known",
		calls: []call{{0, -1, 0, true}, {0, 500, 1, true}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			th := throttle{interval: 500 * time.Millisecond}
			for i, c := range tt.calls {
				if got := th.due(c.done, c.total, t0.Add(c.at)); got != c.want {
					t.Errorf("call %d (%d/%d at %v) = %v, want %v", i, c.done, c.total, c.at, got, c.want)
				}
			}
		})
	}
}

func TestParseContentRange(t *testing.T) {
	tests := []struct {
		in          string
		first, size int64
		ok          bool
	}{
		{"bytes 0-99/100", 0, 100, true},
		{"bytes 10-99/*", 10, -1, true},
		{"bytes */100", -1, 100, true},
		{"bytes 10-9/100", 0, 0, false},
		{"bytes 0-100/100", 0, 0, false},
		{"bytes -1-5/10", 0, 0, false},
		{"bytes 0-5", 0, 0, false},
		{"items 0-5/10", 0, 0, false},
		{"", 0, 0, false},
	}
	for _, tt := range tests {
		first, size, ok := parseContentRange(tt.in)
		if ok != tt.ok || (ok && (first != tt.first || size != tt.size)) {
			t.Errorf("parseContentRange(%q) = %d, %d, %v; want %d, %d, %v", tt.in, first, size, ok, tt.first, tt.size, tt.ok)
		}
	}
}

// TestResumeReadsOnlyWhatTheHashStateDoesNotCover checks that reopening a partial file
// trusts the hash state saved with it and reads only the bytes after it: the partial
// below is altered inside the covered part, and the loaded hash does not see that.
func TestResumeReadsOnlyWhatTheHashStateDoesNotCover(t *testing.T) {
	content := model(100_000, 17)
	dir := t.TempDir()
	path := filepath.Join(dir, "x.partial")
	const covered = 60_000
	h := sha256.New()
	h.Write(content[:covered])
	state, err := h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	altered := bytes.Clone(content)
	altered[10] ^= 0xff
	if err := os.WriteFile(path, altered, 0o644); err != nil {
		t.Fatal(err)
	}
	meta, _ := json.Marshal(partialMeta{Total: -1, HashOffset: covered, HashState: state})
	if err := os.WriteFile(path+".json", meta, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		meta []byte
		want []byte
	}{
		{name: "saved state", meta: meta, want: content},
		{name: "no state", meta: []byte(`{"total":-1}`), want: altered},
		{name: "state beyond the file", meta: mustJSON(t, partialMeta{Total: -1, HashOffset: 200_000, HashState: state}), want: altered},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.WriteFile(path+".json", tt.meta, 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = f.Close() }()
			p := &partial{path: path, metaPath: path + ".json", f: f}
			if err := p.load(t.Context()); err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(p.h.Sum(nil)); p.off != int64(len(content)) || got != sum(tt.want) {
				t.Errorf("loaded offset %d hash %s, want %d and %s", p.off, got, len(content), sum(tt.want))
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BenchmarkFetch measures a whole download over loopback: request, hashing, writing,
// verification and rename.
func BenchmarkFetch(b *testing.B) {
	content := model(256<<20, 18)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "", modTime, bytes.NewReader(content))
	}))
	defer srv.Close()
	sha := sum(content)
	b.SetBytes(int64(len(content)))
	for b.Loop() {
		s, err := New(b.TempDir(), Options{HTTPClient: srv.Client(), Policy: testPolicy(b)})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Fetch(b.Context(), testNS, srv.URL+"/m.gguf", sha, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// A source whose file changed keeps the files it gave before: a deployment pinned to
// the older one still finds it without network.
func TestASourceKeepsTheFilesItGaveBefore(t *testing.T) {
	v1, v2 := model(50_000, 14), model(50_000, 15)
	o := newOrigin(t, v1)
	s := newStore(t, t.TempDir(), o)
	src := o.URL + "/m.gguf"
	p1, err := s.Fetch(t.Context(), testNS, src, sum(v1), nil)
	if err != nil {
		t.Fatal(err)
	}
	o.set(v2, `"v2"`)
	p2, err := s.Fetch(t.Context(), testNS, src, sum(v2), nil)
	if err != nil || p2 == p1 {
		t.Fatalf("the changed source: %q, %v", p2, err)
	}
	before := len(o.requests())
	if p, err := s.Fetch(t.Context(), testNS, src, sum(v1), nil); err != nil || p != p1 {
		t.Errorf("pinned to the older file: %q, %v; want %q", p, err, p1)
	}
	if p, err := s.Fetch(t.Context(), testNS, src, "", nil); err != nil || p != p2 {
		t.Errorf("unpinned: %q, %v; want the newer file %q", p, err, p2)
	}
	if n := len(o.requests()) - before; n != 0 {
		t.Errorf("%d requests for files the source gave before, want none", n)
	}
}
