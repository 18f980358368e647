package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/runnerapi"
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/test/support/testenv"
)

const fleetToken = "fleet-secret"

type testGateway struct {
	*Gateway
	url string
}

func newTestGateway(t *testing.T, opts Options) *testGateway {
	t.Helper()
	if opts.FleetToken == nil {
		opts.FleetToken = func() string { return fleetToken }
	}
	if opts.ColdStartTimeout == 0 {
		opts.ColdStartTimeout = 10 * time.Second
	}
	opts.Registerer = prometheus.NewRegistry()
	opts.Log = testr.New(t)
	g, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(g.Handler())
	t.Cleanup(ts.Close)
	return &testGateway{Gateway: g, url: ts.URL}
}

// serveReplicas sets a table with deployment ns "a" name "m" whose ready replicas are
// at the given endpoints (named r0, r1…), on Ready Macs.
func (g *testGateway) serveReplicas(endpoints ...string) {
	var rs []mfv1.ModelReplica
	for i, ep := range endpoints {
		rs = append(rs, replica("a", fmt.Sprintf("r%d", i), "m", "mac", ep, metav1.ConditionTrue))
	}
	g.SetTable(BuildTable([]mfv1.ModelDeployment{deployment("a", "m", "")}, rs,
		[]mfv1.MacNode{node("mac", metav1.ConditionTrue)}))
}

// upstream is an httptest agent whose behaviour a test scripts per call.
type upstream struct {
	*httptest.Server
	calls atomic.Int32
}

func newUpstream(t *testing.T, h func(n int, w http.ResponseWriter, r *http.Request)) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == pathCancel { // no runner has the request: it is dropped
			writeJSON(w, http.StatusOK, runnerapi.Cancelled{})
			return
		}
		h(int(u.calls.Add(1)), w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) host() string { return strings.TrimPrefix(u.URL, "http://") }

