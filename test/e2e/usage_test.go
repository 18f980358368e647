package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/internal/testenv"
	"github.com/macfleet/macfleet/metering"
)

// usageCase is one kind of request of the metering test: its path and body.
type usageCase struct {
	name, path string
	body       func(model string, i int) string
}

// usageCases mix the APIs and their forms: streamed and not, two choices, a forced
// tool call, Responses and Anthropic Messages (translated on the agent), each with
// prompts that differ so that the prompt cache serves some of them in part.
var usageCases = []usageCase{
	{"chat", "/v1/chat/completions", func(m string, i int) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"Count to %d."}]}`, m, 3+i%5, i)
	}},
	{"chat-stream", "/v1/chat/completions", func(m string, i int) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true},
			"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say %d."}]}`, m, 2+i%7, i)
	}},
	{"chat-n2", "/v1/chat/completions", func(m string, i int) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":4,"n":2,"seed":%d,"messages":[{"role":"user","content":"Pick %d."}]}`, m, i, i)
	}},
	{"tool-call", "/v1/chat/completions", func(m string, i int) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":24,"seed":%d,"tool_choice":"required","parallel_tool_calls":false,
			"tools":[%s],"messages":[{"role":"user","content":"Weather in city %d?"}]}`, m, i, e2eWeatherTool, i)
	}},
	{"responses", "/v1/responses", func(m string, i int) string {
		return fmt.Sprintf(`{"model":%q,"max_output_tokens":5,"input":"Name %d things."}`, m, i)
	}},
	{"messages", "/v1/messages", func(m string, i int) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":"Hello %d"}]}`, m, i)
	}},
	{"messages-stream", "/v1/messages", func(m string, i int) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":6,"stream":true,"system":"Terse.","messages":[{"role":"user","content":"Hi %d"}]}`, m, i)
	}},
}

// TestUsageMetersEveryAnswer sends 200 mixed requests with three keys of two
// namespaces through the gateway to real runners, adds up the usage each response
// reports to its client, and requires the gateway's counters per key, namespace and
// deployment to equal those sums exactly, token for token.
func TestUsageMetersEveryAnswer(t *testing.T) {
	if err := apiModel(); err != nil {
		t.Fatal(err)
	}
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
	for i := range total {
		c := callers[i%len(callers)]
		uc := usageCases[(i/len(callers))%len(usageCases)]
		u := postForUsage(t, base, uc.path, c.key, uc.body("assistant", i))
		l := labels{c.ns, c.name}
		sums[l] = sums[l].Add(u)
		counts[l]++
		kinds[uc.name]++
	}
	t.Logf("%d requests: %v", total, kinds)
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
