package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/test/support/otlptest"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// usageCase is one kind of request of the metering test: its path and body. A
// cancelled case is a stream its client abandons mid-stream (see cancelMidStream).
type usageCase struct {
	name, path string
	body       func(model string, i int) string
	cancelled  bool
}

// cancelledMaxTokens is the max_tokens of the streams the metering test abandons:
// far more than the client waits for, so that each is cut off mid-stream (the
// synthesized model runs to max_tokens).
const cancelledMaxTokens = 400

// usageCases mix the APIs and their forms: streamed and not, two choices, a forced
// tool call, Responses and Anthropic Messages (translated on the agent), each with
// prompts that differ so that the prompt cache serves some of them in part.
var usageCases = []usageCase{
	{"chat", "/v1/chat/completions", func(m string, i int) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"Count to %d."}]}`, m, 3+i%5, i)
	}, false},
	{"chat-stream", "/v1/chat/completions", func(m string, i int) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true},
			"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say %d."}]}`, m, 2+i%7, i)
	}, false},
	{"chat-n2", "/v1/chat/completions", func(m string, i int) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":4,"n":2,"seed":%d,"messages":[{"role":"user","content":"Pick %d."}]}`, m, i, i)
	}, false},
	{"tool-call", "/v1/chat/completions", func(m string, i int) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":24,"seed":%d,"tool_choice":"required","parallel_tool_calls":false,
			"tools":[%s],"messages":[{"role":"user","content":"Weather in city %d?"}]}`, m, i, e2eWeatherTool, i)
	}, false},
	{"responses", "/v1/responses", func(m string, i int) string {
		return fmt.Sprintf(`{"model":%q,"max_output_tokens":5,"input":"Name %d things."}`, m, i)
	}, false},
	{"messages", "/v1/messages", func(m string, i int) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":"Hello %d"}]}`, m, i)
	}, false},
	{"messages-stream", "/v1/messages", func(m string, i int) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":6,"stream":true,"system":"Terse.","messages":[{"role":"user","content":"Hi %d"}]}`, m, i)
	}, false},
	{"chat-stream-cancelled", "/v1/chat/completions", func(m string, i int) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true},
			"messages":[{"role":"user","content":"Tell a long story about %d."}]}`, m, cancelledMaxTokens, i)
	}, true},
}

// TestUsageMetersEveryAnswer sends 200 mixed requests with three keys of two
// namespaces through the gateway to real runners, adds up the usage each response
// reports to its client, and requires the gateway's counters per key, namespace and
// deployment to equal those sums exactly, token for token. Some of the requests are
// streams their client abandons mid-stream: for those, the usage is the prompt's (on
// the first chunk) and the tokens the runner itself says it generated (its
// runner.decode span, which its agent exports to an OTLP receiver in this test).
func TestUsageMetersEveryAnswer(t *testing.T) {
	if err := apiModel(); err != nil {
		t.Fatal(err)
	}
	rcv, err := otlptest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	restartAgentsWith(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.URL, "OTEL_BSP_SCHEDULE_DELAY=100"})
	nsA, nsB := testenv.NewNamespace(t, fleet.Client), testenv.NewNamespace(t, fleet.Client)
	llama := func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model.Source = fleet.ModelsURL + "/llama31.gguf"
		md.Spec.Engine.ContextLength = 2048
	}
	create(t, deployment(nsA, "assistant", 1, llama))
	create(t, deployment(nsB, "assistant", 1, llama))
	base, reg := inProcessGateway(t, gateway.Config{TenantKeys: true}, testr.New(t))
	type caller struct{ ns, name, key string }
	callers := []caller{{nsA, "ci", newKey(t)}, {nsA, "app", newKey(t)}, {nsB, "ci", newKey(t)}}
	for _, c := range callers {
		createKey(t, c.ns, c.name, c.key)
	}
	waitReady(t, nsA, "assistant", 1, 3*time.Minute)
	waitReady(t, nsB, "assistant", 1, 3*time.Minute)
	for _, c := range callers {
		testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
			code, body := rawPost(t, base, "/v1/chat/completions", c.key, usageCases[0].body("assistant", 0))
			return code == http.StatusOK, fmt.Sprintf("%s/%s's first request: %d %s", c.ns, c.name, code, body)
		})
	}
	// The requests above count too: start from the counters as they are now.
	type labels struct{ ns, key string }
	before := map[labels]metering.Usage{}
	requestsBefore := map[labels]float64{}
	read := func(c caller) (metering.Usage, float64) {
		l := map[string]string{"namespace": c.ns, "key": c.name, "deployment": c.ns + "/assistant"}
		get := func(kind string) int64 {
			l["type"] = kind
			defer delete(l, "type")
			return int64(metricValue(t, reg, "macfleet_usage_tokens_total", l))
		}
		return metering.Usage{Input: get(metering.TypeInput), Cached: get(metering.TypeCached), Output: get(metering.TypeOutput)},
			metricValue(t, reg, "macfleet_usage_requests_total", l)
	}
	for _, c := range callers {
		before[labels{c.ns, c.name}], requestsBefore[labels{c.ns, c.name}] = read(c)
	}

	const total = 200
	sums := map[labels]metering.Usage{}
	counts := map[labels]float64{}
	kinds := map[string]int{}
	// cancelled are the abandoned streams' trace ids by key: their output is what their
	// runner reports it generated.
	cancelled := map[labels][]abandoned{}
	for i := range total {
		c := callers[i%len(callers)]
		uc := usageCases[(i/len(callers))%len(usageCases)]
		l := labels{c.ns, c.name}
		var u metering.Usage
		if uc.cancelled {
			var a abandoned
			u, a = cancelMidStream(t, base, uc.path, c.key, uc.body("assistant", i))
			cancelled[l] = append(cancelled[l], a)
		} else {
			u = postForUsage(t, base, uc.path, c.key, uc.body("assistant", i))
		}
		sums[l] = sums[l].Add(u)
		counts[l]++
		kinds[uc.name]++
	}
	t.Logf("%d requests: %v", total, kinds)
	// stops are how long after its client went away each abandoned answer's runner
	// stopped generating (its runner.decode span's end).
	var stops []time.Duration
	for l, as := range cancelled {
		for _, a := range as {
			n, end := runnerGenerated(t, rcv, a.trace)
			if n <= 0 || n >= cancelledMaxTokens {
				t.Errorf("trace %s: the runner generated %d tokens of %d: the stream was not cut off mid-stream",
					a.trace, n, cancelledMaxTokens)
			}
			u := sums[l]
			u.Output += int64(n)
			sums[l] = u
			stops = append(stops, end.Sub(a.gone))
		}
	}
	slices.Sort(stops)
	if len(stops) > 0 {
		t.Logf("%d abandoned streams: the runner stopped generating %v (median), %v (max) after the client went away",
			len(stops), stops[len(stops)/2], stops[len(stops)-1])
	}
	for _, ns := range []string{nsA, nsB} {
		var want float64
		for l, as := range cancelled {
			if l.ns == ns {
				want += float64(len(as))
			}
		}
		l := map[string]string{"model": ns + "/assistant", "outcome": "metered"}
		if got := metricValue(t, reg, "macfleet_gateway_cancellations_total", l); got != want || want == 0 {
			t.Errorf("%s: %v cancelled answers metered, want %v (> 0)", ns, got, want)
		}
	}
	for _, c := range callers {
		l := labels{c.ns, c.name}
		got, requests := read(c)
		b := before[l]
		got = metering.Usage{Input: got.Input - b.Input, Cached: got.Cached - b.Cached, Output: got.Output - b.Output}
		if got != sums[l] || requests-requestsBefore[l] != counts[l] {
			t.Errorf("key %s/%s: the counters grew by %+v over %v requests; the responses' usage adds up to %+v over %v",
				c.ns, c.name, got, requests-requestsBefore[l], sums[l], counts[l])
		}
		if sums[l].Input == 0 || sums[l].Output == 0 {
			t.Errorf("key %s/%s: the responses report no usage (%+v): nothing was compared", c.ns, c.name, sums[l])
		}
	}
}

// restartAgentsWith restarts every Mac's agent with env and
// waits until each is Ready; at the end of the test they restart as they were.
func restartAgentsWith(t *testing.T, env []string) {
	t.Helper()
	restart := func(env []string) {
		for name := range fleet.Agents() {
			if err := fleet.StopAgent(name, time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := fleet.StartAgentWith(name, env, nil); err != nil {
				t.Fatal(err)
			}
		}
		for name := range fleet.Agents() {
			if err := fleet.WaitNodeReady(context.Background(), name); err != nil {
				t.Fatal(err)
			}
		}
	}
	restart(env)
	t.Cleanup(func() { restart(nil) })
}

// abandoned is a stream its client went away from: its trace id and when it left.
type abandoned struct {
	trace string
	gone  time.Time
}

// cancelMidStream posts a streamed chat completion whose first chunk carries the
// prompt's usage (runnerapi.HeaderPromptUsage), under a trace of its own, reads until
// some content arrived and then goes away. It returns the prompt's usage (no output)
// and the stream.
func cancelMidStream(t *testing.T, base, path, key, body string) (metering.Usage, abandoned) {
	t.Helper()
	trace := rand.Text()[:16]
	trace = fmt.Sprintf("%x", trace)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(runnerapi.HeaderPromptUsage, "first-chunk")
	req.Header.Set("traceparent", "00-"+trace+"-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s %s: %d %s", path, body, resp.StatusCode, b)
	}
	var prompt *metering.Usage
	contents := 0
	sc := bufio.NewScanner(resp.Body)
	for contents < 3 && sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if prompt == nil {
			u := clientUsage(t, []byte(data))
			prompt = &u
			continue
		}
		if strings.Contains(data, `"content":"`) && !strings.Contains(data, `"content":""`) {
			contents++
		}
		if strings.Contains(data, `"finish_reason":"`) || data == "[DONE]" {
			t.Fatalf("trace %s: the stream ended before it was abandoned: %s", trace, data)
		}
	}
	if prompt == nil || contents < 3 {
		t.Fatalf("trace %s: the stream ended after %d content chunks (%v)", trace, contents, sc.Err())
	}
	if prompt.Output != 0 {
		t.Fatalf("trace %s: the first chunk's usage %+v has output tokens", trace, *prompt)
	}
	cancel()
	return *prompt, abandoned{trace: trace, gone: time.Now()}
}