func okJSON(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"replica":%q}`, r.Header.Get(mfv1.HeaderReplica))
}

func status(code int, retryAfter string) func(int, http.ResponseWriter, *http.Request) {
	return func(_ int, w http.ResponseWriter, _ *http.Request) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"error":{"message":"upstream says %d","type":"x","code":"c%d"}}`, code, code)
	}
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`

// post posts body to the gateway at url's chat completions with the header pairs hdr.
func post(t *testing.T, url, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	return postPath(t, url+"/v1/chat/completions", body, hdr...)
}

// postPath posts a JSON body to url (a whole URL) with the header pairs hdr.
func postPath(t *testing.T, url, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	return resp, string(b)
}

type errBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
		Param   any    `json:"param"`
	} `json:"error"`
}

func decodeErr(t *testing.T, body string) errBody {
	t.Helper()
	var e errBody
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" {
		t.Fatalf("not an OpenAI error body: %q (%v)", body, err)
	}
	return e
}

// TestForwardsUnchanged: method, path, query and body arrive unchanged with the fleet
// token (not the client's key) and the replica header; the response comes back as sent
// (with the headers a client may get).
func TestForwardsUnchanged(t *testing.T) {
	type seen struct {
		method, uri, body, auth, replica, ctype, custom string
	}
	got := make(chan seen, 1)
	up := newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.RequestURI(), string(b), r.Header.Get("Authorization"), r.Header.Get(mfv1.HeaderReplica),
			r.Header.Get("Content-Type"), r.Header.Get("X-Custom")}
		w.Header().Set("X-Macfleet-Ignored-Hints", "yes")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("as sent"))
	})
	g := newTestGateway(t, Options{})
	g.serveReplicas(up.host())
	body := `{"model" : "m", "messages":[{"role":"user","content":"hé"}], "extra": [1,2]}`
	req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/completions?x=1&y=2", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer client-key")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Custom", "v")
	req.Header.Set(mfv1.HeaderReplica, "a/forged")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || string(b) != "as sent" || resp.Header.Get("X-Macfleet-Ignored-Hints") != "yes" {
		t.Errorf("response %d %q X-Macfleet-Ignored-Hints=%q", resp.StatusCode, b, resp.Header.Get("X-Macfleet-Ignored-Hints"))
	}
	want := seen{"POST", "/v1/completions?x=1&y=2", body, "Bearer " + fleetToken, "a/r0", "application/json", "v"}
	if d := cmp.Diff(want, <-got, cmp.AllowUnexported(seen{})); d != "" {
		t.Errorf("upstream saw (-want +got):\n%s", d)
	}
}

// TestRetries covers the failures retried on another replica before the first byte
// and those passed through.
func TestRetries(t *testing.T) {
	tests := []struct {
		name string
		// bad is the failing replica's behaviour (nil: nothing listens).
		bad        func(int, http.ResponseWriter, *http.Request)
		wantStatus int
		reason     string
	}{
		{name: "503 then success", bad: status(503, "1"), wantStatus: 200, reason: "status_503"},
		{name: "507 then success", bad: status(507, ""), wantStatus: 200, reason: "status_507"},
		{name: "connection refused", bad: nil, wantStatus: 200, reason: "connect"},
		{name: "replica gone from its agent", bad: func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"error":{"message":"model \"a/r0\" does not exist on this node","type":"invalid_request_error","code":"model_not_found"}}`)
		}, wantStatus: 200, reason: "replica_gone"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			good := newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				if string(b) != chatBody {
					http.Error(w, "body not replayed: "+string(b), 500)
					return
				}
				okJSON(w, r)
			})
			badAddr := testenv.ReservePort(t).Addr
			var bad *upstream
			if tt.bad != nil {
				bad = newUpstream(t, tt.bad)
				badAddr = bad.host()
			}
			g := newTestGateway(t, Options{})
			g.serveReplicas(badAddr, good.host())
			// Both orders of picking happen across requests (ties rotate).
			for i := range 4 {
				start := time.Now()
				resp, body := post(t, g.url, chatBody)
				if resp.StatusCode != tt.wantStatus || body != `{"replica":"a/r1"}` {
					t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
				}
				// Well under the 10s cold-start timeout a request that did not fail
				// over would wait, with room for a loaded machine.
				if d := time.Since(start); d > 5*time.Second {
					t.Errorf("request %d took %v", i, d)
				}
			}
			if n := testutil.ToFloat64(g.metrics.retries.WithLabelValues("a/m", tt.reason)); n < 1 {
				t.Errorf("retries{reason=%s} = %v, want >= 1", tt.reason, n)
			}
			// Counted after the response's last byte: poll.
			testenv.Eventually(t, 5*time.Second, 5*time.Millisecond, func() (bool, string) {
				n := testutil.ToFloat64(g.metrics.requests.WithLabelValues("a/m", "chat_completions", "200"))
				return n == 4, fmt.Sprintf("requests{code=200} = %v, want 4", n)
			})
			if bad != nil && bad.calls.Load() == 0 {
				t.Error("the failing replica was never tried")
			}
		})
	}
}

// TestPassThrough: 4xx and other 5xx come back as the agent sent them, without retry;
// a 507 without Retry-After from every replica is passed through at once.
func TestPassThrough(t *testing.T) {
	for _, code := range []int{400, 404, 413, 429, 500} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			up := newUpstream(t, status(code, ""))
			g := newTestGateway(t, Options{})
			g.serveReplicas(up.host(), up.host())
			resp, body := post(t, g.url, chatBody)
			if resp.StatusCode != code || decodeErr(t, body).Error.Code != fmt.Sprintf("c%d", code) {
				t.Errorf("%d %s", resp.StatusCode, body)
			}
			if n := up.calls.Load(); n != 1 {
				t.Errorf("%d upstream calls, want 1", n)
			}
		})
	}
	t.Run("507 everywhere", func(t *testing.T) {
		up := newUpstream(t, status(507, ""))
		g := newTestGateway(t, Options{ColdStartTimeout: time.Minute})
		g.serveReplicas(up.host(), up.host())
		start := time.Now()
		resp, body := post(t, g.url, chatBody)
		if resp.StatusCode != 507 || decodeErr(t, body).Error.Code != "c507" {
			t.Errorf("%d %s", resp.StatusCode, body)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("a 507 of every replica took %v: it must not wait for a cold start", d)
		}
		if n := up.calls.Load(); n != 2 {
			t.Errorf("%d upstream calls, want 2 (each replica once)", n)
		}
	})
}

