package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// idleProxy is a TCP proxy that closes a connection on which no byte moved either way
// for idle, as a cloud load balancer does (an AWS ALB after 60 s, GKE after 30 s).
type idleProxy struct {
	ln     net.Listener
	to     string
	idle   time.Duration
	cuts   atomic.Int32 // connections closed for idleness
	accept atomic.Int32 // connections taken
}

func startIdleProxy(t *testing.T, to string, idle time.Duration) *idleProxy {
	t.Helper()
	p := &idleProxy{ln: loopback(t), to: to, idle: idle}
	go func() {
		for {
			c, err := p.ln.Accept()
			if err != nil {
				return
			}
			p.accept.Add(1)
			go p.serve(c)
		}
	}()
	return p
}

func (p *idleProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *idleProxy) serve(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("tcp", p.to)
	if err != nil {
		return
	}
	defer up.Close()
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	done := make(chan struct{}, 2)
	pump := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				last.Store(time.Now().UnixNano())
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		done <- struct{}{}
	}
	go pump(up, c)
	go pump(c, up)
	tick := time.NewTicker(p.idle / 20)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			if time.Since(time.Unix(0, last.Load())) >= p.idle {
				p.cuts.Add(1)
				return // the deferred closes cut both sides
			}
		}
	}
}

// keepAliveTiming is the test's scale: the proxy's idle timeout, the gateway's
// keep-alive interval and how long the cold start holds the streams. The short one
// runs in CI; MACFLEET_KEEPALIVE_LONG=1 runs the real values (a load balancer
// that closes connections idle 30 s, the default 10 s interval, a 2 minute hold).
func keepAliveTiming() (idle, interval, hold time.Duration) {
	if os.Getenv("MACFLEET_KEEPALIVE_LONG") != "" {
		return 30 * time.Second, gateway.DefaultStreamKeepAlive, 2 * time.Minute
	}
	return 2 * time.Second, 500 * time.Millisecond, 6 * time.Second
}

// heldFleet is the deployment "tiny" with one replica on a real agent that is not
// Ready yet (a cold start), in a namespace of its own; ready makes it Ready.
func heldFleet(t *testing.T) (e *testenv.Env, ns string, ready func()) {
	t.Helper()
	runner := os.Getenv(runnerproc.RunnerEnv)
	if runner == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	e = cluster(t)
	agent := startAgent(t, runner)
	f := &fleet{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)}
	mac := "mac-" + f.ns
	f.node(mac, metav1.ConditionTrue)
	f.deployment("tiny", "", 1)
	f.replica("tiny-0", "tiny", mac)
	f.setReplica("tiny-0", metav1.ConditionFalse, agent)
	return e, f.ns, func() { f.setReplica("tiny-0", metav1.ConditionTrue, agent) }
}

// streamResult is how one held stream ended: its text, when its first token came and
// its error.
type streamResult struct {
	text  string
	first time.Time
	err   error
}

// chatStream streams a chat completion from the official OpenAI client.
func chatStream(ctx context.Context, base string) streamResult {
	oc := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("none"), option.WithMaxRetries(0))
	s := oc.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "tiny",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello there")}, MaxTokens: openai.Int(6), Temperature: openai.Float(0)})
	var res streamResult
	for s.Next() {
		for _, c := range s.Current().Choices {
			if c.Delta.Content != "" && res.first.IsZero() {
				res.first = time.Now()
			}
			res.text += c.Delta.Content
		}
	}
	res.err = s.Err()
	return res
}

