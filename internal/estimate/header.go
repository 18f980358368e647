package estimate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	gguf "github.com/gpustack/gguf-parser-go"

	"github.com/macfleet/macfleet/internal/ggufheader"
	"github.com/macfleet/macfleet/internal/modelsource"
)

// DialFunc connects to network address, or refuses to.
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// Limits bound the GGUF headers Estimate reads (a variable so that tests can make
// them small).
var Limits = ggufheader.DefaultLimits

// remoteHeader is the header of a remote GGUF file, checked against Limits: its
// bytes and the file's size.
type remoteHeader struct {
	bytes []byte
	size  int64
}

// ReadAt reads the header's bytes and zeros after them, up to the file's size: the
// parser reads the header and only seeks past it.
func (h *remoteHeader) ReadAt(p []byte, off int64) (int, error) {
	if off >= h.size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), h.size-off)
	clear(p[:n])
	if off < int64(len(h.bytes)) {
		copy(p[:n], h.bytes[off:])
	}
	if n < int64(len(p)) {
		return int(n), io.EOF
	}
	return int(n), nil
}

// headerClient is the client of the header's range requests: p.HTTPClient (or a
// client with a 30 s timeout), dialing with p.Dial when that is set.
func headerClient(p Params) *http.Client {
	cli := p.HTTPClient
	if cli == nil {
		cli = defaultClient
	}
	if p.Dial == nil {
		return cli
	}
	out := *cli
	tr, ok := cli.Transport.(*http.Transport)
	if !ok || tr == nil {
		tr = http.DefaultTransport.(*http.Transport)
	}
	tr = tr.Clone()
	tr.Proxy = nil
	tr.DialContext = p.Dial
	tr.DialTLSContext = nil
	out.Transport = tr
	return &out
}

// fetchHeader reads the GGUF header at u by range requests of growing size (1 MiB,
// doubling up to 8 MiB), checking it with ggufheader.Scan as it arrives: it never
// holds more than the header and one request's answer, nor asks for more than
// Limits.MaxHeaderBytes. The first answer classifies the common failures with typed
// errors (*modelsource.UnreachableError, *modelsource.StatusError, *NoRangeError,
// *NotGGUFError); a header over a limit is a *ParseError wrapping a
// *ggufheader.LimitError.
func fetchHeader(ctx context.Context, cli *http.Client, hdr http.Header, u string) (*remoteHeader, error) {
	rr := &rangeReader{ctx: ctx, cli: cli, hdr: hdr, url: u, chunk: readBufferSize, size: -1}
	var got bytes.Buffer
	n, err := ggufheader.Scan(io.TeeReader(rr, &got), Limits)
	if err != nil {
		if rr.err != nil { // the transport's error, not the header's
			return nil, rr.err
		}
		if errors.Is(err, ggufheader.ErrNotGGUF) {
			return nil, &NotGGUFError{Location: u}
		}
		return nil, &ParseError{Location: u, Err: err}
	}
	return &remoteHeader{bytes: got.Bytes()[:n], size: rr.size}, nil
}

// rangeReader reads a remote file from its start by successive range requests.
type rangeReader struct {
	ctx   context.Context
	cli   *http.Client
	hdr   http.Header
	url   string
	chunk int64

	off  int64
	size int64 // the file's size from the first answer's Content-Range; -1 before
	body io.ReadCloser
	left int64 // bytes of body still expected
	// err is the first transport or HTTP error: the reader's failures are the
	// fetch's, not the header's.
	err error
}

func (r *rangeReader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	for r.left == 0 {
		if r.body != nil {
			_ = r.body.Close()
			r.body = nil
		}
		if r.size >= 0 && r.off >= r.size {
			return 0, io.EOF
		}
		if err := r.next(); err != nil {
			r.err = err
			return 0, err
		}
	}
	n, err := r.body.Read(p[:min(int64(len(p)), r.left)])
	r.off += int64(n)
	r.left -= int64(n)
	if err != nil && (r.left > 0 || !errors.Is(err, io.EOF)) {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		r.err = modelsource.Unreachable(r.url, err)
		return n, r.err
	}
	return n, nil
}

