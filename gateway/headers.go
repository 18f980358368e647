package gateway

import (
	"net"
	"net/http"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/console"
	"github.com/macfleet/macfleet/internal/chat/compat"
)

// hopHeaders are connection-level headers that a proxy must not forward.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// clientHeaders are the X-Macfleet- request headers a client may send on to the agent;
// every other one is the gateway's to set (replica, queue, gateway id, the caller's
// cache partition) and is dropped from the client's request, so that no client can
// pose as another tenant to an agent.
var clientHeaders = map[string]bool{runnerapi.HeaderPromptUsage: true, console.ConsoleHeader: true, HeaderPriority: true,
	runnerapi.HeaderSpeculation: true}

// copyRequestHeaders copies the client's headers except the hop-by-hop ones, its API
// key (the agent gets the fleet token instead), its length (the body is replayed) and
// the X-Macfleet- headers that only the gateway sets.
func copyRequestHeaders(dst http.Header, r *http.Request) {
	skip := connectionTokens(r.Header)
	for k, vs := range r.Header {
		if skip[k] || isHop(k) {
			continue
		}
		switch k {
		case "Authorization", "X-Api-Key", "Content-Length", "X-Forwarded-For":
			continue
		}
		if strings.HasPrefix(k, "X-Macfleet-") && !clientHeaders[k] {
			continue
		}
		dst[k] = vs
	}
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := r.Header.Values("X-Forwarded-For"); len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		dst.Set("X-Forwarded-For", ip)
	}
}

// responseHeaders are the agent's response headers that reach the client: what
// describes the body, when to retry, and the hints the API ignored. Every other one is
// dropped, so that an agent — a Mac the gateway does not vouch for — cannot set a
// cookie on the gateway's origin, grant other sites CORS access to it, or pass the
// gateway's internal X-Macfleet- headers (usage, replica, queue) to the client.
var responseHeaders = map[string]bool{"Content-Type": true, "Content-Length": true, "Content-Encoding": true,
	"Cache-Control": true, "Retry-After": true, "X-Content-Type-Options": true, compat.IgnoredHintsHeader: true}

// copyResponseHeaders copies the agent's response headers of responseHeaders.
func copyResponseHeaders(dst, src http.Header) {
	for k, vs := range src {
		if responseHeaders[k] {
			dst[k] = vs
		}
	}
}

func isHop(k string) bool {
	for _, h := range hopHeaders {
		if k == h {
			return true
		}
	}
	return false
}

// connectionTokens are the headers a Connection header names as hop-by-hop.
func connectionTokens(h http.Header) map[string]bool {
	vs := h.Values("Connection")
	if len(vs) == 0 {
		return nil
	}
	m := map[string]bool{}
	for _, v := range vs {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				m[http.CanonicalHeaderKey(f)] = true
			}
		}
	}
	return m
}
