package httpserver

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// AnyHost in AllowedHosts turns the Host check off.
const AnyHost = "*"

// Hosts are the Host header values a server answers to. A web page can make a
// browser send requests to a server on the user's machine or LAN, and with DNS
// rebinding (its own name re-resolved to 127.0.0.1) even read the answers, as its
// own origin; the Host header still carries the page's name, so a server that
// answers only to its own names is out of its reach.
type Hosts struct {
	any      bool
	names    map[string]bool
	suffixes []string
}

// NewHosts answers to: IP literals (an origin that is an address cannot be rebound),
// localhost and *.localhost, the host of listen when it is a name, and allowed —
// names, ".example.com" for every name under example.com, or "*" for any Host.
func NewHosts(listen string, allowed []string) (*Hosts, error) {
	h := &Hosts{names: map[string]bool{}}
	if host, _, err := net.SplitHostPort(listen); err == nil && host != "" {
		h.names[normalHost(host)] = true
	}
	for _, a := range allowed {
		a = normalHost(strings.TrimSpace(a))
		switch {
		case a == AnyHost:
			h.any = true
		case a == "" || strings.ContainsAny(a, "*/:@ "):
			return nil, fmt.Errorf("allowed host %q: want a name (mymac.local), a domain with a leading dot (.example.com) or %s", a, AnyHost)
		case strings.HasPrefix(a, "."):
			h.suffixes = append(h.suffixes, a)
		default:
			h.names[a] = true
		}
	}
	return h, nil
}

// normalHost is a host in lower case without a trailing dot or IPv6 brackets.
func normalHost(h string) string {
	return strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(strings.ToLower(h), "["), "]"), ".")
}

// Allows reports whether a request whose Host header is hostport is for this server.
// An empty Host (HTTP/1.0, which no browser sends) is allowed.
func (h *Hosts) Allows(hostport string) bool {
	if h == nil || h.any || hostport == "" {
		return true
	}
	host := hostport
	if hh, _, err := net.SplitHostPort(hostport); err == nil {
		host = hh
	}
	host = normalHost(host)
	if net.ParseIP(host) != nil || host == "localhost" || strings.HasSuffix(host, ".localhost") || h.names[host] {
		return true
	}
	for _, s := range h.suffixes {
		if strings.HasSuffix(host, s) {
			return true
		}
	}
	return false
}

// Guard refuses what a browser sends on a web page's behalf to a server that should
// answer only its own clients: a request whose Host is not one of hosts (DNS
// rebinding), and a cross-origin request that changes something (POST, PUT,
// DELETE…: a page's form or fetch), as the browser marks it (Sec-Fetch-Site,
// Origin; http.CrossOriginProtection). curl and the SDKs send neither header and pass;
// so do the server's own pages. A refusal is a 403 in the shape of the API asked:
// Anthropic's on /v1/messages, OpenAI's elsewhere (the admin API's errors have that
// shape too).
func Guard(next http.Handler, hosts *Hosts) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		from := r.Header.Get("Origin")
		if from == "" {
			from = "another site (Sec-Fetch-Site: " + r.Header.Get("Sec-Fetch-Site") + ")"
		}
		Refuse(w, r, http.StatusForbidden, "cross_origin_refused", "cross-origin request refused: a web page of "+from+
			" may not call this server; call it from a program (curl, an SDK) or from its own origin")
	}))
	checked := cop.Handler(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hosts.Allows(r.Host) {
			name := r.Host
			if h, _, err := net.SplitHostPort(name); err == nil {
				name = h
			}
			Refuse(w, r, http.StatusForbidden, "host_not_allowed", fmt.Sprintf("Host %q is not a name of this server: "+
				"call it by a loopback name or an IP address, or start it with --allowed-hosts %s "+
				"(a web page's name re-resolved to this machine cannot reach it)", r.Host, name))
			return
		}
		checked.ServeHTTP(w, r)
	})
}

// Refuse answers status with message and code in the shape of the API r asked:
// Anthropic's error on /v1/messages, OpenAI's elsewhere.
func Refuse(w http.ResponseWriter, r *http.Request, status int, code, message string) {
	var body any = map[string]any{"error": map[string]any{"message": message, "type": "permission_error", "param": nil, "code": code}}
	if r.URL.Path == "/v1/messages" || strings.HasPrefix(r.URL.Path, "/v1/messages/") {
		body = map[string]any{"type": "error", "error": map[string]any{"type": "permission_error", "message": message}}
	}
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
