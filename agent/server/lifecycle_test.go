package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// TestConcurrentStreamsShareOneRunner: four streams on a model with four slots are
// served together by one runner process, each holding its lease until its last byte.
func TestConcurrentStreamsShareOneRunner(t *testing.T) {
	a := startAgent(t, agentOptions{specs: []enginepool.ModelSpec{
		tinySpec(t, config.Model{Name: "tiny", Settings: engine.Settings{ContextLength: 2048, Parallel: 4}})}})
	ctx := testContext(t)
	const streams, maxTokens = 4, 200

	opened := make([]*sseStream, streams)
	for i := range opened {
		body := chatBody("tiny", maxTokens, true)
		body["stream_options"] = map[string]any{"include_usage": true}
		opened[i] = a.openStream(ctx, true, "/v1/chat/completions", body)
		if _, err := opened[i].next(); err != nil {
			t.Fatal(err)
		}
	}
	// Every handler is stuck writing its second event, holding its lease.
	m := a.model("tiny")
	if s := a.status(); m.Leases != streams || m.ActiveRequests != streams || s.Runners != 1 {
		t.Errorf("with %d streams open: leases %d, active %d, runners %d; want %d, %d, 1",
			streams, m.Leases, m.ActiveRequests, s.Runners, streams, streams)
	}
	if st := a.runnerStatus("tiny"); st.SlotsTotal != streams {
		t.Errorf("runner has %d slots, want %d", st.SlotsTotal, streams)
	}

	a.release()
	var g goGroup
	for i, s := range opened {
		g.Go(func() error {
			// Complete: it ends with [DONE] after a usage chunk counting every token
			// (how many SSE events carry them depends on how the text splits).
			events := s.all()
			if len(events) < 2 || events[len(events)-1] != "[DONE]" {
				return fmt.Errorf("stream %d: %d events ending %q; want [DONE] last", i, len(events), events[len(events)-1])
			}
			var last struct {
				Usage *struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal([]byte(events[len(events)-2]), &last); err != nil || last.Usage == nil ||
				last.Usage.CompletionTokens != maxTokens {
				return fmt.Errorf("stream %d: last chunk %q; want usage with %d completion tokens", i, events[len(events)-2], maxTokens)
			}
			return nil
		})
	}
	g.Wait(t)
	eventually(t, 10*time.Second, "leases to reach zero", func() bool { return a.model("tiny").Leases == 0 })
	a.expectMetric(streams*maxTokens, "macfleet_agent_generated_tokens_total", "model", "tiny")
}

// TestClientDisconnectFreesTheSlot: a client that goes away mid-generation cancels it,
// streamed or not; the runner frees the slot long before the generation could have
// ended.
func TestClientDisconnectFreesTheSlot(t *testing.T) {
	a := startAgent(t, agentOptions{specs: []enginepool.ModelSpec{
		tinySpec(t, config.Model{Name: "tiny", Settings: engine.Settings{ContextLength: 32768, Parallel: 1}})}})
	// 30,000 tokens take this model minutes; the slot must be free within seconds.
	const maxTokens = 30000
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			ctx, cancel := context.WithCancel(testContext(t))
			defer cancel()
			if stream {
				s := a.openStream(ctx, false, "/v1/chat/completions", chatBody("tiny", maxTokens, true))
				if _, err := s.next(); err != nil {
					t.Fatal(err)
				}
			} else {
				b, _ := json.Marshal(chatBody("tiny", maxTokens, false))
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, a.url+"/v1/chat/completions", bytes.NewReader(b))
				errc := make(chan error, 1)
				go func() {
					resp, err := http.DefaultClient.Do(req)
					if err == nil {
						resp.Body.Close()
						err = fmt.Errorf("the request finished: %s", resp.Status)
					}
					errc <- err
				}()
				t.Cleanup(func() { <-errc })
				eventually(t, 60*time.Second, "the runner to start generating", func() bool {
					return a.model("tiny").Leases == 1 && runnerSlotsBusy(a, "tiny") == 1
				})
			}
			if st := a.runnerStatus("tiny"); st.SlotsBusy != 1 {
				t.Fatalf("runner slots busy = %d while generating, want 1", st.SlotsBusy)
			}
			cancel()
			eventually(t, 15*time.Second, "the runner to free the slot", func() bool {
				st := a.runnerStatus("tiny")
				return st.SlotsBusy == 0 && st.RequestsActive == 0
			})
			eventually(t, 5*time.Second, "the lease to be released", func() bool { return a.model("tiny").Leases == 0 })
		})
	}
	a.expectMetric(1, "macfleet_agent_requests_total", "model", "tiny", "code", "499")
}