// messagesStream streams an Anthropic Messages request and reads its events; pings
// counts the ping events before the first text.
func messagesStream(ctx context.Context, base string) (res streamResult, pings int, stopped bool) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/messages", strings.NewReader(
		`{"model":"tiny","max_tokens":6,"stream":true,"temperature":0,"messages":[{"role":"user","content":"Hello there"}]}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return streamResult{err: err}, 0, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return streamResult{err: fmt.Errorf("%d %s", resp.StatusCode, b)}, 0, false
	}
	data, err := io.ReadAll(resp.Body)
	res.err = err
	for _, block := range strings.Split(string(data), "\n\n") {
		_, payload, ok := strings.Cut(block, "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type  string `json:"type"`
			Delta struct {
				Text string `json:"text"`
			} `json:"delta"`
		}
		if json.Unmarshal([]byte(payload), &ev) != nil {
			res.err = errors.Join(res.err, fmt.Errorf("event %q", payload))
			continue
		}
		switch ev.Type {
		case "ping":
			if res.text == "" {
				pings++
			}
		case "content_block_delta":
			res.text += ev.Delta.Text
		case "message_stop":
			stopped = true
		}
	}
	return res, pings, stopped
}

// TestHeldStreamThroughIdleClosingProxy: streams held for a cold start much longer than
// a proxy in front of the gateway lets a connection stay idle complete through it
// with the gateway's keep-alives (Chat Completions by the official OpenAI client, and
// Anthropic Messages with its ping events), against a real agent and runner; the same
// stream through the same proxy to a gateway without keep-alives is cut, so the proxy
// really cuts.
func TestHeldStreamThroughIdleClosingProxy(t *testing.T) {
	idle, interval, hold := keepAliveTiming()
	e, ns, ready := heldFleet(t)
	g := startGateway(t, e, gateway.Config{StreamKeepAlive: interval, ColdStartTimeout: hold + 2*time.Minute})
	bare := startGateway(t, e, gateway.Config{StreamKeepAlive: -1, ColdStartTimeout: hold + 2*time.Minute})
	waitModel(t, g, "tiny", ns, 0)
	waitModel(t, bare, "tiny", ns, 0)
	ctx, cancel := context.WithTimeout(t.Context(), hold+5*time.Minute)
	defer cancel()

	// Without keep-alives: the proxy cuts the held stream once it was idle.
	bp := startIdleProxy(t, strings.TrimPrefix(bare.url, "http://"), idle)
	start := time.Now()
	if res := chatStream(ctx, bp.url()); res.err == nil {
		t.Fatalf("a held stream without keep-alives came through the idle-closing proxy: %q", res.text)
	} else if bp.cuts.Load() != 1 {
		t.Fatalf("the stream failed (%v) without the proxy cutting it", res.err)
	} else {
		t.Logf("Without keep-alives the proxy cut the held stream after %v: %v", time.Since(start).Round(time.Millisecond), res.err)
	}

	// With them: both streams are held for the whole cold start and complete.
	p := startIdleProxy(t, strings.TrimPrefix(g.url, "http://"), idle)
	var wg sync.WaitGroup
	var chat, msgs streamResult
	var pings int
	var stopped bool
	start = time.Now()
	wg.Go(func() { chat = chatStream(ctx, p.url()) })
	wg.Go(func() { msgs, pings, stopped = messagesStream(ctx, p.url()) })
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		return p.accept.Load() == 2, fmt.Sprintf("%d connections at the proxy", p.accept.Load())
	})
	// The cold start ends after hold (the scenario's length, not a wait for something):
	// the replica becomes Ready.
	select {
	case <-time.After(hold):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	ready()
	wg.Wait()
	took := time.Since(start)
	if chat.err != nil || chat.text == "" || chat.first.Sub(start) < hold {
		t.Errorf("chat: %q, first token after %v, err %v; want text after at least %v", chat.text, chat.first.Sub(start), chat.err, hold)
	}
	if msgs.err != nil || msgs.text == "" || !stopped || pings < int(hold/interval)/2 {
		t.Errorf("messages: %q, message_stop %v, %d pings before the text, err %v", msgs.text, stopped, pings, msgs.err)
	}
	if c := p.cuts.Load(); c != 0 {
		t.Errorf("the proxy cut %d connections", c)
	}
	t.Logf("Held %v (proxy idle timeout %v, keep-alive interval %v): both streams completed in %v, %d pings", hold, idle, interval, took.Round(time.Millisecond), pings)
}

// TestHeldStreamErrorAfterKeepAlive: a stream whose status a keep-alive committed and
// whose cold start then times out ends with the API's own error event, read as an
// error by the official OpenAI client (Chat Completions) and as an "error" event on
// the Responses API, both saying why.
func TestHeldStreamErrorAfterKeepAlive(t *testing.T) {
	e, ns, _ := heldFleet(t)
	g := startGateway(t, e, gateway.Config{StreamKeepAlive: 100 * time.Millisecond, ColdStartTimeout: time.Second})
	waitModel(t, g, "tiny", ns, 0)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res := chatStream(ctx, g.url)
	if res.err == nil || !strings.Contains(res.err.Error(), "no_ready_replica") || !strings.Contains(res.err.Error(), "became ready within 1s") {
		t.Errorf("chat stream: %q, err %v; want the cold start's timeout as the stream's error", res.text, res.err)
	}

	oc := openai.NewClient(option.WithBaseURL(g.url+"/v1/"), option.WithAPIKey("none"), option.WithMaxRetries(0))
	var hr *http.Response
	s := oc.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: "tiny",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Hello there")}}, option.WithResponseInto(&hr))
	var got []string
	for s.Next() {
		ev := s.Current()
		got = append(got, ev.Type)
		if ev.Type == "error" && (ev.Code != "no_ready_replica" || !strings.Contains(ev.Message, "became ready within 1s")) {
			t.Errorf("error event %+v", ev)
		}
	}
	if s.Err() != nil || hr == nil || hr.StatusCode != http.StatusOK || strings.Join(got, " ") != "error" {
		t.Errorf("responses stream: events %q, err %v, response %v; want 200 and one error event", got, s.Err(), hr)
	}
}
