package console

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"
)

// TestSessions: a session names its key until it ends, by sign-out or SessionTTL;
// ids are opaque and distinct; a full store drops the session closest to its end.
func TestSessions(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	s := newSessions()
	a, b := s.start("key-a", t0), s.start("key-b", t0.Add(time.Minute))
	if a == b || len(a) < 43 {
		t.Fatalf("session ids %q and %q: want distinct 256-bit ids", a, b)
	}
	for _, tc := range []struct {
		id   string
		at   time.Time
		want string
	}{
		{a, t0.Add(SessionTTL - time.Second), "key-a"},
		{b, t0, "key-b"},
		{"forged", t0, ""},
		{a, t0.Add(SessionTTL), ""},
	} {
		if k, _ := s.key(tc.id, tc.at); k != tc.want {
			t.Errorf("key(%q, +%v) = %q, want %q", tc.id, tc.at.Sub(t0), k, tc.want)
		}
	}
	s.end(b)
	if _, ok := s.key(b, t0); ok {
		t.Error("a session still names its key after sign-out")
	}

	full := newSessions()
	first := full.start("k", t0)
	for i := 1; i < MaxSessions; i++ {
		full.start("k", t0.Add(time.Second))
	}
	full.start("k", t0.Add(2*time.Second))
	if _, ok := full.key(first, t0); ok || len(full.m) != MaxSessions {
		t.Errorf("a full store kept the session closest to its end (%d sessions)", len(full.m))
	}
}

// TestLoginLimit: a source's burst, then one sign-in every LoginEvery, with the wait
// said; another source has its own bucket.
func TestLoginLimit(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	l := newLoginLimit()
	for i := range LoginBurst {
		if ok, _ := l.allow("10.0.0.1", t0); !ok {
			t.Fatalf("sign-in %d within the burst refused", i+1)
		}
	}
	if ok, retry := l.allow("10.0.0.1", t0); ok || retry != LoginEvery {
		t.Errorf("past the burst: allowed %v, retry %v; want refused, retry %v", ok, retry, LoginEvery)
	}
	if ok, _ := l.allow("10.0.0.2", t0); !ok {
		t.Error("another source refused")
	}
	if ok, _ := l.allow("10.0.0.1", t0.Add(LoginEvery)); !ok {
		t.Error("refused after waiting LoginEvery")
	}
}

func TestOverTLS(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, tc := range []struct {
		name, remote, proto string
		tls                 bool
		want                bool
	}{
		{"a TLS connection", "192.0.2.1:1", "", true, true},
		{"plain HTTP", "192.0.2.1:1", "", false, false},
		{"https from a trusted proxy", "10.1.2.3:1", "https", false, true},
		{"https from a trusted proxy over IPv4-mapped IPv6", "[::ffff:10.1.2.3]:1", "https", false, true},
		{"http from a trusted proxy", "10.1.2.3:1", "http", false, false},
		{"https claimed by anyone else", "192.0.2.1:1", "https", false, false},
	} {
		r := httptest.NewRequest(http.MethodPost, "/ui/login", nil)
		r.RemoteAddr = tc.remote
		if tc.proto != "" {
			r.Header.Set("X-Forwarded-Proto", tc.proto)
		}
		if tc.tls {
			r.TLS = &tls.ConnectionState{}
		}
		if got := overTLS(r, trusted); got != tc.want {
			t.Errorf("%s: overTLS = %v, want %v", tc.name, got, tc.want)
		}
	}
}
