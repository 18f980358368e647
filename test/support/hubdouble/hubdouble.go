// Package hubdouble stands in for the model hub's download endpoint on loopback, for
// tests that pull hf:// sources: <url>/<org>/<repo>/resolve/<revision>/<path> serves a
// file with range requests and an ETag (what the estimate's header reads and the
// agent's resumed downloads use), a gated repository answers 401 to a request without
// its token, and every request is recorded.
package hubdouble

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"
)

// Files gives the content the hub serves at a URL path; ok is false for a path it
// does not hold (404). A content that is an io.Closer is closed once served.
type Files func(path string) (content io.ReadSeeker, ok bool)

// Hub is a running hub double.
type Hub struct {
	*httptest.Server
	files Files

	mu    sync.Mutex
	seen  []string
	gates map[string]string // URL path prefix → the token its requests need
}

// New starts a hub serving files on loopback; Close stops it.
func New(files Files) *Hub {
	h := &Hub{files: files, gates: map[string]string{}}
	h.Server = httptest.NewServer(http.HandlerFunc(h.serve))
	return h
}

// Gate makes every path under prefix ("/org/repo/", "/" for all) answer 401 unless
// the request carries "Authorization: Bearer token".
func (h *Hub) Gate(prefix, token string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gates[prefix] = token
}

// Requests are the requests served so far, each "METHOD PATH AUTHORIZATION".
func (h *Hub) Requests() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.seen...)
}

// token is the token a request for path needs, "" when its repository is not gated;
// the longest gated prefix decides.
func (h *Hub) token(path string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	best, tok := -1, ""
	for p, t := range h.gates {
		if strings.HasPrefix(path, p) && len(p) > best {
			best, tok = len(p), t
		}
	}
	return tok
}

func (h *Hub) serve(w http.ResponseWriter, r *http.Request) {
	auth := r.Header.Get("Authorization")
	h.mu.Lock()
	h.seen = append(h.seen, r.Method+" "+r.URL.Path+" "+auth)
	h.mu.Unlock()
	if tok := h.token(r.URL.Path); tok != "" && auth != "Bearer "+tok {
		http.Error(w, "gated model: log in", http.StatusUnauthorized)
		return
	}
	content, ok := h.files(r.URL.Path)
	if !ok {
		http.NotFound(w, r)
		return
	}
	if c, ok := content.(io.Closer); ok {
		defer c.Close()
	}
	w.Header().Set("ETag", `"v1"`)
	http.ServeContent(w, r, "", time.Time{}, content)
}

// Content serves size bytes of content at path only.
func Content(path string, content io.ReaderAt, size int64) Files {
	return func(p string) (io.ReadSeeker, bool) {
		return io.NewSectionReader(content, 0, size), p == path
	}
}

// LocalFiles serves the local files of files (the hub's URL path → the file).
func LocalFiles(files map[string]string) Files {
	return func(p string) (io.ReadSeeker, bool) {
		name, ok := files[p]
		if !ok {
			return nil, false
		}
		f, err := os.Open(name)
		if err != nil {
			return nil, false
		}
		return f, true
	}
}

// Dir serves the files of a directory laid out as the hub's repositories are,
// dir/<org>/<repo>/<path>, at every revision: a test writes a model under
// dir/org/repo/ and names it hf://org/repo/<path>.
func Dir(dir string) Files {
	root := http.Dir(dir)
	return func(p string) (io.ReadSeeker, bool) {
		parts := strings.SplitN(strings.TrimPrefix(p, "/"), "/", 5)
		if len(parts) != 5 || parts[2] != "resolve" {
			return nil, false
		}
		f, err := root.Open("/" + parts[0] + "/" + parts[1] + "/" + parts[4])
		if err != nil {
			return nil, false
		}
		if st, err := f.Stat(); err != nil || st.IsDir() {
			f.Close()
			return nil, false
		}
		return f, true
	}
}
