package console

import (
	"crypto/rand"
	"encoding/base64"
	"math"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/macfleet/macfleet/internal/httpserver"
)

// A signed-in browser holds an opaque session id, never the API key: the key stays
// in the gateway's memory (sessions), so a cookie read off a machine or a proxy's log
// is worth one session until sign-out or SessionTTL, not the key itself. Sign-out ends
// the session at the gateway, so the cookie is refused from then on, whoever holds it.
// Sessions live in the gateway process that signed the user in: behind several gateway
// replicas the console's route needs session affinity (docs/tenancy.md).

// Defaults of the console's sessions and sign-in limit.
const (
	// SessionTTL is how long a session lasts after sign-in.
	SessionTTL = 12 * time.Hour
	// MaxSessions bounds the sessions held; past it the one closest to its end goes.
	MaxSessions = 10_000
	// LoginBurst sign-ins from one source address (an IPv6 /64) are answered at once,
	// then one every LoginEvery: past that, 429 with Retry-After.
	LoginBurst = 10
	LoginEvery = 6 * time.Second
	// maxLoginSources bounds the per-source buckets; past it they start afresh.
	maxLoginSources = 4096
)

type session struct {
	key     string
	expires time.Time
}

// sessions are the console's signed-in browsers: an opaque id each, naming a key.
type sessions struct {
	mu sync.Mutex
	m  map[string]session
}

func newSessions() *sessions { return &sessions{m: map[string]session{}} }

// start is a new session of key, lasting until now+SessionTTL: its id, 256 random
// bits.
func (s *sessions) start(key string, now time.Time) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	id := base64.RawURLEncoding.EncodeToString(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.m) >= MaxSessions {
		s.dropLocked(now)
	}
	s.m[id] = session{key: key, expires: now.Add(SessionTTL)}
	return id
}

// dropLocked removes the ended sessions, or, when none has, the one closest to its end.
func (s *sessions) dropLocked(now time.Time) {
	var first string
	for id, v := range s.m {
		if !now.Before(v.expires) {
			delete(s.m, id)
		} else if first == "" || v.expires.Before(s.m[first].expires) {
			first = id
		}
	}
	if len(s.m) >= MaxSessions {
		delete(s.m, first)
	}
}

// key is the key of session id at now; false when there is no such session, or it
// has ended.
func (s *sessions) key(id string, now time.Time) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[id]
	if !ok {
		return "", false
	}
	if !now.Before(v.expires) {
		delete(s.m, id)
		return "", false
	}
	return v.key, true
}

// end removes session id.
func (s *sessions) end(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

// loginLimit is the token bucket of sign-ins per source address.
type loginLimit struct {
	mu      sync.Mutex
	sources map[string]*rate.Limiter
}

func newLoginLimit() *loginLimit { return &loginLimit{sources: map[string]*rate.Limiter{}} }

// allow takes one sign-in from source's bucket at now, or says how long until the
// bucket holds one again.
func (l *loginLimit) allow(source string, now time.Time) (ok bool, retry time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.sources[source]
	if b == nil {
		if len(l.sources) >= maxLoginSources {
			clear(l.sources)
		}
		b = rate.NewLimiter(rate.Every(LoginEvery), LoginBurst)
		l.sources[source] = b
	}
	if b.AllowN(now, 1) {
		return true, 0
	}
	missing := 1 - b.TokensAt(now)
	return false, max(time.Duration(math.Ceil(missing*LoginEvery.Seconds()))*time.Second, time.Second)
}

// overTLS says whether the browser reached the console over TLS: the connection is
// TLS, or it comes from a trusted proxy (a TLS ingress) that says so in
// X-Forwarded-Proto. The session cookie is Secure then.
func overTLS(r *http.Request, trusted []netip.Prefix) bool {
	if r.TLS != nil {
		return true
	}
	if r.Header.Get("X-Forwarded-Proto") != "https" {
		return false
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	ip = ip.Unmap()
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// sourceOf is the address a sign-in counts against.
func sourceOf(r *http.Request) string { return httpserver.SourceOf(r.RemoteAddr) }