// runnerGenerated is how many tokens the runner says it generated for the request of
// trace id trace, and when it stopped: the macfleet.completion_tokens and the end of
// its runner.decode span.
func runnerGenerated(t *testing.T, rcv *otlptest.Receiver, trace string) (int, time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	find := func(spans []otlptest.Span) *otlptest.Span {
		for i, s := range spans {
			if s.Name == "runner.decode" {
				return &spans[i]
			}
		}
		return nil
	}
	spans, err := rcv.Wait(ctx, trace, func(spans []otlptest.Span) bool { return find(spans) != nil })
	s := find(spans)
	if err != nil || s == nil {
		t.Fatalf("trace %s: no runner.decode span (%v): %v", trace, err, describeSpans(spans))
	}
	n, err := strconv.Atoi(s.Attrs["macfleet.completion_tokens"])
	if err != nil {
		t.Fatalf("trace %s: runner.decode has no token count: %v", trace, s.Attrs)
	}
	return n, s.End
}

// postForUsage posts body with key and returns the usage the response reports to the
// client, whichever API shape (chat completions, Responses, Anthropic Messages) and
// form (JSON or event stream) it has. For a stream it is the last usage the events carry.
func postForUsage(t *testing.T, base, path, key, body string) metering.Usage {
	t.Helper()
	resp := postWithKey(t, base, path, key, body)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s %s: %d %s", path, body, resp.StatusCode, b)
	}
	// Read after the body: the trailer is the gateway's, never the client's.
	defer func() {
		if v := resp.Trailer.Get(metering.Header) + resp.Header.Get(metering.Header); v != "" {
			t.Errorf("%s: the agent's usage %q reached the client", path, v)
		}
	}()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return clientUsage(t, b)
	}
	var last metering.Usage
	found := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" || !strings.Contains(data, `"usage"`) {
			continue
		}
		last, found = clientUsage(t, []byte(data)), true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !found {
		t.Fatalf("%s %s: the stream reported no usage", path, body)
	}
	return last
}