// TestColdStart: a request for a deployment without a routable replica waits; a
// replica becoming Ready serves it. Without one it gets a 503 with Retry-After once
// the cold-start timeout passes.
func TestColdStart(t *testing.T) {
	up := newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) { okJSON(w, r) })
	pending := func(g *testGateway) {
		g.SetTable(BuildTable([]mfv1.ModelDeployment{deployment("a", "m", "")},
			[]mfv1.ModelReplica{replica("a", "r0", "m", "mac", "", metav1.ConditionFalse)},
			[]mfv1.MacNode{node("mac", metav1.ConditionTrue)}))
	}
	t.Run("hold then success", func(t *testing.T) {
		g := newTestGateway(t, Options{ColdStartTimeout: 30 * time.Second})
		pending(g)
		type result struct {
			code int
			body string
		}
		done := make(chan result, 1)
		go func() {
			resp, body := post(t, g.url, chatBody)
			done <- result{resp.StatusCode, body}
		}()
		testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
			n := testutil.ToFloat64(g.metrics.inflight.WithLabelValues("a/m"))
			return n == 1, fmt.Sprintf("%v requests in flight", n)
		})
		select {
		case r := <-done:
			t.Fatalf("answered %d %s before any replica was ready", r.code, r.body)
		default:
		}
		g.serveReplicas(up.host())
		select {
		case r := <-done:
			if r.code != 200 {
				t.Errorf("%d %s", r.code, r.body)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the held request was not served after a replica became ready")
		}
		// Observed after the response's last byte: poll.
		testenv.Eventually(t, 5*time.Second, 5*time.Millisecond, func() (bool, string) {
			n := testutil.CollectAndCount(g.metrics.held)
			return n == 1, fmt.Sprintf("hold histogram has %d series, want 1", n)
		})
	})
	t.Run("timeout", func(t *testing.T) {
		g := newTestGateway(t, Options{ColdStartTimeout: 300 * time.Millisecond})
		pending(g)
		start := time.Now()
		resp, body := post(t, g.url, chatBody)
		if d := time.Since(start); d < 300*time.Millisecond {
			t.Errorf("answered after %v, before the cold-start timeout", d)
		}
		e := decodeErr(t, body)
		if resp.StatusCode != 503 || e.Error.Code != codeNoReplica || resp.Header.Get("Retry-After") == "" ||
			!strings.Contains(e.Error.Message, "a/m") {
			t.Errorf("%d Retry-After=%q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	})
	t.Run("agent loading answers 503 until loaded", func(t *testing.T) {
		loading := newUpstream(t, func(n int, w http.ResponseWriter, r *http.Request) {
			if n <= 3 {
				status(503, "1")(n, w, r)
				return
			}
			okJSON(w, r)
		})
		g := newTestGateway(t, Options{ColdStartTimeout: 30 * time.Second})
		g.serveReplicas(loading.host())
		resp, body := post(t, g.url, chatBody)
		if resp.StatusCode != 200 || loading.calls.Load() != 4 {
			t.Errorf("%d %s after %d calls", resp.StatusCode, body, loading.calls.Load())
		}
	})
	t.Run("scaled to zero fails at once", func(t *testing.T) {
		g := newTestGateway(t, Options{ColdStartTimeout: time.Minute})
		d := deployment("a", "m", "")
		zero := int32(0)
		d.Spec.Replicas = &zero
		g.SetTable(BuildTable([]mfv1.ModelDeployment{d}, nil, nil))
		resp, body := post(t, g.url, chatBody)
		if resp.StatusCode != 503 || !strings.Contains(decodeErr(t, body).Error.Message, "scaled to zero") {
			t.Errorf("%d %s", resp.StatusCode, body)
		}
	})
	t.Run("deployment deleted while held", func(t *testing.T) {
		g := newTestGateway(t, Options{ColdStartTimeout: 30 * time.Second})
		pending(g)
		done := make(chan int, 1)
		go func() {
			resp, _ := post(t, g.url, chatBody)
			done <- resp.StatusCode
		}()
		testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
			return testutil.ToFloat64(g.metrics.inflight.WithLabelValues("a/m")) == 1, "request not held yet"
		})
		g.SetTable(BuildTable(nil, nil, nil))
		if code := <-done; code != 404 {
			t.Errorf("status %d, want 404", code)
		}
	})
}

// TestStreaming: SSE events reach the client one by one (the second is only sent
// after the client has read the first), and a stream that breaks after its start is
// not retried: the client gets an error event.
func TestStreaming(t *testing.T) {
	next := make(chan struct{})
	up := newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		fmt.Fprint(w, "data: {\"n\":1}\n\n")
		_ = rc.Flush()
		select {
		case <-next:
		case <-r.Context().Done():
			return
		}
		if r.Header.Get("X-Break") != "" {
			conn, _, _ := rc.Hijack()
			conn.Close()
			return
		}
		fmt.Fprint(w, "data: {\"n\":2}\n\ndata: [DONE]\n\n")
	})
	// Without continuations a stream that broke is not retried (continuation_test.go).
	g := newTestGateway(t, Options{StreamContinuations: -1})
	g.serveReplicas(up.host(), up.host())
	for _, brk := range []bool{false, true} {
		t.Run(fmt.Sprintf("break=%v", brk), func(t *testing.T) {
			before := up.calls.Load()
			req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions",
				strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
			if brk {
				req.Header.Set("X-Break", "1")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			line, err := br.ReadString('\n')
			if err != nil || line != "data: {\"n\":1}\n" {
				t.Fatalf("first event %q, %v", line, err)
			}
			next <- struct{}{}
			rest, _ := io.ReadAll(br)
			if brk {
				if !strings.Contains(string(rest), `"code":"upstream_error"`) {
					t.Errorf("after the break the client read %q, want an error event", rest)
				}
				testenv.Eventually(t, 5*time.Second, 10*time.Millisecond, func() (bool, string) {
					n := testutil.ToFloat64(g.metrics.errors.WithLabelValues("a/m", "stream_broken"))
					return n == 1, fmt.Sprintf("stream_broken = %v", n)
				})
			} else if string(rest) != "\ndata: {\"n\":2}\n\ndata: [DONE]\n\n" {
				t.Errorf("rest of the stream %q", rest)
			}
			if n := up.calls.Load() - before; n != 1 {
				t.Errorf("%d upstream calls, want 1 (no retry after the first byte)", n)
			}
		})
	}
}

