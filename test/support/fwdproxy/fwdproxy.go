// Package fwdproxy is an HTTP forward proxy on loopback for tests of downloads made
// through HTTPS_PROXY/HTTP_PROXY: it serves absolute-form requests and CONNECT
// tunnels, resolves the host names it is given itself (names nobody else can
// resolve, as an office proxy knows names its clients do not), and records each
// target.
package fwdproxy

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
)

// Proxy is a running forward proxy.
type Proxy struct {
	*httptest.Server
	hosts map[string]string // host:port asked for → the address dialled
	mu    sync.Mutex
	seen  []string
}

// New starts a proxy that sends requests for the host:port keys of hosts to their
// values and refuses every other target (502); Close stops it.
func New(hosts map[string]string) *Proxy {
	p := &Proxy{hosts: hosts}
	p.Server = httptest.NewServer(http.HandlerFunc(p.serve))
	return p
}

// Targets are the targets asked for so far, each "METHOD HOST:PORT".
func (p *Proxy) Targets() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen...)
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	host := r.Host
	if r.Method != http.MethodConnect {
		host = r.URL.Host
		if r.URL.Port() == "" {
			host += ":80"
		}
	}
	p.mu.Lock()
	p.seen = append(p.seen, r.Method+" "+host)
	p.mu.Unlock()
	addr, ok := p.hosts[host]
	if !ok {
		http.Error(w, "proxy: unknown host "+host, http.StatusBadGateway)
		return
	}
	if r.Method == http.MethodConnect {
		p.tunnel(w, addr)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.URL.Host = addr
	resp, err := (&http.Transport{}).RoundTrip(out)
	if err != nil {
		http.Error(w, "proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// tunnel answers a CONNECT and copies bytes both ways between the client and addr.
func (p *Proxy) tunnel(w http.ResponseWriter, addr string) {
	upstream, err := net.Dial("tcp", addr)
	if err != nil {
		http.Error(w, "proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	w.WriteHeader(http.StatusOK)
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		upstream.Close()
		return
	}
	go func() {
		_, _ = io.Copy(upstream, buf)
		upstream.Close()
	}()
	_, _ = io.Copy(conn, upstream)
	conn.Close()
}
