package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// cuttingProxy passes a real agent's answers on, as a replica whose runner dies or
// whose agent hangs would. A stream it cuts after cutAfter events (0: never), by
// dropping the connection, or stalls after stallAfter events until the gateway drops
// it; the agent's cancel endpoint it answers 503 while refuseCancel (an agent that
// does not end the answer within the gateway's grace).
// It adds up the completion tokens it passed on, by the runner's count lines.
type cuttingProxy struct {
	agent        string
	cutAfter     atomic.Int32
	stallAfter   atomic.Int32
	refuseCancel atomic.Bool
	cuts         atomic.Int32 // streams cut so far

	mu     sync.Mutex
	counts map[string]int64 // per stream and choice: the last count passed on
}

// passed is the completion tokens of every stream and choice the proxy passed on.
func (p *cuttingProxy) passed() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, c := range p.counts {
		n += c
	}
	return n
}

func (p *cuttingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/api/requests/cancel" && p.refuseCancel.Load() {
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	}
	body, _ := io.ReadAll(r.Body)
	resp := forwardTo(w, r, body, p.agent)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	rc := http.NewResponseController(w)
	br := bufio.NewReader(resp.Body)
	stream, events := r.Header.Get(runnerapi.HeaderRequestID), 0
	cut, stall := int(p.cutAfter.Load()), int(p.stallAfter.Load())
	var pending []string // the count lines of the event being passed on
	for {
		line, err := br.ReadString('\n')
		if v, ok := strings.CutPrefix(line, runnerapi.TokenCountComment+" "); ok {
			pending = append(pending, strings.TrimSpace(v))
		}
		_, _ = io.WriteString(w, line)
		if line == "\n" {
			_ = rc.Flush()
			p.count(stream, pending)
			pending, events = pending[:0], events+1
			if cut > 0 && events >= cut && strings.HasPrefix(r.URL.Path, "/v1/") {
				p.cuts.Add(1)
				panic(http.ErrAbortHandler)
			}
			if stall > 0 && events >= stall && strings.HasPrefix(r.URL.Path, "/v1/") {
				<-r.Context().Done() // until the gateway drops the connection
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// forwardTo sends r, whose body was read as body, to agent and answers w with the
// agent's status and headers; the caller relays the response's body and closes it.
// nil: the agent could not be asked (w has a 502).
func forwardTo(w http.ResponseWriter, r *http.Request, body []byte, agent string) *http.Response {
	out, err := http.NewRequestWithContext(r.Context(), r.Method, "http://"+agent+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return nil
	}
	out.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return nil
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	return resp
}

// count records the count lines ("I N", or "I N IDS" where the gateway asked for the
// tokens' ids) of one event passed on of stream.
func (p *cuttingProxy) count(stream string, lines []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.counts == nil {
		p.counts = map[string]int64{}
	}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		if v, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			p.counts[stream+"/"+f[0]] = v
		}
	}
}

// brokenFleet is a gateway with tenant keys over a deployment "tiny" of one replica,
// a real agent (16 slots) behind a cuttingProxy, and a team key "ci" of its namespace.
func brokenFleet(t *testing.T) (g runningGateway, p *cuttingProxy, ns string, oc openai.Client) {
	t.Helper()
	e, agent, keys := realAgentWith(t, "admin-"+t.Name(), engine.Settings{ContextLength: 1024, Parallel: 16})
	p = &cuttingProxy{agent: agent}
	ps := httptest.NewServer(p)
	t.Cleanup(ps.Close)
	g = startGateway(t, e, gateway.Config{APIKeysFile: keys, TenantKeys: true, MetricsListener: loopback(t),
		ColdStartTimeout: 30 * time.Second, StreamContinuations: -1})
	f := &fleet{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)}
	mac := "mac-" + f.ns
	f.node(mac, metav1.ConditionTrue)
	f.deployment("tiny", "", 1)
	f.replica("tiny-0", "tiny", mac)
	f.setReplica("tiny-0", metav1.ConditionTrue, strings.TrimPrefix(ps.URL, "http://"))
	key := "team-key-" + f.ns
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "ci"}, Type: tenancy.SecretType,
		Data: map[string][]byte{tenancy.KeyField: []byte(key)}}
	if err := e.Client.Create(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	f.cleanup(s)
	g.key = key
	waitModel(t, g, "tiny", f.ns, 1)
	oc = openai.NewClient(option.WithBaseURL(g.url+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
	return g, p, f.ns, oc
}

// meteredOutput is the output tokens the gateway metered for key ci of ns.
func meteredOutput(t *testing.T, g runningGateway, ns string) float64 {
	t.Helper()
	return metricValue(t, g, fmt.Sprintf(`macfleet_usage_tokens_total{deployment="%s/tiny",key="ci",namespace="%s",type="output"}`, ns, ns))
}

// TestAttackBrokenStreamIsFree: a tenant whose streams break is metered for what it
// received. Its one replica's connection drops mid-stream (as when a tenant's model
// crashes its runner on demand), with n: 1 and with n: 3, and no replica continues
// the stream; and a stream whose client goes away while the agent does not end the
// answer (its cancel endpoint answers 503). On 8cd05e0 each was metered at 0 (seen,
// with the gateway's count not metered: 0 output tokens for the n: 1 stream whose
// replica sent 25); now
// each is metered at the gateway's own count of the tokens it relayed, the tokens
// the replica sent.
func TestAttackBrokenStreamIsFree(t *testing.T) {
	g, p, ns, oc := brokenFleet(t)
	params := func(n int64) openai.ChatCompletionNewParams {
		pr := chat(200)
		pr.N = openai.Int(n)
		pr.Temperature = openai.Float(1)
		return pr
	}
	for _, n := range []int64{1, 3} {
		var before float64
		var sentBefore int64
		var s *ssestream.Stream[openai.ChatCompletionChunk]
		received := 0
		// The random-weight model's answer at temperature 1 may end by itself within
		// the 4 events before the cut (its end of text sampled): the proxy cut
		// nothing, and the stream is asked again, up to 3 times.
		for attempt := 1; ; attempt++ {
			before, sentBefore = meteredOutput(t, g, ns), p.passed()
			cutsBefore := p.cuts.Load()
			p.cutAfter.Store(4)
			s = oc.Chat.Completions.NewStreaming(t.Context(), params(n))
			received = 0
			for s.Next() {
				for _, c := range s.Current().Choices {
					if c.Delta.Content != "" {
						received++
					}
				}
			}
			_ = s.Close()
			if s.Err() != nil || p.cuts.Load() != cutsBefore || attempt == 3 {
				break
			}
			t.Logf("n: %d, attempt %d: the answer ended by itself before the proxy's cut; asking again", n, attempt)
		}
		if s.Err() == nil {
			t.Fatalf("n: %d: the cut stream ended without an error", n)
		}
		sent := p.passed() - sentBefore
		var metered float64
		testenv.Eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
			metered = meteredOutput(t, g, ns) - before
			return metered == float64(sent), fmt.Sprintf("n: %d: metered %v output tokens, the replica sent %d", n, metered, sent)
		})
		t.Logf("n: %d, cut after 4 events: the client received %d content chunks (%v), the replica sent %d tokens, metered %v",
			n, received, s.Err(), sent, metered)
		if sent == 0 || int64(received) > sent {
			t.Errorf("n: %d: the replica sent %d tokens and the client received %d chunks", n, sent, received)
		}
	}

	// A client that goes away; the agent cannot be asked to end the answer.
	p.cutAfter.Store(0)
	p.stallAfter.Store(6)
	p.refuseCancel.Store(true)
	before, sentBefore := meteredOutput(t, g, ns), p.passed()
	// The replica may still be busy with the streams cut above: the stream to abandon
	// is asked for until it has sent 3 chunks (the proxy stalls it after 6 events).
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		s := oc.Chat.Completions.NewStreaming(ctx, params(1))
		defer s.Close()
		got := 0
		for got < 3 && s.Next() {
			got++
		}
		return got == 3, fmt.Sprintf("the stream to abandon sent %d chunks: %v", got, s.Err())
	})
	var metered float64
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		metered = meteredOutput(t, g, ns) - before
		return metered > 0, "a cancelled stream the agent did not end: metered 0"
	})
	sent := p.passed() - sentBefore
	t.Logf("a client gone after 3 chunks, the agent not asked: the replica sent %d tokens, metered %v", sent, metered)
	if metered > float64(sent) {
		t.Errorf("metered %v output tokens of a stream whose replica sent %d", metered, sent)
	}
}