// TestBrokenNonStream: a JSON response cut after its start reaches the client as a
// failed read, not as a complete response.
func TestBrokenNonStream(t *testing.T) {
	up := newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "100")
		fmt.Fprint(w, `{"partial":`)
		_ = http.NewResponseController(w).Flush()
		conn, _, _ := http.NewResponseController(w).Hijack()
		conn.Close()
	})
	g := newTestGateway(t, Options{})
	g.serveReplicas(up.host())
	resp, err := http.Post(g.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, err := io.ReadAll(resp.Body); err == nil {
		t.Errorf("read %q without an error", b)
	}
	if n := up.calls.Load(); n != 1 {
		t.Errorf("%d upstream calls, want 1", n)
	}
}

// TestClientDisconnectCancelsUpstream: the upstream request ends when the client goes.
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	started, cancelled := make(chan struct{}), make(chan struct{})
	up := newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		// An agent reads the body before it generates; the server notices a closed
		// connection only once it has.
		_, _ = io.ReadAll(r.Body)
		close(started)
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(10 * time.Second):
		}
	})
	g := newTestGateway(t, Options{})
	g.serveReplicas(up.host())
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.url+"/v1/chat/completions", strings.NewReader(chatBody))
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-started
	cancel()
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream request was not cancelled when the client went away")
	}
	<-errc
	testenv.Eventually(t, 5*time.Second, 10*time.Millisecond, func() (bool, string) {
		n := testutil.ToFloat64(g.metrics.requests.WithLabelValues("a/m", "chat_completions", "499"))
		return n == 1 && g.bal.Outstanding("a/r0") == 0, fmt.Sprintf("requests{499}=%v outstanding=%d", n, g.bal.Outstanding("a/r0"))
	})
}

