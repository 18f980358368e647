package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// prefixSystem is a system prompt long enough (about a thousand tokens of the
// synthesized model's small vocabulary) that a replica holding it is worth a detour.
var prefixSystem = "You are the reviewer of a Go code base. " + strings.Repeat(
	"Check every exported name for a doc comment, every error for a wrapped cause, every goroutine for a way to end, "+
		"and every lock for the shortest hold. ", 8)

// prefixChat is a chat completion of model: the system prompt, then alternating user
// and assistant messages.
func prefixChat(model string, maxTokens int, turns ...string) string {
	msgs := []map[string]string{{"role": "system", "content": prefixSystem}}
	for i, text := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": text})
	}
	b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": maxTokens, "temperature": 0, "messages": msgs})
	return string(b)
}

// answerContent is the first choice's message of a chat completion's answer.
func answerContent(t *testing.T, body string) string {
	t.Helper()
	var answer struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(body), &answer); err != nil || len(answer.Choices) == 0 {
		t.Fatalf("the answer %s: %v", body, err)
	}
	return answer.Choices[0].Message.Content
}

// postChat posts a chat completion to the gateway at base.
func postChat(ctx context.Context, base, body string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewBufferString(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestPrefixCacheRouting: a deployment of two replicas (two sequence slots each)
// behind a gateway with --routing=prefix-cache. A conversation's first turn lands on
// some replica (the fallback: nobody holds it yet); its runner reports the prefix it
// now holds, and the gateway's index learns it. With that replica kept busy by a long
// answer — so that least load would pick the idle other — the conversation's second
// turn and another user's request with the same system prompt both go to the holder
// (routed by a prefix hit) and restore their prefix from its prompt cache: the idle
// replica, which never saw the conversation, could restore none of it. A second
// gateway started afterwards rebuilds its index from the agents and routes the
// conversation's next turn to the holder before it has routed anything else.
//
// It needs the runner and agent side of the fleet prompt cache (prefix events on
// GET /api/models/{id}/prefixes): run it once that is merged.
func TestPrefixCacheRouting(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "cached", 2, func(md *v1alpha1.ModelDeployment) { md.Spec.Engine.ContextLength = 16384 }))
	waitReady(t, ns, "cached", 2, 3*time.Minute)
	model := ns + "/cached"
	// Verbosity 1 logs the failed polls of the agents' prefix events.
	url, reg := inProcessGateway(t, gateway.Config{Routing: gateway.RoutingPrefixCache}, testr.NewWithInterface(t, testr.Options{Verbosity: 1}))
	routed := func(how string) float64 {
		return metricValue(t, reg, "macfleet_gateway_routing_decisions_total", map[string]string{"model": model, "routing": how})
	}
	ask := func(body string) string {
		t.Helper()
		code, text, err := postChat(t.Context(), url, body)
		if err != nil || code != http.StatusOK {
			t.Fatalf("answer %d %s (%v)", code, text, err)
		}
		return text
	}

	const question = "Review this: func f() { go g() }"
	var first string
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		code, text, err := postChat(t.Context(), url, prefixChat(model, 8, question))
		first = text
		return err == nil && code == http.StatusOK, fmt.Sprintf("the gateway does not serve %s yet: %d %s %v", model, code, text, err)
	})
	u1 := answerUsage(t, first)
	if routed("fallback") < 1 {
		t.Errorf("the first turn was not routed by the fallback (%v)", routed("fallback"))
	}
	// A poll that failed (before the gateway's certificate for the agents loaded, say)
	// backs off up to 30 s before the next.
	testenv.Eventually(t, 90*time.Second, 50*time.Millisecond, func() (bool, string) {
		n := metricValue(t, reg, "macfleet_gateway_prefix_index_entries", nil)
		return n > 0, fmt.Sprintf("the gateway's prefix index holds nothing after the first turn (%v polls of the agents failed)",
			metricValue(t, reg, "macfleet_gateway_prefix_index_poll_errors_total", nil))
	})
	reply := answerContent(t, first)

	// Keep the holder busy: a long answer to the same conversation goes there by its
	// prefix and holds one of its two slots.
	hits := routed("prefix_hit")
	busy, stop := context.WithCancel(t.Context())
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _, _ = postChat(busy, url, prefixChat(model, 6000, question, reply, "Now tell a very long story about goroutines."))
	}()
	testenv.Eventually(t, 30*time.Second, 10*time.Millisecond, func() (bool, string) {
		inflight := metricValue(t, reg, "macfleet_gateway_inflight", map[string]string{"model": model})
		return routed("prefix_hit") == hits+1 && inflight == 1,
			fmt.Sprintf("the long answer is not in flight on the holder (%v prefix hits, %v in flight)", routed("prefix_hit")-hits, inflight)
	})

	u2 := answerUsage(t, ask(prefixChat(model, 8, question, reply, "And this: var mu sync.Mutex")))
	t.Logf("turn 1: %d prompt tokens (%d cached); turn 2: %d (%d cached)", u1.Input, u1.Cached, u2.Input, u2.Cached)
	if routed("prefix_hit") != hits+2 {
		t.Errorf("the second turn was not routed by a prefix hit (%v hits)", routed("prefix_hit")-hits)
	}
	if u2.Cached < u1.Input*9/10 {
		t.Errorf("the second turn restored %d of its %d prompt tokens, want at least 90%% of turn 1's %d: it did not reach the holder",
			u2.Cached, u2.Input, u1.Input)
	}

	u3 := answerUsage(t, ask(prefixChat(model, 8, "Review this instead: select {}")))
	t.Logf("another user: %d prompt tokens (%d cached)", u3.Input, u3.Cached)
	if routed("prefix_hit") != hits+3 {
		t.Errorf("another user's request with the same system prompt was not routed by a prefix hit (%v hits)", routed("prefix_hit")-hits)
	}
	if u3.Cached < u1.Input/2 {
		t.Errorf("another user's request restored %d of its %d prompt tokens, want at least the shared system prompt (about half of %d)",
			u3.Cached, u3.Input, u1.Input)
	}
	stop()
	<-done

	// A restarted gateway starts with an empty index and rebuilds it from the agents
	// (their first answer to a caller without an epoch lists every digest held), so
	// before it has routed anything the conversation's next turn is a prefix hit there.
	// Its polls may fail until its client certificate for the agents has loaded, and a
	// failed poll backs off up to 30 s: hence the minute and a half.
	url2, reg2 := inProcessGateway(t, gateway.Config{Routing: gateway.RoutingPrefixCache}, testr.NewWithInterface(t, testr.Options{Verbosity: 1}))
	testenv.Eventually(t, 90*time.Second, 50*time.Millisecond, func() (bool, string) {
		n := metricValue(t, reg2, "macfleet_gateway_prefix_index_entries", nil)
		return n > 0, fmt.Sprintf("a new gateway's prefix index holds nothing (%v polls of the agents failed)",
			metricValue(t, reg2, "macfleet_gateway_prefix_index_poll_errors_total", nil))
	})
	var again string
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		code, text, err := postChat(t.Context(), url2, prefixChat(model, 8, question, reply, "And this: var once sync.Once"))
		again = text
		if err != nil || code != http.StatusOK {
			t.Logf("the new gateway answered %d %s (%v); asking again", code, text, err)
		}
		return err == nil && code == http.StatusOK, fmt.Sprintf("the new gateway does not serve %s yet: %d %s %v", model, code, text, err)
	})
	u4 := answerUsage(t, again)
	t.Logf("through a new gateway: %d prompt tokens (%d cached)", u4.Input, u4.Cached)
	// Every attempt (an attempt that failed after its routing counts too) was a prefix
	// hit: none fell back or went by load.
	if got := routingDecisions(t, reg2, model); got["prefix_hit"] < 1 || len(got) != 1 {
		t.Errorf("the new gateway routed the conversation's next turn by %v, want prefix hits only: its index was not rebuilt from the agents", got)
	}
	if u4.Cached < u1.Input*9/10 {
		t.Errorf("through the new gateway the next turn restored %d of its %d prompt tokens, want at least 90%% of turn 1's %d",
			u4.Cached, u4.Input, u1.Input)
	}
}

// routingDecisions is the gateway's routing decisions for model, by how they were made
// (those made at least once).
func routingDecisions(t *testing.T, reg *prometheus.Registry, model string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "macfleet_gateway_routing_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if v := m.GetCounter().GetValue(); labels["model"] == model && v > 0 {
				got[labels["routing"]] += v
			}
		}
	}
	return got
}