// next asks for the next chunk.
func (r *rangeReader) next() error {
	req, err := http.NewRequestWithContext(r.ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return &ParamsError{Reason: fmt.Sprintf("URL %q: %v", r.url, err)}
	}
	for k, vs := range r.hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	end := min(r.off+r.chunk, Limits.MaxHeaderBytes) - 1
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", r.off, end))
	r.chunk = min(2*r.chunk, 8*readBufferSize)
	resp, err := r.cli.Do(req)
	if err != nil {
		if r.ctx.Err() != nil {
			return fmt.Errorf("reading the GGUF header of %s: %w", r.url, r.ctx.Err())
		}
		if de := deniedError(err); de != nil {
			// The client's dialer refused the address (a source policy).
			return fmt.Errorf("reading the GGUF header of %s: %w", r.url, de)
		}
		return modelsource.Unreachable(r.url, err)
	}
	switch resp.StatusCode {
	case http.StatusPartialContent:
	case http.StatusOK:
		_ = resp.Body.Close()
		// The server ignored the range: it would send the whole file.
		return &NoRangeError{URL: r.url}
	default:
		_ = resp.Body.Close()
		return &modelsource.StatusError{URL: r.url, StatusCode: resp.StatusCode, Status: resp.Status}
	}
	first, last, total, ok := contentRange(resp.Header.Get("Content-Range"))
	if !ok || first != r.off || last > end || (r.size >= 0 && total != r.size) {
		_ = resp.Body.Close()
		return modelsource.Unreachable(r.url, fmt.Errorf("the answer to bytes=%d-%d has Content-Range %q", r.off, end, resp.Header.Get("Content-Range")))
	}
	r.size, r.body, r.left = total, resp.Body, last-first+1
	return nil
}

// contentRange parses "bytes first-last/total".
func contentRange(v string) (first, last, total int64, ok bool) {
	rng, tot, found := strings.Cut(strings.TrimPrefix(v, "bytes "), "/")
	a, b, found2 := strings.Cut(rng, "-")
	if !found || !found2 || !strings.HasPrefix(v, "bytes ") {
		return 0, 0, 0, false
	}
	var err1, err2, err3 error
	first, err1 = strconv.ParseInt(a, 10, 64)
	last, err2 = strconv.ParseInt(b, 10, 64)
	total, err3 = strconv.ParseInt(tot, 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || first < 0 || last < first || total <= last {
		return 0, 0, 0, false
	}
	return first, last, total, true
}

// headerMirror serves checked GGUF headers to the parser on loopback: the parser
// reads the very bytes that passed the limits (a server that answered the check
// with one header and the parser with another gets nowhere), and never the remote
// server. The parser asks for the file's other shards by name; the mirror fetches
// and checks each on first request.
type headerMirror struct {
	ctx   context.Context
	fetch func(ctx context.Context, u string) (*remoteHeader, error)
	base  *url.URL // the remote URL of the first file
	srv   *http.Server
	ln    net.Listener

	mu      sync.Mutex
	headers map[string]*remoteHeader
	err     error // the first fetch error, to be returned instead of the parser's
}

func startMirror(ctx context.Context, remote string, first *remoteHeader,
	fetch func(context.Context, string) (*remoteHeader, error)) (*headerMirror, error) {
	base, err := url.Parse(remote)
	if err != nil {
		return nil, &ParamsError{Reason: fmt.Sprintf("URL %q: %v", remote, err)}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting the estimate's header mirror: %w", err)
	}
	m := &headerMirror{ctx: ctx, fetch: fetch, base: base, ln: ln,
		headers: map[string]*remoteHeader{path.Base(base.Path): first}}
	m.srv = &http.Server{Handler: m, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = m.srv.Serve(ln) }()
	return m, nil
}

// URL is where the parser reads the first file.
func (m *headerMirror) URL() string {
	return "http://" + m.ln.Addr().String() + "/" + url.PathEscape(path.Base(m.base.Path))
}

func (m *headerMirror) close() { _ = m.srv.Close() }

func (m *headerMirror) fetchErr() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

func (m *headerMirror) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name := path.Base(r.URL.Path)
	h, err := m.header(name)
	if err != nil {
		// The fetch read it again already (remoteAttempts), and its error is the
		// estimate's: a status the parser does not retry (it would for a 5xx, for
		// seconds).
		http.Error(w, err.Error(), http.StatusFailedDependency)
		return
	}
	http.ServeContent(w, r, name, time.Time{}, io.NewSectionReader(h, 0, h.size))
}

func (m *headerMirror) header(name string) (*remoteHeader, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h, ok := m.headers[name]; ok {
		return h, nil
	}
	if m.err != nil {
		return nil, m.err
	}
	u := *m.base
	u.Path = path.Join(path.Dir(u.Path), name)
	u.RawPath = ""
	h, err := m.fetch(m.ctx, u.String())
	if err != nil {
		m.err = err
		return nil, err
	}
	m.headers[name] = h
	return h, nil
}

// checkLocal scans the header of the local file at p and of its other shards.
func checkLocal(p string) error {
	paths := gguf.CompleteShardGGUFFilename(p)
	if paths == nil {
		paths = []string{p}
	}
	for _, sp := range paths {
		if err := scanFile(sp); err != nil {
			return err
		}
	}
	return nil
}

func scanFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("opening model file: %w", err)
	}
	defer func() { _ = f.Close() }()
	if _, err := ggufheader.Scan(f, Limits); err != nil {
		if errors.Is(err, ggufheader.ErrNotGGUF) {
			return &NotGGUFError{Location: p}
		}
		return &ParseError{Location: p, Err: err}
	}
	return nil
}