// TestLeastOutstandingSpreads: concurrent requests that stay open spread evenly over
// the replicas.
func TestLeastOutstandingSpreads(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	seen := map[string]int{}
	h := func(_ int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get(mfv1.HeaderReplica)]++
		mu.Unlock()
		<-release
		okJSON(w, r)
	}
	ups := []*upstream{newUpstream(t, h), newUpstream(t, h), newUpstream(t, h)}
	// Room for three per replica (one slot each): all nine reach a replica at once.
	g := newTestGateway(t, Options{MaxInFlightPerSlot: 3})
	g.serveReplicas(ups[0].host(), ups[1].host(), ups[2].host())
	var wg sync.WaitGroup
	for range 9 {
		wg.Go(func() {
			resp, body := post(t, g.url, chatBody)
			if resp.StatusCode != 200 {
				t.Errorf("%d %s", resp.StatusCode, body)
			}
		})
	}
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range seen {
			n += c
		}
		return n == 9, fmt.Sprintf("%d of 9 requests arrived", n)
	})
	close(release)
	wg.Wait()
	if d := cmp.Diff(map[string]int{"a/r0": 3, "a/r1": 3, "a/r2": 3}, seen); d != "" {
		t.Errorf("9 concurrent requests (-want +got):\n%s", d)
	}
}

// TestPrefixAffinity: every turn of a conversation goes to one replica while the
// load allows; different conversations spread.
func TestPrefixAffinity(t *testing.T) {
	h := func(_ int, w http.ResponseWriter, r *http.Request) { okJSON(w, r) }
	ups := []*upstream{newUpstream(t, h), newUpstream(t, h), newUpstream(t, h)}
	g := newTestGateway(t, Options{PrefixAffinity: true})
	g.serveReplicas(ups[0].host(), ups[1].host(), ups[2].host())
	homes := map[string]bool{}
	for p := range 12 {
		var home string
		for i := range 3 {
			msgs := fmt.Sprintf(`{"role":"system","content":"persona %d"},{"role":"user","content":"question %d"}`, p, p)
			for turn := range i {
				msgs += fmt.Sprintf(`,{"role":"assistant","content":"answer %d"},{"role":"user","content":"follow-up %d"}`, turn, turn)
			}
			body := `{"model":"m","messages":[` + msgs + `]}`
			_, got := post(t, g.url, body)
			if i == 0 {
				home = got
			} else if got != home {
				t.Errorf("conversation %d: turn %d went to %s, the first to %s", p, i, got, home)
			}
		}
		homes[home] = true
	}
	if len(homes) < 2 {
		t.Errorf("12 conversations all went to %v", homes)
	}
}