// runnerSlotsBusy asks the model's runner for its busy slots without taking a lease.
func runnerSlotsBusy(a *testAgent, model string) int {
	st, ok := statusByPID(a, a.model(model).PID)
	if !ok {
		return -1
	}
	return st.SlotsBusy
}

// TestDrainingAndLeaseToLastByte: an admin unload of a model with a stream in flight
// answers 202 and drains: new requests get 503 + Retry-After (model_draining) while the
// stream — whose runner may long be done generating — holds its lease until its last
// byte reaches the client. Then the model unloads with a report.
func TestDrainingAndLeaseToLastByte(t *testing.T) {
	a := startAgent(t, agentOptions{pool: enginepool.Config{DrainTimeout: time.Minute}})
	ctx := testContext(t)
	s := a.openStream(ctx, true, "/v1/chat/completions", chatBody("tiny", 300, true))
	if _, err := s.next(); err != nil {
		t.Fatal(err)
	}

	resp, b := a.do(http.MethodPost, "/api/models/tiny/unload", nil)
	var act server.ModelActionResponse
	if err := json.Unmarshal(b, &act); resp.StatusCode != http.StatusAccepted || err != nil || act.State != enginepool.StateDraining {
		t.Fatalf("unload: %d %s; want 202 Draining", resp.StatusCode, b)
	}
	for _, path := range []string{"/v1/chat/completions", "/v1/embeddings"} {
		body := chatBody("tiny", 4, false)
		if path == "/v1/embeddings" {
			body = map[string]any{"model": "tiny", "input": "x"}
		}
		resp, b = a.do(http.MethodPost, path, body)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("%s while draining: %d (Retry-After %q) %s; want 503 with Retry-After", path, resp.StatusCode,
				resp.Header.Get("Retry-After"), b)
		}
		if e := decodeError(t, b); e.Error.Code != enginepool.CodeModelDraining {
			t.Errorf("%s while draining: code %q, want %s", path, e.Error.Code, enginepool.CodeModelDraining)
		}
	}
	// The runner finishes 300 tokens in well under a second on an idle machine (its slot frees while its
	// answer waits in the socket buffers); the lease stays held because the last byte
	// has not been written.
	eventually(t, 90*time.Second, "the runner to finish generating", func() bool {
		return a.model("tiny").State == enginepool.StateDraining && runnerSlotsFree(a)
	})
	if m := a.model("tiny"); m.State != enginepool.StateDraining || m.Leases != 1 {
		t.Fatalf("before the client read the stream: state %s, leases %d; want Draining with the lease held", m.State, m.Leases)
	}

	a.release()
	events := s.all()
	if events[len(events)-1] != "[DONE]" {
		t.Fatalf("the drained stream ended with %q, want [DONE] (it must not be aborted)", events[len(events)-1])
	}
	var m enginepool.ModelSnapshot
	eventually(t, 30*time.Second, "the model to unload", func() bool {
		m = a.model("tiny")
		return m.State == enginepool.StateUnloaded && m.LastUnload != nil
	})
	r := m.LastUnload
	if r.Reason != enginepool.ReasonAdmin || r.Aborted != 0 || r.ResidentBytes <= 0 || r.FreedBytes < 0 {
		t.Errorf("unload report %+v; want reason admin, nothing aborted, resident bytes measured, freed >= 0", *r)
	}
	a.expectMetric(1, enginepool.MetricUnloads, "reason", "admin", "outcome", string(r.Outcome))
	// The model loads again on the next request.
	if resp, b := a.do(http.MethodPost, "/v1/chat/completions", chatBody("tiny", 4, false)); resp.StatusCode != http.StatusOK {
		t.Errorf("after the unload: %d %s", resp.StatusCode, b)
	}
}

