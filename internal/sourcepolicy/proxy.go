package sourcepolicy

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"

	"golang.org/x/net/http/httpproxy"
)

// proxyRoute sends a transport's requests through the HTTP(S) proxy the environment
// names (HTTPS_PROXY, HTTP_PROXY, NO_PROXY, read when the transport is made), as
// net/http does, while keeping the policy's address checks: the proxy itself is the
// operator's and is dialled unchecked; a target the client can resolve is checked
// against the policy before the proxy is asked for it (a literal address always),
// and one it cannot resolve (an office network whose names only the proxy knows) is
// left to the proxy.
type proxyRoute struct {
	h       *Holder
	proxyOf func(*url.URL) (*url.URL, error)
	mu      sync.Mutex
	proxies map[string]bool // host:port of the proxies handed out
}

// newProxyRoute is the environment's proxy route, nil when it names no proxy.
func newProxyRoute(h *Holder) *proxyRoute {
	cfg := httpproxy.FromEnvironment()
	if cfg.HTTPProxy == "" && cfg.HTTPSProxy == "" {
		return nil
	}
	return &proxyRoute{h: h, proxyOf: cfg.ProxyFunc(), proxies: map[string]bool{}}
}

// proxy is the transport's Proxy.
func (r *proxyRoute) proxy(req *http.Request) (*url.URL, error) {
	u, err := r.proxyOf(req.URL)
	if err != nil || u == nil {
		return u, err
	}
	if err := r.checkTarget(req.Context(), req.URL.Hostname()); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.proxies[proxyAddr(u)] = true
	r.mu.Unlock()
	return u, nil
}

// checkTarget refuses a proxied target whose address the policy denies.
func (r *proxyRoute) checkTarget(ctx context.Context, host string) error {
	if ip, err := netip.ParseAddr(host); err == nil {
		return r.h.Policy().DecideAddr(ip).Err("", host)
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil // only the proxy can resolve it
	}
	for _, ip := range ips {
		if err := r.h.Policy().DecideAddr(ip).Err("", host); err != nil {
			return err
		}
	}
	return nil
}

// dial makes a proxy's connections with plain, and every other with guarded.
func (r *proxyRoute) dial(plain, guarded *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		r.mu.Lock()
		isProxy := r.proxies[addr]
		r.mu.Unlock()
		if isProxy {
			return plain.DialContext(ctx, network, addr)
		}
		return guarded.DialContext(ctx, network, addr)
	}
}

// proxyAddr is the host:port net/http dials for the proxy u.
func proxyAddr(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := map[string]string{"http": "80", "https": "443", "socks5": "1080", "socks5h": "1080"}[u.Scheme]
	return net.JoinHostPort(u.Hostname(), port)
}