// TestPromptCacheKeyAffinity: with prefix affinity, requests that carry the same
// prompt_cache_key (chat completions, Responses) go to one replica whatever their
// prompts; different keys spread. The agent's hints header reaches the client.
func TestPromptCacheKeyAffinity(t *testing.T) {
	h := func(_ int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Macfleet-Ignored-Hints", "client_metadata")
		okJSON(w, r)
	}
	ups := []*upstream{newUpstream(t, h), newUpstream(t, h), newUpstream(t, h)}
	g := newTestGateway(t, Options{PrefixAffinity: true})
	g.serveReplicas(ups[0].host(), ups[1].host(), ups[2].host())
	homes := map[string]bool{}
	for k := range 12 {
		var home string
		for i, body := range []string{
			fmt.Sprintf(`{"model":"m","prompt_cache_key":"thread-%d","messages":[{"role":"system","content":"persona %d"},{"role":"user","content":"q"}]}`, k, 0),
			fmt.Sprintf(`{"model":"m","prompt_cache_key":"thread-%d","messages":[{"role":"system","content":"persona %d"},{"role":"user","content":"q"}]}`, k, 1),
			fmt.Sprintf(`{"model":"m","prompt_cache_key":"thread-%d","instructions":"other %d","input":"x"}`, k, 2),
		} {
			resp, got := post(t, g.url, body)
			if hv := resp.Header.Get("X-Macfleet-Ignored-Hints"); hv != "client_metadata" {
				t.Errorf("the agent's hints header came back as %q", hv)
			}
			if i == 0 {
				home = got
			} else if got != home {
				t.Errorf("key %d: request %d went to %s, the first to %s", k, i, got, home)
			}
		}
		homes[home] = true
	}
	if len(homes) < 2 {
		t.Errorf("12 keys all went to %v", homes)
	}
}

