package mgrhttp

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/healthz"
)

func TestListen(t *testing.T) {
	given, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer given.Close()
	tests := []struct {
		name string
		ln   net.Listener
		addr string
		want string // "given", "none" or "new"
	}{
		{"a listener wins over an address", given, "127.0.0.1:0", "given"},
		{"0 disables", nil, "0", "none"},
		{"empty disables", nil, "", "none"},
		{"an address is listened on", nil, "127.0.0.1:0", "new"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ln, err := Listen(tt.ln, tt.addr)
			if err != nil {
				t.Fatal(err)
			}
			got := "new"
			switch {
			case ln == nil:
				got = "none"
			case ln == given:
				got = "given"
			}
			if got != tt.want {
				t.Fatalf("Listen(%v, %q) gave %s, want %s", tt.ln, tt.addr, got, tt.want)
			}
			if got == "new" {
				defer ln.Close()
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					t.Fatalf("dialing the new listener: %v", err)
				}
				c.Close()
			}
		})
	}
	if _, err := Listen(nil, given.Addr().String()); err == nil {
		t.Error("Listen on an address in use succeeded")
	}
}

// TestFailedCheckIsUnavailable: a failing probe answers 503 (do not send traffic
// here), a passing one 200.
func TestFailedCheckIsUnavailable(t *testing.T) {
	for _, fail := range []bool{false, true} {
		h := unavailable(&healthz.Handler{Checks: map[string]healthz.Checker{"c": func(*http.Request) error {
			if fail {
				return errors.New("draining")
			}
			return nil
		}}})
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		want := http.StatusOK
		if fail {
			want = http.StatusServiceUnavailable
		}
		if rec.Code != want {
			t.Errorf("check failing %v: %d, want %d", fail, rec.Code, want)
		}
	}
}
