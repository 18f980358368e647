package e2e

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/tracing/spanrelay"
)

// stageLink is one stage span's split attributes (docs/split-model.md#metrics-and-traces).
type stageLink struct {
	sent, received, roundTrips int64
	wait, compute, head        float64
	seen                       bool
}

// drainStages drains the runner's spans until the trace's runner.prefill and
// runner.decode are there, and returns their split attributes.
func drainStages(t *testing.T, r *runner, traceID string) (prefill, decode stageLink) {
	t.Helper()
	st := drainTraces(t, r, traceID)[traceID]
	return st[0], st[1]
}

// drainTraces drains the runner's spans until every trace's runner.prefill and
// runner.decode are there, and returns their split attributes by trace.
func drainTraces(t *testing.T, r *runner, traceIDs ...string) map[string][2]stageLink {
	t.Helper()
	out := map[string][2]stageLink{}
	complete := func() bool {
		for _, id := range traceIDs {
			if st := out[id]; !st[0].seen || !st[1].seen {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(30 * time.Second)
	for !complete() {
		if time.Now().After(deadline) {
			t.Fatalf("the runner's spans lack a runner.prefill or runner.decode of traces %v after 30s: %+v", traceIDs, out)
		}
		body, _, err := spanrelay.Drain(context.Background(), r.client, r.base)
		if err != nil {
			t.Fatal(err)
		}
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			t.Fatalf("the drained spans do not decode: %v", err)
		}
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					id := hex.EncodeToString(s.GetTraceId())
					st := out[id]
					switch s.GetName() {
					case "runner.prefill":
						st[0] = stageOf(s)
					case "runner.decode":
						st[1] = stageOf(s)
					}
					out[id] = st
				}
			}
		}
		if !complete() {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return out
}

// stageOf reads a stage span's split attributes.
func stageOf(s *tracepb.Span) stageLink {
	st := stageLink{seen: true}
	ints := map[string]*int64{"macfleet.split.sent_bytes": &st.sent, "macfleet.split.received_bytes": &st.received,
		"macfleet.split.round_trips": &st.roundTrips}
	floats := map[string]*float64{"macfleet.split.link_wait_seconds": &st.wait,
		"macfleet.split.worker_compute_seconds": &st.compute, "macfleet.split.head_compute_seconds": &st.head}
	for _, kv := range s.GetAttributes() {
		if p := ints[kv.GetKey()]; p != nil {
			*p = kv.GetValue().GetIntValue()
		}
		if p := floats[kv.GetKey()]; p != nil {
			*p = kv.GetValue().GetDoubleValue()
		}
	}
	return st
}

// TestSplitModelMetersItsLinks: a split runner's /status counts the link's traffic and
// its own compute time, and a traced request's prefill and decode spans carry what
// their steps cost on the link; with one request at a time the spans add up to what
// /status counted during it, and decoding takes a round trip per generated token.
func TestSplitModelMetersItsLinks(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	w := startWorker(t, m)
	r := startReady(t, m, append(splitFlags([]*worker{w}, 3), "--trace-relay")...)
	before := r.status()
	if len(before.Split) != 1 {
		t.Fatalf("status lists %d split workers, want 1", len(before.Split))
	}

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	req, err := http.NewRequest(http.MethodPost, r.base+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"Tell me a story about the sea."}],"temperature":0,"max_tokens":24}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	var c runnerapi.ChatCompletion
	if err != nil || resp.StatusCode != http.StatusOK || json.Unmarshal(b, &c) != nil || c.Usage == nil {
		t.Fatalf("chat: %d %v %s", resp.StatusCode, err, b)
	}
	tokens := int64(c.Usage.CompletionTokens)
	if tokens < 8 {
		t.Fatalf("the chat generated %d tokens, want at least 8 to measure", tokens)
	}
	after := r.status()
	prefill, decode := drainStages(t, r, traceID)
	t.Logf("%d tokens; prefill %+v; decode %+v; status before %+v after %+v head %.4fs",
		tokens, prefill, decode, before.Split[0], after.Split[0], after.SplitHeadComputeSeconds)

	for name, st := range map[string]stageLink{"prefill": prefill, "decode": decode} {
		if st.sent <= 0 || st.received <= 0 || st.roundTrips <= 0 || st.compute <= 0 || st.wait < st.compute || st.head <= 0 {
			t.Errorf("runner.%s's split attributes %+v: want traffic, round trips, worker compute within link wait, head compute", name, st)
		}
	}
	// The prefill step sampled the first token; every later one took a decode step,
	// each one round trip at least on the one link.
	if decode.roundTrips < tokens-1 {
		t.Errorf("runner.decode counts %d round trips for %d generated tokens", decode.roundTrips, tokens)
	}
	// Nothing else ran: the spans add up to the counters' growth.
	d0, d1 := before.Split[0], after.Split[0]
	if got, want := prefill.sent+decode.sent, int64(d1.BytesSent-d0.BytesSent); got != want {
		t.Errorf("the spans count %d bytes sent, /status %d", got, want)
	}
	if got, want := prefill.received+decode.received, int64(d1.BytesReceived-d0.BytesReceived); got != want {
		t.Errorf("the spans count %d bytes received, /status %d", got, want)
	}
	if got, want := prefill.roundTrips+decode.roundTrips, int64(d1.RoundTrips-d0.RoundTrips); got != want {
		t.Errorf("the spans count %d round trips, /status %d", got, want)
	}
	if got, want := prefill.wait+decode.wait, d1.LinkWaitSeconds-d0.LinkWaitSeconds; math.Abs(got-want) > 1e-6 {
		t.Errorf("the spans count %.6fs of link wait, /status %.6fs", got, want)
	}
	if got, want := prefill.compute+decode.compute, d1.WorkerComputeSeconds-d0.WorkerComputeSeconds; math.Abs(got-want) > 1e-6 {
		t.Errorf("the spans count %.6fs of worker compute, /status %.6fs", got, want)
	}
	if got, want := prefill.head+decode.head, after.SplitHeadComputeSeconds-before.SplitHeadComputeSeconds; math.Abs(got-want) > 1e-6 {
		t.Errorf("the spans count %.6fs of head compute, /status %.6fs", got, want)
	}
}
