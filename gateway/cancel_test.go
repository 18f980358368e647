package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// cancelAgent is an httptest agent that streams one token every 5 ms until a
// POST /api/requests/cancel names its request, then ends the stream with the usage of
// what it generated as the metering.Header trailer, as the node agent does. found is
// its answer to the cancel; with ignore it answers found and never ends the stream.
type cancelAgent struct {
	*httptest.Server
	found, ignore bool

	mu        sync.Mutex
	streams   map[string]chan struct{} // request id → closed by its cancel
	cancels   []runnerapi.Cancel
	auth      []string
	generated int           // tokens the cancelled stream generated
	ended     chan struct{} // the stream's handler returned
}

func newCancelAgent(t *testing.T, found, ignore bool) *cancelAgent {
	a := &cancelAgent{found: found, ignore: ignore, streams: map[string]chan struct{}{}, ended: make(chan struct{})}
	a.Server = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.Close)
	return a
}

func (a *cancelAgent) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == pathCancel {
		var c runnerapi.Cancel
		_ = json.NewDecoder(r.Body).Decode(&c)
		a.mu.Lock()
		a.cancels, a.auth = append(a.cancels, c), append(a.auth, r.Header.Get("Authorization"))
		stop, ok := a.streams[c.ID]
		a.mu.Unlock()
		if ok && a.found && !a.ignore {
			close(stop)
		}
		writeJSON(w, http.StatusOK, runnerapi.Cancelled{Found: ok && a.found})
		return
	}
	defer close(a.ended)
	stop := make(chan struct{})
	a.mu.Lock()
	a.streams[r.Header.Get(runnerapi.HeaderRequestID)] = stop
	a.mu.Unlock()
	w.Header().Set("Trailer", metering.Header)
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	n := 0
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done(): // dropped: no usage
			return
		case <-stop:
			fmt.Fprint(w, "data: {\"choices\":[{\"finish_reason\":\"cancelled\"}]}\n\ndata: [DONE]\n\n")
			a.mu.Lock()
			a.generated = n
			a.mu.Unlock()
			w.Header().Set(metering.Header, metering.Usage{Input: 7, Cached: 2, Output: int64(n)}.String())
			return
		case <-tick.C:
			n++
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d\"}}]}\n\n", n)
			_ = rc.Flush()
		}
	}
}

// abandon streams a chat from the gateway at url, reads two events and goes away.
func abandon(t *testing.T, url string) time.Time {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for events := 0; events < 2 && sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "data: ") {
			events++
		}
	}
	cancel()
	return time.Now()
}

// cancelThrough puts a gateway with opts in front of a, abandons a stream through
// it, waits until a's stream handler returned and waits for the cancellation's
// outcome to be counted. It returns the gateway and how long after the client went
// away a's stream ended.
func cancelThrough(t *testing.T, a *cancelAgent, opts Options, outcome string) (*testGateway, time.Duration) {
	t.Helper()
	g := newTestGateway(t, opts)
	g.serveReplicas(strings.TrimPrefix(a.URL, "http://"))
	gone := abandon(t, g.url)
	select {
	case <-a.ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the agent's stream did not end after the client went away")
	}
	took := time.Since(gone)
	testenv.Eventually(t, 5*time.Second, 10*time.Millisecond, func() (bool, string) {
		n := testutil.ToFloat64(g.metrics.cancellations.WithLabelValues("a/m", outcome))
		return n == 1, fmt.Sprintf("cancellations{%s} = %v, want 1", outcome, n)
	})
	return g, took
}

// metered is the gateway's count of answers with usage of deployment a/m.
func (g *testGateway) metered() float64 {
	return testutil.ToFloat64(g.metrics.usage.Requests.WithLabelValues("", "", "a/m"))
}

