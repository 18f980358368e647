package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/metering"
)

// TestCleanEndUsage: a Chat Completions stream that broke after its finish_reason or a
// tool call, and so ended cleanly, is metered by the gateway's count (the prompt as
// the runner reported it on the first event, every completion token the client got),
// cut to the request's bound as a report is, and with stream_options.include_usage
// its last chunk before [DONE] is that usage. An older runner, which reports no
// prompt, leaves it unmetered and without a usage chunk, as before.
func TestCleanEndUsage(t *testing.T) {
	const asked = `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"count"}]}`
	const plain = `{"model":"m","stream":true,"messages":[{"role":"user","content":"count"}]}`
	for _, tc := range []struct {
		name  string
		agent *streamingAgent
		body  string
		// finish is the stream's last finish_reason; usage the client's usage chunk
		// ("" for none); metered the counted input, cached and output ("" for none);
		// clamped the reports counted over their bound.
		finish, usage, metered string
		clamped                float64
	}{
		{name: "after its finish", agent: &streamingAgent{first: []string{"One", ", two"}, firstEnd: "finish_cut"}, body: asked,
			finish: "stop", usage: "prompt 5 (2 cached), completion 2, total 7", metered: "5 2 2"},
		{name: "after its finish, no usage asked", agent: &streamingAgent{first: []string{"One", ", two"}, firstEnd: "finish_cut"},
			body: plain, finish: "stop", metered: "5 2 2"},
		{name: "after a tool call", agent: &streamingAgent{first: []string{"One"}, firstEnd: "cut", tool: `{"a":1}`}, body: asked,
			finish: "tool_calls", usage: "prompt 5 (2 cached), completion 3, total 8", metered: "5 2 3"},
		{name: "inside a tool call", agent: &streamingAgent{first: []string{"One"}, firstEnd: "engine_stopped", tool: `{"a`}, body: asked,
			finish: "length", usage: "prompt 5 (2 cached), completion 3, total 8", metered: "5 2 3"},
		{name: "no cached tokens", agent: &streamingAgent{first: []string{"One"}, firstEnd: "finish_cut", prompt: "4 0"}, body: asked,
			finish: "stop", usage: "prompt 4 (0 cached), completion 1, total 5", metered: "4 0 1"},
		{name: "a prompt over the bound", agent: &streamingAgent{first: []string{"One"}, firstEnd: "finish_cut", prompt: "1099511627776 0"},
			body: asked, finish: "stop", usage: fmt.Sprintf("prompt %d (0 cached), completion 1, total %d", overBound(), overBound()+1),
			metered: fmt.Sprintf("%d 0 1", overBound()), clamped: 1},
		{name: "an older runner", agent: &streamingAgent{first: []string{"One"}, firstEnd: "finish_cut", noPrompt: true}, body: asked,
			finish: "stop"},
		{name: "a prompt line that is not one", agent: &streamingAgent{first: []string{"One"}, firstEnd: "finish_cut", prompt: "5"},
			body: asked, finish: "stop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, tc.agent.serve)
			g := newTestGateway(t, Options{})
			g.serveReplicas(up.host(), up.host())
			resp, err := http.Post(g.url+"/v1/chat/completions", "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			finish, usage, tail := readCleanEnd(t, string(b))
			if finish != tc.finish || usage != tc.usage {
				t.Errorf("finish %q, usage %q; want %q, %q in\n%s", finish, usage, tc.finish, tc.usage, b)
			}
			want := []string{"chunk", "[DONE]"}
			if tc.usage != "" {
				want[0] = "usage"
			}
			if !cmp.Equal(tail, want) {
				t.Errorf("the stream ends with %q, want %q", tail, want)
			}
			tokens := func(kind string) int64 {
				return int64(testutil.ToFloat64(g.metrics.usage.Tokens.WithLabelValues("", "", "a/m", kind)))
			}
			metered := fmt.Sprintf("%d %d %d", tokens(metering.TypeInput), tokens(metering.TypeCached), tokens(metering.TypeOutput))
			if g.metered() == 0 {
				metered = ""
			}
			if metered != tc.metered || g.metered() > 1 {
				t.Errorf("metered %q in %v answers, want %q", metered, g.metered(), tc.metered)
			}
			if n := testutil.ToFloat64(g.metrics.usageClamped.WithLabelValues("a/m", metering.ClampInput)); n != tc.clamped {
				t.Errorf("usage_clamped_total{input} = %v, want %v", n, tc.clamped)
			}
		})
	}
}

// overBound is the most prompt tokens a request of the test gateway's replicas (which
// name no context) is metered.
func overBound() int64 { return metering.Limits{Sequences: 1, Generates: true}.Bound().Input }

// readCleanEnd reads a Chat Completions stream's events: its last finish_reason, its
// usage chunk ("" for none) and what its last two events were ("usage", "[DONE]",
// "chunk").
func readCleanEnd(t *testing.T, stream string) (finish, usage string, tail []string) {
	t.Helper()
	for ev := range strings.SplitSeq(strings.TrimSpace(stream), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("event %q is not one data line", ev)
		}
		kind := "chunk"
		var c runnerapi.ChatCompletionChunk
		switch {
		case data == "[DONE]":
			kind = "[DONE]"
		case json.Unmarshal([]byte(data), &c) != nil:
			t.Fatalf("event %q is not a chunk", ev)
		case c.Usage != nil:
			if usage != "" {
				t.Errorf("a second usage chunk %q", data)
			}
			cached := 0
			if d := c.Usage.PromptTokensDetails; d != nil {
				cached = d.CachedTokens
			}
			usage, kind = fmt.Sprintf("prompt %d (%d cached), completion %d, total %d", c.Usage.PromptTokens, cached,
				c.Usage.CompletionTokens, c.Usage.TotalTokens), "usage"
		}
		for _, ch := range c.Choices {
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
		tail = append(tail, kind)
	}
	return finish, usage, tail[max(len(tail)-2, 0):]
}
