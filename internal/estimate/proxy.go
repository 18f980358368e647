package estimate

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// DialFunc connects to network address, or refuses to.
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// dialProxy is a forward HTTP proxy on loopback that makes every outgoing
// connection through dial. The GGUF parser builds its own HTTP client, so the only
// way to make its connections go through a checked dialer is to hand it this proxy:
// plain http requests are forwarded, https ones tunnelled with CONNECT.
type dialProxy struct {
	dial DialFunc
	srv  *http.Server
	ln   net.Listener
	tr   *http.Transport

	mu sync.Mutex
	// err is the first dial error, to be returned instead of the parser's untyped one.
	err error
}

func startDialProxy(dial DialFunc) (*dialProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting the estimate's proxy: %w", err)
	}
	p := &dialProxy{dial: dial, ln: ln}
	p.tr = &http.Transport{DialContext: p.dialContext, ResponseHeaderTimeout: 30 * time.Second, DisableCompression: true}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

// URL is the proxy's address for the parser.
func (p *dialProxy) URL() *url.URL { return &url.URL{Scheme: "http", Host: p.ln.Addr().String()} }

// dialErr is the first dial error, nil when every dial succeeded.
func (p *dialProxy) dialErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func (p *dialProxy) close() {
	_ = p.srv.Close()
	p.tr.CloseIdleConnections()
}

func (p *dialProxy) dialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := p.dial(ctx, network, address)
	if err != nil {
		p.mu.Lock()
		if p.err == nil {
			p.err = err
		}
		p.mu.Unlock()
	}
	return c, err
}

func (p *dialProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		p.tunnel(w, r)
		return
	}
	if r.URL.Host == "" {
		http.Error(w, "not a proxy request", http.StatusBadRequest)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.Header.Del("Proxy-Connection")
	resp, err := p.tr.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer func() { _ = resp.Body.Close() }()
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

func (p *dialProxy) tunnel(w http.ResponseWriter, r *http.Request) {
	up, err := p.dialContext(r.Context(), "tcp", r.Host)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		_ = up.Close()
		http.Error(w, "cannot tunnel", http.StatusInternalServerError)
		return
	}
	down, buf, err := hj.Hijack()
	if err != nil {
		_ = up.Close()
		return
	}
	if _, err := down.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		_ = up.Close()
		_ = down.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		// Bytes the client sent after the CONNECT request are in buf.
		_, _ = io.Copy(up, buf)
		closeWrite(up)
	})
	wg.Go(func() {
		_, _ = io.Copy(down, up)
		closeWrite(down)
	})
	wg.Wait()
	_ = up.Close()
	_ = down.Close()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}
