package standalone_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/agent/standalone"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/internal/httpserver"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

// servedMac is `macfleet serve` on a developer's Mac: the standalone agent on real
// runners with a Resident tiny model "m" loaded, on a loopback port, without a key.
type servedMac struct {
	addr string // host:port
	logs *syncBuffer
}

func serveMac(t *testing.T, limits httpserver.Limits) *servedMac {
	t.Helper()
	runner := os.Getenv(runnerproc.RunnerEnv)
	if runner == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	cfg, err := config.Config{Runner: runner, RunnerThreads: 1, MemoryCeiling: 2 << 30, Listen: "127.0.0.1:0",
		Models: []config.Model{{Name: "m", Path: tinyModel(t), Settings: engine.Settings{ContextLength: 4096}, Residency: config.ResidencyResident}}}.Complete()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &servedMac{addr: ln.Addr().String(), logs: &syncBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- standalone.Run(ctx, cfg, standalone.Options{Log: funcr.New(s.logs.line, funcr.Options{}), Listener: ln,
			Limits: limits, Pool: enginepool.Config{DrainTimeout: time.Second, SettleTimeout: time.Second}})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			t.Error("Run did not return")
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		if resp, err := http.Get("http://" + s.addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned before it was ready: %v\n%s", err, s.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after a minute:\n%s", s.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// state is the model's state as /api/status tells a local client.
func (s *servedMac) state(t *testing.T) enginepool.State {
	t.Helper()
	resp, err := http.Get("http://" + s.addr + "/api/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st server.StatusResponse
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || len(st.Models) != 1 {
		t.Fatalf("status: %v %+v", err, st)
	}
	return st.Models[0].State
}

// browserPost sends what a browser sends for a web page's cross-site form or
// no-cors fetch: a "simple" POST (text/plain, no preflight) with the page's Origin.
func browserPost(t *testing.T, url string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Content-Type", "text/plain;charset=UTF-8")
	req.Header.Set("Origin", "https://evil.example")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	req.Header.Set("Sec-Fetch-Mode", "no-cors")
	req.Header.Set("User-Agent", "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7)")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAttackCrossOriginPostToServe: a web page the developer visits POSTs to
// `macfleet serve` on localhost to unload its model and to spend it on a chat
// completion; the attacker must now get a 403 and the model stays loaded, unused.
func TestAttackCrossOriginPostToServe(t *testing.T) {
	s := serveMac(t, httpserver.Limits{})
	base := "http://" + s.addr
	if code, body := browserPost(t, base+"/api/models/m/unload"); code != http.StatusForbidden || !strings.Contains(body, "cross_origin_refused") {
		t.Errorf("a cross-site POST to unload: %d %s; want 403 cross_origin_refused", code, body)
	}
	if code, body := browserPost(t, base+"/v1/chat/completions"); code != http.StatusForbidden || !strings.Contains(body, `"error"`) {
		t.Errorf("a cross-site POST to the chat API: %d %s; want a 403 OpenAI error", code, body)
	}
	if code, body := browserPost(t, base+"/v1/messages"); code != http.StatusForbidden || !strings.Contains(body, `"type":"error"`) {
		t.Errorf("a cross-site POST to the Messages API: %d %s; want a 403 Anthropic error", code, body)
	}
	if st := s.state(t); st != enginepool.StateReady {
		t.Errorf("the model is %s after the page's requests; want it still %s", st, enginepool.StateReady)
	}
	// The developer's own tools (curl, the SDKs) send no Origin and still work.
	resp, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a local client's chat: %d, want 200", resp.StatusCode)
	}
}

// TestAttackDNSRebindingReadsServe: a web page whose name evil.example is re-resolved
// to 127.0.0.1 reads `macfleet serve`'s status and calls its API as its own origin
// (the browser sends Host: evil.example); the attacker must now get a 403 naming
// --allowed-hosts, and nothing of the status.
func TestAttackDNSRebindingReadsServe(t *testing.T) {
	s := serveMac(t, httpserver.Limits{})
	_, port, _ := net.SplitHostPort(s.addr)
	for _, path := range []string{"/api/status", "/v1/models"} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+s.addr+path, nil)
		req.Host = "evil.example:" + port // what the browser sends after the rebinding
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "--allowed-hosts") || strings.Contains(string(b), "tiny.gguf") {
			t.Errorf("GET %s as evil.example: %d %s; want a 403 naming --allowed-hosts", path, resp.StatusCode, b)
		}
	}
	// By its own names it still answers.
	for _, host := range []string{"localhost:" + port, s.addr} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+s.addr+"/api/status", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET /api/status as %s: %d, want 200", host, resp.StatusCode)
		}
	}
}

// TestAttackSlowlorisOnServe: a client sends its request body a byte at a time to
// hold a connection and a handler forever; the attacker must now be cut once the
// body timeout passes.
func TestAttackSlowlorisOnServe(t *testing.T) {
	const bodyTimeout = time.Second
	s := serveMac(t, httpserver.Limits{BodyTimeout: bodyTimeout})
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", s.addr)
	// Trickle a byte every 100ms until the server answers or closes.
	answered := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(bufio.NewReader(c))
		answered <- string(b)
	}()
	start := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case got := <-answered:
			if d := time.Since(start); d > bodyTimeout+5*time.Second {
				t.Errorf("cut after %s; want about the body timeout %s", d, bodyTimeout)
			}
			t.Logf("cut after %s with %q", time.Since(start).Round(time.Millisecond), tail(got, 200))
			return
		case <-tick.C:
			if time.Since(start) > 30*time.Second {
				t.Fatal("a body trickled for 30s still holds its connection; want it cut after the body timeout")
			}
			_, _ = c.Write([]byte(" "))
		}
	}
}

// TestAttackConnectionFloodOnServe: a local process opens connections until the
// server runs out of descriptors; the server must still hold no more than its cap —
// the flood's oldest idle connections closed as new ones come — while the
// developer's client (the same address, 127.0.0.1) is still served.
func TestAttackConnectionFloodOnServe(t *testing.T) {
	const maxConns = 8
	s := serveMac(t, httpserver.Limits{MaxConnections: maxConns})
	// The developer's client holds a kept-alive connection.
	dev := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	statusOf := func() int {
		resp, err := dev.Get("http://" + s.addr + "/v1/models")
		if err != nil {
			t.Fatalf("the developer's client: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := statusOf(); code != http.StatusOK {
		t.Fatalf("before the flood: %d", code)
	}
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for range 4 * maxConns {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		flood = append(flood, c)
	}
	if code := statusOf(); code != http.StatusOK {
		t.Errorf("the developer's client during the flood: %d, want 200", code)
	}
	closed := 0
	for _, c := range flood {
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			closed++
		}
	}
	if open := len(flood) - closed; open > maxConns {
		t.Errorf("%d of the flood's %d idle connections still open, want at most the cap of %d", open, len(flood), maxConns)
	}
}
