package e2e

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/ledger"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

const (
	// ledgerStreams and ledgerTokens are the kill test's streams and each one's
	// max_tokens: 48 × 96 tokens, so that 2 % is about 90 tokens.
	ledgerStreams, ledgerTokens = 48, 96
	// ledgerTolerance is how far the ledger may be from what the clients received.
	ledgerTolerance = 0.02
)

// TestLedgerAfterAReplicaKill: 48 streamed chat completions of a team's key (the
// official OpenAI Go client, usage included) through a gateway to a two-replica
// deployment, one replica's runner killed with SIGKILL while they stream, or its
// agent's whole process; those it was writing are continued on the other replica.
// The gateway's ledger (its TokenUsage record of the day, as published to the API
// server) holds within 2 % of the completion tokens the clients received, counted
// twice: the usage chunk each client got, and the tokens of its content (a logprob
// each, plus the end-of-generation token of an answer that stopped).
func TestLedgerAfterAReplicaKill(t *testing.T) {
	t.Run("runner", func(t *testing.T) { ledgerRounds(t, killRunner, nil) })
	t.Run("agent", func(t *testing.T) {
		m := macDown{down: fleet.KillAgent, up: fleet.StartAgent}
		ledgerRounds(t, m.kill, m.restore)
	})
}

// ledgerRounds runs ledgerRound, with kill, until a kill broke a stream (5 rounds at
// most: the victim's requests may all be before their first byte when it falls, and
// are then retried, not continued); restore, when not nil, undoes a kill before the next.
func ledgerRounds(t *testing.T, kill func(t *testing.T, node string, pid int), restore func(*testing.T)) {
	for round := 1; ; round++ {
		if restore != nil && round > 1 {
			restore(t)
		}
		got := ledgerRound(t, kill)
		switch {
		case got.broken() || t.Failed():
			return
		case round == 5:
			t.Fatalf("no stream was continued in %d rounds: the kill broke none", round)
		}
		t.Logf("round %d: the kill broke no stream; again", round)
	}
}

// clientTokens is what the kill test's clients received, summed: the usage chunks'
// prompt and completion tokens (a stream without one: its content's), the completion
// tokens counted from the content, streams continued, and what was wrong with any
// stream (one that broke and could not be continued is metered all the same).
type clientTokens struct {
	prompt, usage, counted int64
	continued, usages      int
	problems               []string
}