// TestCancelledStreamIsMetered: a client that goes away mid-stream makes the gateway
// ask the agent (with the fleet token) to cancel the request it named; the agent's
// stream ends with the usage of what was generated, and the gateway counts it.
func TestCancelledStreamIsMetered(t *testing.T) {
	a := newCancelAgent(t, true, false)
	g, took := cancelThrough(t, a, Options{}, cancelMetered)
	tokens := func(kind string) float64 {
		return testutil.ToFloat64(g.metrics.usage.Tokens.WithLabelValues("", "", "a/m", kind))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.generated < 2 {
		t.Fatalf("the agent generated %d tokens before the cancel, want at least the 2 the client read", a.generated)
	}
	if in, cached, out := tokens(metering.TypeInput), tokens(metering.TypeCached), tokens(metering.TypeOutput); in != 7 ||
		cached != 2 || out != float64(a.generated) {
		t.Errorf("counted input %v cached %v output %v, want 7 2 %d", in, cached, out, a.generated)
	}
	if n := g.metered(); n != 1 {
		t.Errorf("usage requests = %v, want 1", n)
	}
	if n := testutil.ToFloat64(g.metrics.requests.WithLabelValues("a/m", "chat_completions", "499")); n != 1 {
		t.Errorf("requests{499} = %v, want 1", n)
	}
	if len(a.cancels) != 1 || len(a.cancels[0].ID) < 20 || a.auth[0] != "Bearer "+fleetToken {
		t.Errorf("cancels %+v with %q, want one naming the request, with the fleet token", a.cancels, a.auth)
	}
	t.Logf("client gone to the agent's stream ended: %v", took)
}

// TestCancelDropsWhatNoRunnerHas: an agent that has no runner on the request (still
// queued) answers found false, and the gateway drops the request at once, as before.
func TestCancelDropsWhatNoRunnerHas(t *testing.T) {
	g, took := cancelThrough(t, newCancelAgent(t, false, false), Options{}, cancelNotRunning)
	if took > time.Second {
		t.Errorf("the upstream request was dropped %v after the client went away, want well under the grace", took)
	}
	if n := g.metered(); n != 0 {
		t.Errorf("usage requests = %v, want 0", n)
	}
}

// TestCancelGraceBoundsTheWait: an answer that does not end after its cancel is
// dropped once CancelGrace has passed, and counted as timed out (its stream carries
// no counts, so nothing is metered).
func TestCancelGraceBoundsTheWait(t *testing.T) {
	const grace = 300 * time.Millisecond
	g, took := cancelThrough(t, newCancelAgent(t, true, true), Options{CancelGrace: grace}, cancelTimedOut)
	if took < grace || took > grace+2*time.Second {
		t.Errorf("the upstream request was dropped %v after the client went away, want about the grace %v", took, grace)
	}
	if n := g.metered(); n != 0 {
		t.Errorf("usage requests = %v, want 0", n)
	}
}

// TestCancellationOutcome: how a cancellation is counted, from whether the answer
// reached its end and what the agent said.
func TestCancellationOutcome(t *testing.T) {
	for _, tc := range []struct {
		state int32
		ended bool
		want  string
	}{
		{cancelFound, true, cancelMetered},
		{cancelMissing, true, cancelMetered}, // it ended by itself meanwhile
		{cancelAsked, true, cancelMetered},
		{cancelFound, false, cancelTimedOut},
		{cancelMissing, false, cancelNotRunning},
		{cancelError, false, cancelFailed},
		{cancelAsked, false, cancelFailed}, // dropped while the agent was being asked
		{cancelNone, false, cancelFailed},
	} {
		var c cancellation
		c.state.Store(tc.state)
		if got := c.outcome(tc.ended); got != tc.want {
			t.Errorf("state %d, ended %v: %q, want %q", tc.state, tc.ended, got, tc.want)
		}
	}
}

// BenchmarkAttemptCancellable is what making an attempt cancellable with its usage
// costs on every request: its random id, the detached context and the callback on
// the client's context, registered and removed.
func BenchmarkAttemptCancellable(b *testing.B) {
	g := &Gateway{opts: Options{CancelGrace: DefaultCancelGrace}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for b.Loop() {
		var c cancellation
		_, stop := g.detach(ctx, Backend{}, "a/m", newRequestID(), &c)
		stop()
	}
}

// TestWholeAnswerOfAClientThatClosesAtDoneIsMetered: the official OpenAI clients close
// the response body as soon as they read a stream's [DONE]. When that reaches the
// gateway before the agent's usage trailer (which comes after [DONE], at the body's
// end), the runner no longer has the request (it finished it) and the agent answers
// the cancel with found false: the gateway must still read the trailer, not drop the
// answer unmetered. A Chat Completions stream (read through the splice reader) and a
// text completion's.
func TestWholeAnswerOfAClientThatClosesAtDoneIsMetered(t *testing.T) {
	const lateTrailer = 300 * time.Millisecond // within DefaultCancelGrace
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		t.Run(path, func(t *testing.T) {
			var asked atomic.Int32
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == pathCancel { // the runner finished the request: not found
					asked.Add(1)
					writeJSON(w, http.StatusOK, runnerapi.Cancelled{})
					return
				}
				w.Header().Set("Trailer", metering.Header)
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, chunkEvent("chatcmpl-1", content("One"), ""))
				fmt.Fprint(w, chunkEvent("chatcmpl-1", `{}`, "stop"))
				fmt.Fprint(w, "data: [DONE]\n\n")
				_ = http.NewResponseController(w).Flush()
				// The trailer comes late (the agent was busy), after the client
				// closed and the gateway could hear the agent's answer to a cancel.
				select {
				case <-time.After(lateTrailer):
				case <-r.Context().Done():
					return // dropped: no usage
				}
				w.Header().Set(metering.Header, metering.Usage{Input: 5, Output: 2}.String())
			}))
			t.Cleanup(up.Close)
			g := newTestGateway(t, Options{})
			g.serveReplicas(strings.TrimPrefix(up.URL, "http://"))
			req, _ := http.NewRequest(http.MethodPost, g.url+path, strings.NewReader(`{"model":"m","stream":true,"messages":[],"prompt":"p"}`))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() && sc.Text() != "data: [DONE]" {
			}
			resp.Body.Close() // as the official clients do at [DONE]
			testenv.Eventually(t, 5*time.Second, 10*time.Millisecond, func() (bool, string) {
				out := testutil.ToFloat64(g.metrics.usage.Tokens.WithLabelValues("", "", "a/m", metering.TypeOutput))
				return g.metered() == 1 && out == 2, fmt.Sprintf("metered %v answers, %v output tokens; want 1, 2", g.metered(), out)
			})
			if n := asked.Load(); n != 0 {
				t.Errorf("the gateway asked the agent %d times to cancel an answer the client had whole", n)
			}
		})
	}
}