// TestCountTokensForwarded: the gateway routes Anthropic's count_tokens by model to
// an agent, on its own path, and passes the answer and its headers back.
func TestCountTokensForwarded(t *testing.T) {
	var path atomic.Value
	up := newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		path.Store(r.URL.Path)
		w.Header().Set("X-Macfleet-Ignored-Hints", "context_management")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"input_tokens":42}`)
	})
	g := newTestGateway(t, Options{})
	g.serveReplicas(up.host())
	resp, err := http.Post(g.url+"/v1/messages/count_tokens", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"x"}],"context_management":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(b) != `{"input_tokens":42}` ||
		resp.Header.Get("X-Macfleet-Ignored-Hints") != "context_management" || path.Load() != "/v1/messages/count_tokens" {
		t.Errorf("%d %s (hints %q), forwarded to %v", resp.StatusCode, b, resp.Header.Get("X-Macfleet-Ignored-Hints"), path.Load())
	}
}

func TestErrors(t *testing.T) {
	g := newTestGateway(t, Options{MaxBodyBytes: 1024})
	g.SetTable(BuildTable([]mfv1.ModelDeployment{deployment("a", "m", ""), deployment("b", "m", "")}, nil, nil))
	tests := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"x"}`, 404, codeModelNotFound},
		{"ambiguous", "POST", "/v1/chat/completions", `{"model":"m"}`, 400, codeAmbiguousModel},
		{"too large", "POST", "/v1/chat/completions", `{"model":"` + strings.Repeat("x", 2000) + `"}`, 413, openaierr.CodeRequestTooLarge},
		{"not json", "POST", "/v1/embeddings", `hello`, 400, openaierr.CodeInvalidJSON},
		{"no model", "POST", "/v1/embeddings", `{"input":"x"}`, 400, openaierr.CodeMissingField},
		{"admin API not exposed", "POST", "/api/models/x/unload", `{}`, 404, openaierr.CodeNotFound},
		{"wrong method", "GET", "/v1/chat/completions", ``, 405, openaierr.CodeMethodNotAllowed},
		{"unknown model by id", "GET", "/v1/models/nope", ``, 404, codeModelNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, g.url+tt.path, strings.NewReader(tt.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if e := decodeErr(t, string(b)); resp.StatusCode != tt.status || e.Error.Code != tt.code {
				t.Errorf("%d %s, want %d %s", resp.StatusCode, b, tt.status, tt.code)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
}

func TestListModels(t *testing.T) {
	g := newTestGateway(t, Options{})
	d1 := deployment("a", "qwen", "", "q")
	d1.CreationTimestamp = metav1.Unix(1700000000, 0)
	d2 := deployment("b", "qwen", "")
	d3 := deployment("b", "llama", "meta/llama")
	g.SetTable(BuildTable([]mfv1.ModelDeployment{d3, d2, d1},
		[]mfv1.ModelReplica{replica("a", "r", "qwen", "mac", "10.0.0.1:1", metav1.ConditionTrue)},
		[]mfv1.MacNode{node("mac", metav1.ConditionTrue)}))
	resp, err := http.Get(g.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := []modelObject{
		{ID: "a/qwen", Object: "model", Created: 1700000000, OwnedBy: "a", Namespace: "a", Deployment: "qwen",
			Aliases: []string{"q"}, ReadyReplicas: 1},
		{ID: "meta/llama", Object: "model", Created: time.Time{}.Unix(), OwnedBy: "b", Namespace: "b", Deployment: "llama"},
		{ID: "b/qwen", Object: "model", Created: time.Time{}.Unix(), OwnedBy: "b", Namespace: "b", Deployment: "qwen"},
	}
	if got.Object != "list" {
		t.Errorf("object %q", got.Object)
	}
	if d := cmp.Diff(want, got.Data); d != "" {
		t.Errorf("models (-want +got):\n%s", d)
	}
	r2, err := http.Get(g.url + "/v1/models/meta/llama")
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Body.Close()
	var one modelObject
	_ = json.NewDecoder(r2.Body).Decode(&one)
	if r2.StatusCode != 200 || one.Deployment != "llama" {
		t.Errorf("GET /v1/models/meta/llama: %d %+v", r2.StatusCode, one)
	}
}

// TestAPIKeys: with a keys file, requests need one of its keys; a rewritten file is
// picked up by the watcher.
func TestAPIKeys(t *testing.T) {
	up := newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+fleetToken {
			http.Error(w, "no fleet token", 401)
			return
		}
		okJSON(w, r)
	})
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte("# clients\nkey-one\n\n  key-two  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kf, err := LoadKeysFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go kf.Watch(ctx, 20*time.Millisecond, testr.New(t))
	g := newTestGateway(t, Options{Identify: kf.Identify})
	g.serveReplicas(up.host())
	check := func(key string, want int) {
		t.Helper()
		var hdr []string
		if key != "" {
			hdr = []string{"Authorization", "Bearer " + key}
		}
		resp, body := post(t, g.url, chatBody, hdr...)
		if resp.StatusCode != want {
			t.Errorf("key %q: %d %s, want %d", key, resp.StatusCode, body, want)
		}
		if want == 401 && decodeErr(t, body).Error.Code != openaierr.CodeInvalidAPIKey {
			t.Errorf("key %q: %s", key, body)
		}
	}
	check("", 401)
	check("nope", 401)
	// Anthropic clients send the key as x-api-key; on /v1/messages the gateway's own
	// errors come in Anthropic's shape.
	resp, body := post(t, g.url, chatBody, "X-Api-Key", "key-one")
	if resp.StatusCode != 200 {
		t.Errorf("x-api-key: %d %s", resp.StatusCode, body)
	}
	req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/messages", strings.NewReader(`{"model":"m","max_tokens":1,"messages":[]}`))
	req.Header.Set("X-Api-Key", "nope")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Error(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if resp.StatusCode != 401 || json.Unmarshal(b, &e) != nil || e.Type != "error" || e.Error.Type != "authentication_error" ||
			!strings.Contains(e.Error.Message, "x-api-key") {
			t.Errorf("/v1/messages with a wrong key: %d %s, want Anthropic's authentication_error", resp.StatusCode, b)
		}
	}
	check("# clients", 401)
	check("key-one", 200)
	check("key-two", 200)
	if err := os.WriteFile(path+".new", []byte("key-three\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil { // an atomic swap, like a Secret volume's
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		_, three := kf.Identify("key-three")
		_, one := kf.Identify("key-one")
		return three && !one, "the rewritten keys file was not picked up"
	})
	check("key-three", 200)
	check("key-one", 401)
}

// FuzzHandler: no request body makes the gateway panic or answer anything but JSON.
func FuzzHandler(f *testing.F) {
	for _, s := range []string{chatBody, ``, `{`, `null`, `[]`, `{"model":{}}`, `{"model":"m","messages":[{"content":[1,{"text":5}]}]}`,
		`{"model":"m","prompt":[["a"]]}`, "{\"model\":\"\xff\"}", `{"model":"a/m"}`} {
		f.Add(s)
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { okJSON(w, r) }))
	defer up.Close()
	g, err := New(Options{PrefixAffinity: true, ColdStartTimeout: 50 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	g.SetTable(BuildTable([]mfv1.ModelDeployment{deployment("a", "m", "")},
		[]mfv1.ModelReplica{replica("a", "r0", "m", "mac", strings.TrimPrefix(up.URL, "http://"), metav1.ConditionTrue)},
		[]mfv1.MacNode{node("mac", metav1.ConditionTrue)}))
	f.Fuzz(func(t *testing.T, body string) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		g.Handler().ServeHTTP(rec, req)
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("body %q: %d with Content-Type %q", body, rec.Code, ct)
		}
	})
}

// TestClientHangsUpAfterDone: a client that closes the connection once it read the
// stream's [DONE], while the upstream has not ended its response yet, was served: it
// counts as a 200, not as a client gone (499). One that leaves before [DONE] is gone.
func TestClientHangsUpAfterDone(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events string
		code   string
		reason string
	}{
		{name: "after done", events: "data: {\"n\":1}\n\ndata: [DONE]\n\n", code: "200"},
		{name: "before done", events: "data: {\"n\":1}\n\n", code: "499", reason: "client_gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, tc.events)
				_ = http.NewResponseController(w).Flush()
				<-r.Context().Done() // the upstream keeps its response open
			})
			g := newTestGateway(t, Options{})
			g.serveReplicas(up.host())
			resp, _ := func() (*http.Response, error) {
				req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions",
					strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
				return http.DefaultClient.Do(req)
			}()
			if resp == nil {
				t.Fatal("no response")
			}
			got := make([]byte, len(tc.events))
			if _, err := io.ReadFull(resp.Body, got); err != nil || string(got) != tc.events {
				t.Fatalf("read %q, %v; want %q", got, err, tc.events)
			}
			resp.Body.Close() // hang up with the upstream response still open
			testenv.Eventually(t, 5*time.Second, 10*time.Millisecond, func() (bool, string) {
				n := testutil.ToFloat64(g.metrics.requests.WithLabelValues("a/m", "chat_completions", tc.code))
				return n == 1, fmt.Sprintf("requests{code=%s} = %v, want 1", tc.code, n)
			})
			if tc.reason != "" {
				if n := testutil.ToFloat64(g.metrics.errors.WithLabelValues("a/m", tc.reason)); n != 1 {
					t.Errorf("errors{reason=%s} = %v, want 1", tc.reason, n)
				}
			}
		})
	}
}