// runnerSlotsFree reports whether the model's runner has finished generating, asking
// the runner itself (a draining model gives no leases).
func runnerSlotsFree(a *testAgent) bool {
	m := a.model("tiny")
	st, ok := statusByPID(a, m.PID)
	return ok && st.SlotsBusy == 0
}

// TestUnloadReportAndLoadEndpoint: admin load, then unload with ?wait=true returns the
// report, which /api/status and the metrics show.
func TestUnloadReportAndLoadEndpoint(t *testing.T) {
	a := startAgent(t, agentOptions{})
	resp, b := a.do(http.MethodPost, "/api/models/tiny-alias/load", nil)
	var act server.ModelActionResponse
	if err := json.Unmarshal(b, &act); resp.StatusCode != http.StatusOK || err != nil || act.State != enginepool.StateReady ||
		act.Model != "tiny" || act.Status == nil || act.Status.PID == 0 {
		t.Fatalf("load: %d %s; want 200 Ready with the model's status", resp.StatusCode, b)
	}
	a.expectMetric(1, enginepool.MetricLoads, "result", "ok")
	pid := act.Status.PID

	resp, b = a.do(http.MethodPost, "/api/models/tiny/unload?wait=true", nil)
	act = server.ModelActionResponse{}
	if err := json.Unmarshal(b, &act); resp.StatusCode != http.StatusOK || err != nil || !act.Unloaded || act.LastUnload == nil {
		t.Fatalf("unload?wait=true: %d %s; want 200 with the report", resp.StatusCode, b)
	}
	r := *act.LastUnload
	if r.Reason != enginepool.ReasonAdmin || r.ResidentBytes <= 0 || r.FreedBytes < 0 || r.Duration <= 0 {
		t.Errorf("report %+v", r)
	}
	if r.Outcome != enginepool.Settled && r.Outcome != enginepool.TimedOut && r.Outcome != enginepool.Indeterminate {
		t.Errorf("outcome %q", r.Outcome)
	}
	if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
		t.Errorf("runner pid %d after the unload: kill(0) = %v, want ESRCH", pid, err)
	}
	m := a.model("tiny")
	if m.State != enginepool.StateUnloaded || m.LastUnload == nil || *m.LastUnload != r {
		t.Errorf("/api/status: state %s, last unload %+v; want Unloaded with %+v", m.State, m.LastUnload, r)
	}
	if s := a.status(); s.FreedBytesTotal != r.FreedBytes || s.CommittedBytes != 0 || s.Unloads != 1 {
		t.Errorf("pool: freed total %d, committed %d, unloads %d; want %d, 0, 1", s.FreedBytesTotal, s.CommittedBytes,
			s.Unloads, r.FreedBytes)
	}
	eventually(t, 5*time.Second, "the unload metrics", func() bool {
		u, _ := a.metric(enginepool.MetricUnloads, "reason", "admin", "outcome", string(r.Outcome))
		f, _ := a.metric(enginepool.MetricUnloadFreed)
		return u == 1 && f == 1
	})

	// Unloading a model that is not loaded is a 200 that unloaded nothing.
	resp, b = a.do(http.MethodPost, "/api/models/tiny/unload", nil)
	act = server.ModelActionResponse{}
	if err := json.Unmarshal(b, &act); resp.StatusCode != http.StatusOK || err != nil || act.Unloaded {
		t.Errorf("second unload: %d %s; want 200, unloaded false", resp.StatusCode, b)
	}
	// Load without waiting: 202, then Ready.
	resp, b = a.do(http.MethodPost, "/api/models/tiny/load?wait=false", nil)
	if resp.StatusCode != http.StatusAccepted {
		t.Errorf("load?wait=false: %d %s, want 202", resp.StatusCode, b)
	}
	eventually(t, 30*time.Second, "the background load", func() bool { return a.model("tiny").State == enginepool.StateReady })
}

