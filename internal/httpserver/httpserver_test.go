package httpserver

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestHostsAllows(t *testing.T) {
	h, err := NewHosts("mymac.lan:8080", []string{"studio.local", ".corp.example"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		host string
		want bool
	}{
		{"127.0.0.1:8080", true},
		{"[::1]:8080", true},
		{"192.168.1.20:8080", true},
		{"localhost:8080", true},
		{"LOCALHOST.:8080", true},
		{"app.localhost:8080", true},
		{"mymac.lan:8080", true},
		{"studio.local", true},
		{"gpu.corp.example:8080", true},
		{"", true},
		{"evil.example:8080", false},
		{"evil.example", false},
		{"localhost.evil.example:8080", false},
		{"corp.example.evil:8080", false},
		{"studio.local.evil.example", false},
	}
	for _, tt := range tests {
		if got := h.Allows(tt.host); got != tt.want {
			t.Errorf("Allows(%q) = %v, want %v", tt.host, got, tt.want)
		}
	}
	anyHost, err := NewHosts("127.0.0.1:0", []string{"*"})
	if err != nil || !anyHost.Allows("evil.example:80") {
		t.Errorf("with * every Host is allowed: %v", err)
	}
	for _, bad := range []string{"", "*.example.com", "http://x", "a:80"} {
		if _, err := NewHosts("", []string{bad}); err == nil || !strings.Contains(err.Error(), "want a name") {
			t.Errorf("NewHosts(%q) = %v, want an error saying what is wanted", bad, err)
		}
	}
}

func TestGuard(t *testing.T) {
	hosts, err := NewHosts("127.0.0.1:8080", nil)
	if err != nil {
		t.Fatal(err)
	}
	h := Guard(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "served") }), hosts)
	tests := []struct {
		name, method, path, host string
		hdr                      map[string]string
		wantStatus               int
		wantCode                 string // "" for a served request; the error code else
		anthropic                bool
	}{
		{name: "curl", method: "POST", path: "/api/models/m/unload", host: "127.0.0.1:8080", wantStatus: 200},
		{name: "an SDK by name", method: "POST", path: "/v1/chat/completions", host: "localhost:8080",
			hdr: map[string]string{"Content-Type": "application/json"}, wantStatus: 200},
		{name: "its own page", method: "POST", path: "/v1/chat/completions", host: "localhost:8080",
			hdr: map[string]string{"Origin": "http://localhost:8080", "Sec-Fetch-Site": "same-origin"}, wantStatus: 200},
		{name: "a cross-site form", method: "POST", path: "/api/models/m/unload", host: "127.0.0.1:8080",
			hdr: map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, wantStatus: 403, wantCode: "cross_origin_refused"},
		{name: "an old browser's cross-origin fetch", method: "POST", path: "/v1/chat/completions", host: "127.0.0.1:8080",
			hdr: map[string]string{"Origin": "https://evil.example"}, wantStatus: 403, wantCode: "cross_origin_refused"},
		{name: "cross-site on the Anthropic API", method: "POST", path: "/v1/messages", host: "127.0.0.1:8080",
			hdr: map[string]string{"Sec-Fetch-Site": "cross-site"}, wantStatus: 403, anthropic: true},
		{name: "a cross-site GET reads nothing without CORS", method: "GET", path: "/v1/models", host: "127.0.0.1:8080",
			hdr: map[string]string{"Sec-Fetch-Site": "cross-site"}, wantStatus: 200},
		{name: "DNS rebinding", method: "GET", path: "/api/status", host: "evil.example:8080",
			hdr: map[string]string{"Sec-Fetch-Site": "same-origin"}, wantStatus: 403, wantCode: "host_not_allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(tt.method, "http://"+tt.host+tt.path, strings.NewReader("{}"))
			r.Host = tt.host
			for k, v := range tt.hdr {
				r.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			if rec.Code != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.wantStatus, rec.Body)
			}
			if tt.wantStatus == 200 {
				return
			}
			var body struct {
				Type  string `json:"type"`
				Error struct {
					Type, Message, Code string
				} `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error.Message == "" {
				t.Fatalf("not an error body: %s", rec.Body)
			}
			if tt.anthropic != (body.Type == "error") || body.Error.Type != "permission_error" || body.Error.Code != tt.wantCode {
				t.Errorf("error body %s: want the %s shape with code %q", rec.Body, map[bool]string{true: "Anthropic", false: "OpenAI"}[tt.anthropic], tt.wantCode)
			}
		})
	}
}

// serve runs New(h, l) on a capped loopback listener.
func serve(t *testing.T, h http.Handler, l Limits) string {
	t.Helper()
	ln, err := Listen("127.0.0.1:0", l)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(h, l)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// TestStreamsOutliveTheBodyTimeout: a response that streams for several body timeouts,
// after a GET and after a POST whose body was read, arrives whole.
func TestStreamsOutliveTheBodyTimeout(t *testing.T) {
	const bodyTimeout = 200 * time.Millisecond
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc := http.NewResponseController(w)
		for i := range 8 {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(bodyTimeout / 2):
			}
			fmt.Fprintf(w, "data: %d\n\n", i)
			_ = rc.Flush()
		}
	}), Limits{BodyTimeout: bodyTimeout})
	for _, method := range []string{"GET", "POST"} {
		var body io.Reader
		if method == "POST" {
			body = strings.NewReader(`{"stream":true}`)
		}
		req, _ := http.NewRequest(method, "http://"+addr+"/", body)
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || strings.Count(string(b), "data: ") != 8 || time.Since(start) < 2*bodyTimeout {
			t.Errorf("%s: stream of %s cut: %q (%v)", method, time.Since(start), b, err)
		}
	}
}

// TestTrickledBodyIsCut: a body that does not arrive within the body timeout ends the
// request with ErrBodyTimeout.
func TestTrickledBodyIsCut(t *testing.T) {
	got := make(chan error, 1)
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		got <- err
		http.Error(w, "late", http.StatusRequestTimeout)
	}), Limits{BodyTimeout: 300 * time.Millisecond})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
	select {
	case err := <-got:
		if !errors.Is(err, ErrBodyTimeout) {
			t.Errorf("reading the body: %v, want ErrBodyTimeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a body trickled for 10s was not cut by a 300ms body timeout")
	}
}

// TestConnectionCap: past the cap with every connection busy, a connection gets a 503
// at once while the busy ones are still served; once they wait idle, a new
// connection takes the slot of the oldest idle one and is served.
func TestConnectionCap(t *testing.T) {
	release, held := make(chan struct{}), make(chan struct{}, 2)
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			held <- struct{}{}
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	}), Limits{MaxConnections: 2, MaxConnectionsPerSource: 2})
	send := func(c net.Conn, path string) {
		if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
			t.Fatal(err)
		}
	}
	read := func(c net.Conn) (string, error) {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.Status + " " + string(b), nil
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	busy := []net.Conn{dial(), dial()}
	for _, c := range busy {
		send(c, "/hold")
		<-held
	}
	extra := dial()
	send(extra, "/")
	if got, err := read(extra); err != nil || !strings.HasPrefix(got, "503 Service Unavailable") || !strings.Contains(got, "too_many_connections") {
		t.Fatalf("past the cap of 2 busy connections: %q %v, want a 503", got, err)
	}
	close(release)
	for _, c := range busy {
		if got, err := read(c); err != nil || got != "200 OK ok" {
			t.Fatalf("a busy connection past the cap: %q %v", got, err)
		}
	}
	c := dial()
	send(c, "/")
	if got, err := read(c); err != nil || got != "200 OK ok" {
		t.Fatalf("with both others idle, a new connection: %q %v, want it served in an idle one's slot", got, err)
	}
	closed := 0
	for _, b := range busy {
		send(b, "/")
		if _, err := read(b); err != nil {
			closed++
		}
	}
	if closed != 1 {
		t.Errorf("%d of the 2 idle connections were closed for the new one, want 1", closed)
	}
}
