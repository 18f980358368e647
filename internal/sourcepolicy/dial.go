package sourcepolicy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/macfleet/macfleet/internal/modelsource"
)

// DeniedError is a source, or an address, the policy does not allow. The type lives
// with the source parser on the ground floor (modelsource.DeniedError) so the memory
// estimate, which reads sources, can recognise a refusal without importing the policy.
type DeniedError = modelsource.DeniedError

// Err returns a *DeniedError for a denied decision, nil for an allowed one.
func (d Decision) Err(namespace, src string) error {
	if d.Allowed {
		return nil
	}
	return &DeniedError{Namespace: namespace, Source: src, Reason: d.Reason}
}

// IsDenied reports whether err is, or wraps, a *DeniedError.
func IsDenied(err error) bool {
	var de *DeniedError
	return errors.As(err, &de)
}

// Holder holds the current policy for the readers that need it on every connection.
// The zero value holds Default(). It is safe for concurrent use.
type Holder struct {
	p atomic.Pointer[Policy]
}

// NewHolder returns a holder of p (Default() when nil).
func NewHolder(p *Policy) *Holder {
	h := &Holder{}
	h.Set(p)
	return h
}

// Policy returns the current policy.
func (h *Holder) Policy() *Policy {
	if h == nil {
		return Default()
	}
	if p := h.p.Load(); p != nil {
		return p
	}
	return Default()
}

// Set replaces the policy; nil means Default().
func (h *Holder) Set(p *Policy) { h.p.Store(p) }

// Control is a net.Dialer Control hook that refuses to connect to an address the
// current policy denies. It runs after name resolution, on the address actually
// dialled, so DNS answers cannot smuggle a denied address past it.
func (h *Holder) Control(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		host = address
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return &DeniedError{Source: address, Reason: fmt.Sprintf("cannot check the address %q a model fetch dials: %v", address, err)}
	}
	return h.Policy().DecideAddr(ip).Err("", address)
}

// Dialer returns a dialer with the usual timeouts whose connections the policy
// checks.
func (h *Holder) Dialer() *net.Dialer {
	return &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: h.Control}
}

// Transport returns a clone of base (http.DefaultTransport's settings when nil) that
// dials through h.Dialer. It uses the proxy the environment names (HTTPS_PROXY,
// HTTP_PROXY, NO_PROXY, read now), checking what it can of each target first
// (proxyRoute); with none set it connects directly.
func (h *Holder) Transport(base *http.Transport) *http.Transport {
	if base == nil {
		base = http.DefaultTransport.(*http.Transport)
	}
	t := base.Clone()
	t.Proxy = nil
	d := h.Dialer()
	t.DialContext = d.DialContext
	if r := newProxyRoute(h); r != nil {
		t.Proxy = r.proxy
		t.DialContext = r.dial(&net.Dialer{Timeout: d.Timeout, KeepAlive: d.KeepAlive}, d)
	}
	t.DialTLSContext = nil
	t.Dial = nil    //nolint:staticcheck // cleared so that DialContext is used
	t.DialTLS = nil //nolint:staticcheck // cleared so that DialContext is used
	return t
}

// sourceKey is the context key of ForSource.
type sourceKey struct{}

type sourceCtx struct{ namespace, source string }

// ForSource returns ctx for requests that fetch the http(s) source raw for
// namespace: the clients from Holder.Client check every redirect's target against
// the namespace's hosts, as they would the source itself. Registry sources (hf://,
// ollama://) need not: their hubs redirect to CDNs whose addresses are still checked.
func ForSource(ctx context.Context, namespace, raw string) context.Context {
	return context.WithValue(ctx, sourceKey{}, sourceCtx{namespace: namespace, source: raw})
}

// DecideRedirect says whether a fetch may follow a redirect from one URL to the next
// whatever the rules: not from https:// to plain http://, which would hand the rest of
// the exchange (and a registry's token, and the file) to anyone on the path. A source
// that is meant to be fetched over plain HTTP must name its http:// URL itself, on a
// rule with allowPlainHTTP.
func DecideRedirect(from, to *url.URL) Decision {
	if strings.EqualFold(from.Scheme, "https") && !strings.EqualFold(to.Scheme, "https") {
		return deny("%s redirects to %s, from https:// to plain %s://, which model fetches never follow: "+
			"ask the source's owner to redirect to https://, or use the final URL as the source (a plain http:// one needs allowPlainHTTP on its rule)",
			redactURL(from), redactURL(to), strings.ToLower(to.Scheme))
	}
	return allow()
}

// redactURL is u without its query, which may hold a signed URL's credentials.
func redactURL(u *url.URL) string {
	c := *u
	c.RawQuery, c.Fragment, c.User = "", "", nil
	return c.String()
}

// maxRedirects is as many redirects as net/http follows by default.
const maxRedirects = 10

// Client returns a copy of c (a new client when nil) whose transport checks the
// policy on every connection: an *http.Transport is cloned and guarded, a nil one is
// http.DefaultTransport's settings guarded. Another RoundTripper is kept as it is: its
// owner answers for where it connects. No redirect may go from https:// to plain
// http:// (DecideRedirect), and redirects of requests made with a ForSource context
// must lead to hosts the namespace may use.
func (h *Holder) Client(c *http.Client) *http.Client {
	var out http.Client
	if c != nil {
		out = *c
	}
	next := out.CheckRedirect
	out.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		sc, hasSource := req.Context().Value(sourceKey{}).(sourceCtx)
		if d := DecideRedirect(via[len(via)-1].URL, req.URL); !d.Allowed {
			return &DeniedError{Namespace: sc.namespace, Source: sc.source, Reason: d.Reason}
		}
		if hasSource {
			target := req.URL.String()
			if d := h.Policy().DecideSource(sc.namespace, target); !d.Allowed {
				return &DeniedError{Namespace: sc.namespace, Source: sc.source,
					Reason: fmt.Sprintf("%s redirects to %s: %s", via[len(via)-1].URL, target, d.Reason)}
			}
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= maxRedirects {
			return fmt.Errorf("stopped after %d redirects", maxRedirects)
		}
		return nil
	}
	switch t := out.Transport.(type) {
	case nil:
		out.Transport = h.Transport(nil)
	case *http.Transport:
		out.Transport = h.Transport(t)
	}
	return &out
}