// TestEvictionAndBusyModels: admission evicts an idle model to make room (counted in
// the metrics), but never one that a request holds — that request's lease runs from
// routing to its last byte — and the refusal names the busy model.
func TestEvictionAndBusyModels(t *testing.T) {
	a := startAgent(t, agentOptions{pool: enginepool.Config{CeilingBytes: 512 << 20, AgentPID: -1},
		specs: []enginepool.ModelSpec{
			tinySpec(t, config.Model{Name: "a", Memory: 300 << 20, Settings: engine.Settings{ContextLength: 8192}}),
			tinySpec(t, config.Model{Name: "b", Memory: 300 << 20, Settings: engine.Settings{ContextLength: 8192}}),
		}})
	ctx := testContext(t)
	if resp, b := a.do(http.MethodPost, "/v1/chat/completions", chatBody("a", 4, false)); resp.StatusCode != http.StatusOK {
		t.Fatalf("a: %d %s", resp.StatusCode, b)
	}
	if resp, b := a.do(http.MethodPost, "/v1/chat/completions", chatBody("b", 4, false)); resp.StatusCode != http.StatusOK {
		t.Fatalf("b: %d %s", resp.StatusCode, b)
	}
	if m := a.model("a"); m.State != enginepool.StateUnloaded || m.LastUnload == nil || m.LastUnload.Reason != enginepool.ReasonEviction {
		t.Fatalf("a after b loaded: %s %+v; want Unloaded by eviction", m.State, m.LastUnload)
	}
	a.expectMetric(1, enginepool.MetricEvictions)

	// b is busy now: a stream holds it. Loading a must not evict it.
	s := a.openStream(ctx, true, "/v1/chat/completions", chatBody("b", 100, true))
	if _, err := s.next(); err != nil {
		t.Fatal(err)
	}
	resp, b := a.do(http.MethodPost, "/v1/chat/completions", chatBody("a", 4, false))
	if resp.StatusCode != http.StatusInsufficientStorage {
		t.Fatalf("a while b streams: %d %s; want 507", resp.StatusCode, b)
	}
	if e := decodeError(t, b); e.Error.Code != enginepool.CodeInsufficientMemory || !strings.Contains(e.Error.Message, "b (busy)") {
		t.Errorf("refusal %q (%s); want insufficient_memory naming b (busy)", e.Error.Message, e.Error.Code)
	}
	if m := a.model("b"); m.State != enginepool.StateReady || m.Leases != 1 {
		t.Errorf("b: %s with %d leases; want Ready, 1", m.State, m.Leases)
	}
	a.release()
	if events := s.all(); events[len(events)-1] != "[DONE]" {
		t.Errorf("b's stream ended with %q", events[len(events)-1])
	}
	a.expectMetric(1, enginepool.MetricEvictions)
}