// ledgerRound runs one round of TestLedgerAfterAReplicaKill in a namespace of its own
// and compares the gateway's ledger with what the clients received (unless the kill
// broke no stream: then the round proves nothing and the caller tries again).
func ledgerRound(t *testing.T, kill func(t *testing.T, node string, pid int)) clientTokens {
	ns := testenv.NewNamespace(t, fleet.Client)
	gw := "gw-ledger-" + ns
	base, reg := inProcessGateway(t, gateway.Config{TenantKeys: true, GatewayID: gw}, testr.New(t))
	create(t, deployment(ns, "ledger", 2, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Placement.Strategy = v1alpha1.Spread
		// Four slots a replica, so that a kill breaks up to four streams; a
		// continuation's prompt holds the text sent, tokenized again (see
		// survivalRound): 512 tokens a slot leave room for it beside the prompt.
		md.Spec.Engine.Settings = engine.Settings{ContextLength: 2048, Parallel: 4}
	}))
	defer removeDeployment(t, ns, "ledger") // a next round's replicas need the room
	// The probe key's requests wait for the gateway; the streams' key counts only theirs.
	probe, key := newKey(t), newKey(t)
	createKey(t, ns, "probe", probe)
	createKey(t, ns, "streams", key)
	replicas := waitReady(t, ns, "ledger", 2, 3*time.Minute)
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		code, body := rawPost(t, base, "/v1/chat/completions", probe,
			`{"model":"ledger","max_tokens":1,"messages":[{"role":"user","content":"Hi"}]}`)
		return code == http.StatusOK, fmt.Sprintf("the probe: %d %s", code, body)
	})
	sides := replicaSides(t, replicas)

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
	var (
		streaming atomic.Int32
		mu        sync.Mutex
		got       clientTokens
		wg        sync.WaitGroup
	)
	for i := range ledgerStreams {
		wg.Go(func() {
			s := ledgerStream(ctx, c, i, func() { streaming.Add(1) })
			mu.Lock()
			defer mu.Unlock()
			got.add(s)
		})
	}
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	// Kill a replica that writes a stream once 8 have content. Not a replica chosen
	// before: the gateway's fair queue leaves one of the deployment's eight slots to
	// the probe's key (another client, active within 30 s), and runs saw one replica
	// take nearly every stream while the other wrote none for the whole minute.
	deploymentID := ns + "/ledger"
	if killAWriter(ctx, t, sides, &streaming, 8, ended, kill) < 0 {
		if len(got.problems) > 0 {
			t.Errorf("streams failed with no replica killed: %v", got.problems)
		}
		return got // every stream ended first: the round proves nothing
	}
	wg.Wait()
	// The official client closes the body at [DONE], before the X-Macfleet-Continued
	// trailer that follows it: the gateway's count says which streams were continued,
	// once it has ended them all.
	testenv.Eventually(t, 30*time.Second, 10*time.Millisecond, func() (bool, string) {
		n := metricValue(t, reg, "macfleet_gateway_inflight", map[string]string{"model": deploymentID})
		return n == 0, fmt.Sprintf("the gateway still has %.0f requests in flight", n)
	})
	got.continued = int(metricValue(t, reg, "macfleet_gateway_stream_continuations_total",
		map[string]string{"model": deploymentID, "outcome": "continued"}))
	t.Logf("%d streams, %d continued, %d usage chunks; the clients received %d completion tokens by their usage (or content without one), "+
		"%d by their content (prompts %d); problems: %v",
		ledgerStreams, got.continued, got.usages, got.usage, got.counted, got.prompt, got.problems)
	if !got.broken() {
		return got
	}
	compareLedger(t, ns, gw, reg, got)
	return got
}

// streamsPastFirstEvent is the agent at addr's streams of replica key that sent their
// first event and have not ended, less the non-streamed requests it answered (the
// caller takes a count before as its baseline): its TTFT observations (one a stream,
// at its first event) less its answered requests.
func streamsPastFirstEvent(t *testing.T, addr, key string) int {
	fams := agentFamilies(t, localfleet.AgentURL(addr))
	var first, ended float64
	eachSeries(fams["macfleet_agent_ttft_seconds"], map[string]string{"model": key}, func(_ map[string]string, m *dto.Metric) {
		first += float64(m.GetHistogram().GetSampleCount())
	})
	eachSeries(fams["macfleet_agent_requests_total"], map[string]string{"model": key}, func(_ map[string]string, m *dto.Metric) {
		ended += m.GetCounter().GetValue()
	})
	return int(first - ended)
}

// ledgerStreamResult is what one client of the kill test received.
type ledgerStreamResult struct {
	prompt, usage, counted int64
	hasUsage               bool
	problem                string
}

// broken reports whether the kill broke a stream: one was continued, or one failed.
func (c *clientTokens) broken() bool { return c.continued > 0 || len(c.problems) > 0 }

func (c *clientTokens) add(s ledgerStreamResult) {
	c.prompt += s.prompt
	c.usage += s.usage
	c.counted += s.counted
	if s.hasUsage {
		c.usages++
	}
	if s.problem != "" {
		c.problems = append(c.problems, s.problem)
	}
}