// clientUsage reads the usage of a response or event in any of the three shapes: a
// chat completion's (prompt_tokens…), a Responses one's (input_tokens with
// input_tokens_details), an Anthropic one's (input_tokens not read from the cache,
// cache_read_input_tokens). Responses events hold it under response, Anthropic's
// message_start under message.
func clientUsage(t *testing.T, b []byte) metering.Usage {
	t.Helper()
	type usage struct {
		PromptTokens        *int64 `json:"prompt_tokens"`
		CompletionTokens    int64  `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int64 `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
		InputTokens        int64 `json:"input_tokens"`
		OutputTokens       int64 `json:"output_tokens"`
		InputTokensDetails *struct {
			CachedTokens int64 `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		CacheRead *int64 `json:"cache_read_input_tokens"`
	}
	var v struct {
		Usage    *usage                  `json:"usage"`
		Response *struct{ Usage *usage } `json:"response"`
		Message  *struct{ Usage *usage } `json:"message"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	u := v.Usage
	switch {
	case u != nil:
	case v.Response != nil && v.Response.Usage != nil:
		u = v.Response.Usage
	case v.Message != nil && v.Message.Usage != nil:
		u = v.Message.Usage
	default:
		t.Fatalf("no usage in %s", b)
	}
	switch {
	case u.PromptTokens != nil: // chat completions
		return metering.Usage{Input: *u.PromptTokens, Cached: u.PromptTokensDetails.CachedTokens, Output: u.CompletionTokens}
	case u.CacheRead != nil: // Anthropic: input_tokens leaves out what the cache served
		return metering.Usage{Input: u.InputTokens + *u.CacheRead, Cached: *u.CacheRead, Output: u.OutputTokens}
	case u.InputTokensDetails != nil: // Responses
		return metering.Usage{Input: u.InputTokens, Cached: u.InputTokensDetails.CachedTokens, Output: u.OutputTokens}
	}
	t.Fatalf("usage of no known shape in %s", b)
	return metering.Usage{}
}
