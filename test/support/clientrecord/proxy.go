// Package clientrecord records what real API clients (Claude Code, Codex CLI) send: a
// reverse proxy that sits between a client and the gateway, keeps every request's
// method, path, headers (credentials removed) and body and the answer's status and
// body, and passes both on unchanged, streams included. Redact turns a recorded body
// into a golden fixture that keeps the request's shape but none of the vendor's text.
package clientrecord

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
)

// MaxBodyBytes bounds what is kept of one request or response body; the rest passes
// through unrecorded.
const MaxBodyBytes = 32 << 20

// Exchange is one request through the proxy and the answer to it.
type Exchange struct {
	Method string
	// Path is the request URI: path and query.
	Path string
	// Header is the request's headers, lowercase names, without credentials.
	Header map[string]string
	Body   []byte
	// Status is the upstream's status; 0 when it could not be reached.
	Status int
	// ResponseHeader is the answer's headers, lowercase names.
	ResponseHeader map[string]string
	// Response is the answer's body (an SSE stream as it arrived), complete once
	// Done.
	Response []byte
	// Done is set when the answer's body was read to its end or closed.
	Done bool
}

// credentialHeaders are never recorded.
var credentialHeaders = map[string]bool{
	"authorization": true, "x-api-key": true, "cookie": true, "proxy-authorization": true,
	"chatgpt-account-id": true,
}

// Proxy is the recording reverse proxy; its zero value is not usable, see New.
type Proxy struct {
	// Adjust, when set before the first request, returns the body passed on for a
	// request body; the recording keeps what the client sent. A test sets it to add
	// what its model needs and the client has no setting for (a bound on the answer's
	// length for a random-weight model that never stops).
	Adjust func(path string, body []byte) []byte

	rp *httputil.ReverseProxy

	mu        sync.Mutex
	exchanges []*Exchange
}

// New returns a proxy to upstream (a base URL such as http://127.0.0.1:8080).
func New(upstream string) (*Proxy, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, err
	}
	p := &Proxy{}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.Host = u.Host
		},
		// Flush every write: clients read SSE event by event.
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			x := exchangeOf(resp.Request)
			if x == nil {
				return nil
			}
			p.mu.Lock()
			x.Status, x.ResponseHeader = resp.StatusCode, flatten(resp.Header, nil)
			p.mu.Unlock()
			resp.Body = &teeBody{rc: resp.Body, p: p, x: x}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if x := exchangeOf(r); x != nil {
				p.mu.Lock()
				x.Response, x.Done = []byte(err.Error()), true
				p.mu.Unlock()
			}
			http.Error(w, "clientrecord: "+err.Error(), http.StatusBadGateway)
		},
	}
	return p, nil
}

type ctxKey struct{}

func exchangeOf(r *http.Request) *Exchange {
	x, _ := r.Context().Value(ctxKey{}).(*Exchange)
	return x
}

// ServeHTTP records the request and passes it on.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		http.Error(w, "clientrecord: reading the request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(body) > MaxBodyBytes {
		http.Error(w, "clientrecord: request body over the recording bound", http.StatusRequestEntityTooLarge)
		return
	}
	x := &Exchange{Method: r.Method, Path: r.URL.RequestURI(), Header: flatten(r.Header, credentialHeaders), Body: body}
	p.mu.Lock()
	p.exchanges = append(p.exchanges, x)
	p.mu.Unlock()
	if p.Adjust != nil {
		body = p.Adjust(r.URL.Path, body)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Del("Content-Length")
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, x)))
}

// Exchanges returns copies of the exchanges recorded so far, oldest first.
func (p *Proxy) Exchanges() []Exchange {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Exchange, len(p.exchanges))
	for i, x := range p.exchanges {
		out[i] = *x
		out[i].Body = bytes.Clone(x.Body)
		out[i].Response = bytes.Clone(x.Response)
	}
	return out
}

// Reset forgets the exchanges recorded so far.
func (p *Proxy) Reset() {
	p.mu.Lock()
	p.exchanges = nil
	p.mu.Unlock()
}

func flatten(h http.Header, drop map[string]bool) map[string]string {
	out := make(map[string]string, len(h))
	for k, vs := range h {
		k = strings.ToLower(k)
		if drop[k] {
			continue
		}
		out[k] = strings.Join(vs, ", ")
	}
	return out
}

// teeBody keeps what the client reads of an answer, up to MaxBodyBytes.
type teeBody struct {
	rc io.ReadCloser
	p  *Proxy
	x  *Exchange
}

func (t *teeBody) Read(b []byte) (int, error) {
	n, err := t.rc.Read(b)
	t.p.mu.Lock()
	if room := MaxBodyBytes - len(t.x.Response); room > 0 {
		t.x.Response = append(t.x.Response, b[:min(n, room)]...)
	}
	if err != nil {
		t.x.Done = true
	}
	t.p.mu.Unlock()
	return n, err
}

func (t *teeBody) Close() error {
	t.p.mu.Lock()
	t.x.Done = true
	t.p.mu.Unlock()
	return t.rc.Close()
}