// ledgerStream streams one chat completion with the official client and counts what
// it received: its usage chunk, and the tokens of its content (a logprob each, and
// the end-of-generation token of an answer that stopped, which has none). onContent
// is called at its first content.
func ledgerStream(ctx context.Context, c openai.Client, i int, onContent func()) ledgerStreamResult {
	s := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         "ledger",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("Story %d: tell me a long story about the sea.", i))},
		MaxTokens:     openai.Int(ledgerTokens),
		Temperature:   openai.Float(0),
		Logprobs:      openai.Bool(true),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	defer s.Close()
	var r ledgerStreamResult
	finish, content := "", false
	for s.Next() {
		ch := s.Current()
		if ch.JSON.Usage.Valid() {
			r.hasUsage = true
			r.prompt, r.usage = ch.Usage.PromptTokens, ch.Usage.CompletionTokens
		}
		for _, choice := range ch.Choices {
			r.counted += int64(len(choice.Logprobs.Content))
			if choice.FinishReason != "" {
				finish = choice.FinishReason
			}
			if choice.Delta.Content != "" && !content {
				content = true
				onContent()
			}
		}
	}
	if finish == "stop" {
		r.counted++
	}
	if err := s.Err(); err != nil {
		r.problem = fmt.Sprintf("stream %d: %v", i, err)
	} else if !r.hasUsage {
		r.problem = fmt.Sprintf("stream %d: no usage chunk", i)
	}
	if !r.hasUsage {
		// A stream that broke without a usage chunk (one that could not be
		// continued) received what its content holds.
		r.usage = r.counted
	}
	return r
}

// compareLedger waits until the gateway gw published every answer of the streams' key
// that its usage counters hold, and requires the record within ledgerTolerance of the
// completion tokens the clients received, by their usage and by their content.
func compareLedger(t *testing.T, ns, gw string, reg *prometheus.Registry, got clientTokens) {
	t.Helper()
	deploymentID := ns + "/ledger"
	labels := map[string]string{"namespace": ns, "key": "streams", "deployment": deploymentID}
	name := ledger.RecordName(gw, time.Now())
	var rec v1alpha1.KeyUsage
	var counters metering.Usage
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		requests := int64(metricValue(t, reg, "macfleet_usage_requests_total", labels))
		counters = metering.Usage{
			Input:  int64(metricValue(t, reg, "macfleet_usage_tokens_total", withType(labels, metering.TypeInput))),
			Output: int64(metricValue(t, reg, "macfleet_usage_tokens_total", withType(labels, metering.TypeOutput))),
		}
		var tu v1alpha1.TokenUsage
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &tu); err != nil {
			return false, err.Error()
		}
		rec = v1alpha1.KeyUsage{}
		for _, u := range tu.Spec.Usage {
			if u.Key == "streams" && u.Deployment == deploymentID {
				rec = u
			}
		}
		return requests >= ledgerStreams && rec.Requests == requests && rec.OutputTokens == counters.Output,
			fmt.Sprintf("the counters hold %d answers and %+v; record %s: %+v (want every one of %d streams published)",
				requests, counters, name, rec, ledgerStreams)
	})
	t.Logf("ledger (TokenUsage %s/%s): %d answers, %d completion tokens, %d prompt tokens; counters: %+v",
		ns, name, rec.Requests, rec.OutputTokens, rec.InputTokens, counters)
	for _, c := range []struct {
		what     string
		received int64
	}{{"usage chunks", got.usage}, {"content", got.counted}} {
		ok, d := within(rec.OutputTokens, c.received)
		t.Logf("ledger %d completion tokens against %d received by the clients' %s: %+.2f %%",
			rec.OutputTokens, c.received, c.what, d)
		if !ok {
			t.Errorf("the ledger counts %d completion tokens, the clients received %d by their %s (%+.2f %%, want within ±%.0f %%)",
				rec.OutputTokens, c.received, c.what, d, ledgerTolerance*100)
		}
	}
}

// withType is labels with the usage type kind.
func withType(labels map[string]string, kind string) map[string]string {
	l := maps.Clone(labels)
	l["type"] = kind
	return l
}

// within reports whether a is within ledgerTolerance of b (b > 0), and the difference
// in percent.
func within(a, b int64) (bool, float64) {
	if b <= 0 {
		return false, math.Inf(1)
	}
	d := float64(a-b) / float64(b) * 100
	return math.Abs(d) <= ledgerTolerance*100, d
}