// TestFailureString: a failed attempt is described with the replica's error code and
// message (a held request's 503 and the retry log say why the replica refused), the
// message cut at failureMessageLimit bytes on a rune's boundary.
func TestFailureString(t *testing.T) {
	be := Backend{Key: "ns/r", Endpoint: "10.0.0.1:8080"}
	long := strings.Repeat("é", failureMessageLimit) // two bytes a rune: cut in the middle of none
	for _, tc := range []struct {
		name string
		f    failure
		want string
	}{
		{"transport", failure{backend: be, err: io.ErrUnexpectedEOF}, "replica ns/r at 10.0.0.1:8080: unexpected EOF"},
		{"an OpenAI error", failure{backend: be, status: 503,
			body: []byte(`{"error":{"message":"the model is loading (40%)","type":"service_unavailable","code":"model_loading"}}`)},
			"replica ns/r answered 503 (model_loading): the model is loading (40%)"},
		{"a body that is not one", failure{backend: be, status: 507, body: []byte("<html>")}, "replica ns/r answered 507"},
		{"a long message", failure{backend: be, status: 503, body: []byte(`{"error":{"message":"` + long + `","code":"x"}}`)},
			"replica ns/r answered 503 (x): " + long[:failureMessageLimit] + "…"},
	} {
		if got := tc.f.String(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