// TestRunnerKilledMidStream: SIGKILL of the runner during a stream ends the stream
// with an SSE error event (no hang, no [DONE]); the agent stays up, requests during
// the failure backoff get 503 + Retry-After, and a later request reloads the model.
// A non-streamed request of a runner killed under it gets a 503 body.
func TestRunnerKilledMidStream(t *testing.T) {
	a := startAgent(t, agentOptions{pool: enginepool.Config{BackoffInitial: 300 * time.Millisecond},
		specs: []enginepool.ModelSpec{tinySpec(t, config.Model{Name: "tiny", Settings: engine.Settings{ContextLength: 32768, Parallel: 1}})}})
	ctx := testContext(t)
	s := a.openStream(ctx, false, "/v1/chat/completions", chatBody("tiny", 30000, true))
	if _, err := s.next(); err != nil {
		t.Fatal(err)
	}
	pid := a.model("tiny").PID
	if procIdle(a, pid) {
		t.Fatal("the runner is not generating; the test needs a stream in flight")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	events := s.all()
	last := events[len(events)-1]
	var eb struct {
		Error struct {
			Code, Message, Type string
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(last), &eb); err != nil || eb.Error.Code != enginepool.CodeEngineStopped {
		t.Fatalf("the stream ended with %q; want an error event with code %s", last, enginepool.CodeEngineStopped)
	}
	for _, ev := range events {
		if ev == "[DONE]" {
			t.Error("a killed stream sent [DONE]")
		}
	}

	// Until the backoff passes: 503 + Retry-After; then the next request reloads.
	reloaded := false
	eventually(t, 60*time.Second, "a request to reload the model", func() bool {
		resp, b := a.do(http.MethodPost, "/v1/chat/completions", chatBody("tiny", 4, false))
		switch resp.StatusCode {
		case http.StatusOK:
			reloaded = true
			return true
		case http.StatusServiceUnavailable:
			if resp.Header.Get("Retry-After") == "" {
				t.Fatalf("503 without Retry-After: %s", b)
			}
			return false
		}
		t.Fatalf("after the crash: %d %s; want 503 or 200", resp.StatusCode, b)
		return false
	})
	if !reloaded {
		t.Fatal("not reloaded")
	}
	m := a.model("tiny")
	if m.PID == pid || m.State != enginepool.StateReady {
		t.Errorf("after reload: pid %d (killed %d), state %s", m.PID, pid, m.State)
	}
	if s := a.status(); s.Crashes != 1 {
		t.Errorf("crashes = %d, want 1", s.Crashes)
	}
	a.expectMetric(2, enginepool.MetricLoads, "result", "ok")
	a.expectMetric(1, enginepool.MetricUnloads, "reason", "crash")

	// A non-streamed request whose runner dies gets a 503 body, never a hang.
	type answer struct {
		resp *http.Response
		body []byte
	}
	answers := make(chan answer, 1)
	go func() {
		resp, b := a.do(http.MethodPost, "/v1/chat/completions", chatBody("tiny", 30000, false))
		answers <- answer{resp, b}
	}()
	eventually(t, 60*time.Second, "the runner to start generating", func() bool {
		return a.model("tiny").Leases == 1 && runnerSlotsBusy(a, "tiny") == 1
	})
	if err := syscall.Kill(a.model("tiny").PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ans := <-answers
	if ans.resp.StatusCode != http.StatusServiceUnavailable || ans.resp.Header.Get("Retry-After") == "" {
		t.Fatalf("non-streamed request of a killed runner: %d (Retry-After %q) %s; want 503 with Retry-After",
			ans.resp.StatusCode, ans.resp.Header.Get("Retry-After"), ans.body)
	}
	if e := decodeError(t, ans.body); e.Error.Code != enginepool.CodeEngineStopped {
		t.Errorf("non-streamed request of a killed runner: code %q, want %s", e.Error.Code, enginepool.CodeEngineStopped)
	}
}

// procIdle asks the runner with this pid whether it has no generation in flight.
func procIdle(a *testAgent, pid int) bool {
	a.t.Helper()
	st, ok := statusByPID(a, pid)
	return ok && st.SlotsBusy == 0 && st.RequestsActive == 0
}

// statusByPID reads a runner's own /status, found by pid among the runners the
// factory started.
func statusByPID(a *testAgent, pid int) (enginepool.RunnerStatus, bool) {
	r := a.factory.runner(pid)
	if r == nil {
		return enginepool.RunnerStatus{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := r.Status(ctx)
	return st, err == nil
}

// TestPrefillGuard: a prompt whose prefill would take the host over the hard
// watermark is refused with 413 prefill_memory_exceeded before any byte is streamed,
// with the estimate (from the runner's own tokenization and the model's dimensions)
// and the limit; the same request passes once the ceiling allows it.
func TestPrefillGuard(t *testing.T) {
	a := startAgent(t, agentOptions{noEnforcer: true, pool: enginepool.Config{AgentPID: -1}})
	if resp, b := a.do(http.MethodPost, "/api/models/tiny/load", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("load: %d %s", resp.StatusCode, b)
	}
	// Lower the ceiling under what the runner already uses: any prefill is too much.
	spec := a.model("tiny").Spec
	c := a.pool.SetConfiguredCeiling(16 << 20)

	content := strings.Repeat("tell me more ", 40)
	msgs := []map[string]string{{"role": "user", "content": content}}
	tokens := a.tokenCount("tiny", runnerapi.TokenizeRequest{Messages: []runnerapi.Message{{Role: "user", Content: runnerapi.MessageContent(content)}}})
	for _, stream := range []bool{false, true} {
		body := map[string]any{"model": "tiny", "messages": msgs, "max_tokens": 4, "stream": stream}
		resp, b := a.do(http.MethodPost, "/v1/chat/completions", body)
		if resp.StatusCode != http.StatusRequestEntityTooLarge || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("stream=%v: %d %s %s; want a 413 JSON answer", stream, resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
		e := decodeError(t, b)
		if want := enginepool.PrefillPeak(spec.Dims, tokens); e.Error.Code != enginepool.CodePrefillMemoryExceeded ||
			e.Error.EstimatedBytes != want || e.Error.LimitBytes != c.HardBytes {
			t.Errorf("stream=%v: %s estimated %d limit %d; want %s, %d (%d tokens), %d", stream, e.Error.Code,
				e.Error.EstimatedBytes, e.Error.LimitBytes, enginepool.CodePrefillMemoryExceeded, want, tokens, c.HardBytes)
		}
	}
	// Completions with a token-id prompt are guarded by their own length.
	resp, b := a.do(http.MethodPost, "/v1/completions", map[string]any{"model": "tiny", "prompt": []int{1, 90, 91, 92, 93}})
	if e := decodeError(t, b); resp.StatusCode != http.StatusRequestEntityTooLarge ||
		e.Error.EstimatedBytes != enginepool.PrefillPeak(spec.Dims, 5) {
		t.Errorf("token prompt: %d %s; want 413 estimating 5 tokens", resp.StatusCode, b)
	}
	if m := a.model("tiny"); m.Leases != 0 || m.Requests < 3 {
		t.Errorf("after the refusals: %d leases, %d requests routed; want 0 held, each refusal routed first", m.Leases, m.Requests)
	}

	a.pool.SetConfiguredCeiling(4 << 30)
	resp, b = a.do(http.MethodPost, "/v1/chat/completions", map[string]any{"model": "tiny", "messages": msgs, "max_tokens": 4})
	if resp.StatusCode != http.StatusOK {
		t.Errorf("with room: %d %s", resp.StatusCode, b)
	}
	a.expectMetric(3, "macfleet_agent_requests_total", "model", "tiny", "code", "413")
}

// TestCacheClear reaches every runner and sums what they dropped.
func TestCacheClear(t *testing.T) {
	a := startAgent(t, agentOptions{specs: []enginepool.ModelSpec{
		tinySpec(t, config.Model{Name: "a", Settings: engine.Settings{ContextLength: 4096}}),
		tinySpec(t, config.Model{Name: "b", Settings: engine.Settings{ContextLength: 4096}}),
	}})
	for _, m := range []string{"a", "b"} {
		if resp, b := a.do(http.MethodPost, "/v1/chat/completions", chatBody(m, 4, false)); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", m, resp.StatusCode, b)
		}
	}
	clear := func() server.CacheClearResponse {
		resp, b := a.do(http.MethodPost, "/api/cache/clear", nil)
		var out server.CacheClearResponse
		if err := json.Unmarshal(b, &out); resp.StatusCode != http.StatusOK || err != nil {
			t.Fatalf("cache clear: %d %s", resp.StatusCode, b)
		}
		return out
	}
	first := clear()
	if len(first.Runners) != 2 || first.EntriesCleared != 2 || first.BytesReclaimed < 0 {
		t.Errorf("first clear: %+v; want both runners, one cached prompt each", first)
	}
	for _, r := range first.Runners {
		if r.Error != "" || r.PID == 0 {
			t.Errorf("runner %+v", r)
		}
	}
	if second := clear(); second.EntriesCleared != 0 {
		t.Errorf("second clear dropped %d entries, want 0", second.EntriesCleared)
	}
}
