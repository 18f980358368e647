package keepalive

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestAPIOf(t *testing.T) {
	for _, tc := range []struct {
		path string
		api  API
		ok   bool
	}{
		{"/v1/chat/completions", Chat, true},
		{"/v1/completions", Chat, true},
		{"/v1/responses", Responses, true},
		{"/v1/messages", Messages, true},
		{"/v1/messages/count_tokens", 0, false},
		{"/v1/embeddings", 0, false},
	} {
		api, ok := APIOf(tc.path)
		if api != tc.api || ok != tc.ok {
			t.Errorf("APIOf(%q) = %v, %v; want %v, %v", tc.path, api, ok, tc.api, tc.ok)
		}
	}
}

func TestStreaming(t *testing.T) {
	for raw, want := range map[string]bool{"true": true, " true ": true, "false": false, "": false, `"true"`: false, "1": false} {
		if got := Streaming(json.RawMessage(raw)); got != want {
			t.Errorf("Streaming(%q) = %v, want %v", raw, got, want)
		}
	}
}

// event is one SSE event: its name and its data decoded.
type event struct {
	Name string
	Data map[string]any
}

func parseEvent(t *testing.T, b []byte) event {
	t.Helper()
	s := string(b)
	if !strings.HasSuffix(s, "\n\n") || strings.Count(s, "\n\n") != 1 {
		t.Fatalf("not one SSE event: %q", s)
	}
	var ev event
	for line := range strings.SplitSeq(strings.TrimSuffix(s, "\n\n"), "\n") {
		name, value, _ := strings.Cut(line, ": ")
		switch name {
		case "event":
			ev.Name = value
		case "data":
			if err := json.Unmarshal([]byte(value), &ev.Data); err != nil {
				t.Fatalf("data %q: %v", value, err)
			}
		default:
			t.Fatalf("line %q", line)
		}
	}
	return ev
}

func TestErrorEvent(t *testing.T) {
	openAI := []byte(`{"error":{"message":"no replica of deployment ns/tiny became ready within 2m0s","type":"service_unavailable","param":null,"code":"no_ready_replica"}}` + "\n")
	bad := []byte(`{"error":{"message":"\"temperature\" must be a number","type":"invalid_request_error","param":"temperature","code":"invalid_value"}}`)
	anthropic := []byte(`{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens is required"}}`)
	for _, tc := range []struct {
		name   string
		api    API
		status int
		body   []byte
		want   event
	}{
		{"chat, the gateway's 503", Chat, 503, openAI, event{Data: map[string]any{"error": map[string]any{
			"message": "no replica of deployment ns/tiny became ready within 2m0s", "type": "service_unavailable", "param": nil, "code": "no_ready_replica"}}}},
		{"responses, the gateway's 503", Responses, 503, openAI, event{Name: "error", Data: map[string]any{"type": "error",
			"code": "no_ready_replica", "message": "no replica of deployment ns/tiny became ready within 2m0s", "param": nil, "sequence_number": 0.0}}},
		{"responses, a replica's 400 with its param", Responses, 400, bad, event{Name: "error", Data: map[string]any{"type": "error",
			"code": "invalid_value", "message": `"temperature" must be a number`, "param": "temperature", "sequence_number": 0.0}}},
		{"messages, the gateway's 503 in Anthropic's shape", Messages, 503, openAI, event{Name: "error", Data: map[string]any{"type": "error",
			"error": map[string]any{"type": "overloaded_error", "message": "no replica of deployment ns/tiny became ready within 2m0s"}}}},
		{"messages, a replica's error already in Anthropic's shape", Messages, 400, anthropic, event{Name: "error", Data: map[string]any{"type": "error",
			"error": map[string]any{"type": "invalid_request_error", "message": "max_tokens is required"}}}},
		{"chat, a body that is not JSON", Chat, 502, []byte("bad gateway\nfrom a proxy\n"), event{Data: map[string]any{"error": map[string]any{
			"message": "bad gateway\nfrom a proxy", "type": "server_error", "param": nil, "code": "upstream_error"}}}},
		{"chat, no body", Chat, 500, nil, event{Data: map[string]any{"error": map[string]any{
			"message": "the answer ended with status 500 and no body", "type": "server_error", "param": nil, "code": "upstream_error"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parseEvent(t, tc.api.ErrorEvent(tc.status, tc.body))
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("ErrorEvent (-want +got):\n%s", d)
			}
		})
	}
}

func TestEvent(t *testing.T) {
	if got := string(Chat.Event()); got != ": keep-alive\n\n" {
		t.Errorf("Chat: %q", got)
	}
	if got := string(Responses.Event()); got != ": keep-alive\n\n" {
		t.Errorf("Responses: %q", got)
	}
	if ev := parseEvent(t, Messages.Event()); ev.Name != "ping" || ev.Data["type"] != "ping" {
		t.Errorf("Messages: %+v", ev)
	}
}

// TestTick: the keep-alive decision of one tick from what was written before it.
func TestTick(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   state
		// writes happen before the tick.
		writes []string
		want   action
		// committed: the state after the tick.
		committed bool
	}{
		{name: "nothing written yet: commit", want: commitAndSend, committed: true},
		{name: "committed and silent", st: state{committed: true}, want: send, committed: true},
		{name: "committed, the stream wrote since the last tick", st: state{committed: true, status: 200}, writes: []string{"data: {}\n\n"}, want: nothing, committed: true},
		{name: "the handler's own stream, silent between events", st: state{status: 200, stream: true}, want: send},
		{name: "the handler's own stream, silent inside an event", st: state{status: 200, stream: true, midEvent: true}, want: nothing},
		{name: "an event ended by a lone line break", st: state{status: 200, stream: true, midEvent: true, lastNL: true}, writes: []string{"\n"}, want: nothing},
		{name: "the handler's own answer that is not a stream", st: state{status: 503}, want: nothing},
		{name: "holding an error", st: state{committed: true, status: 503, holding: true}, want: nothing, committed: true},
		{name: "closed", st: state{off: true}, want: nothing},
		{name: "the tick after a keep-alive", st: state{committed: true, active: true}, want: nothing, committed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.st
			for _, w := range tc.writes {
				st.wrote([]byte(w))
			}
			if got := st.tick(); got != tc.want || st.committed != tc.committed {
				t.Errorf("tick = %v (committed %v), want %v (committed %v)", got, st.committed, tc.want, tc.committed)
			}
		})
	}
}

// TestWrote: where the written bytes end, event by event or split anywhere.
func TestWrote(t *testing.T) {
	for _, tc := range []struct {
		writes []string
		mid    bool
	}{
		{[]string{"data: a\n\n"}, false},
		{[]string{"data: a\n", "\n"}, false},
		{[]string{"data: a", "\n", "\n"}, false},
		{[]string{"data: a\n"}, true},
		{[]string{"data: a\n\ndata: b"}, true},
		{[]string{"data: a\n\n", "\n"}, false}, // a blank line more: still between events
	} {
		var st state
		for _, w := range tc.writes {
			st.wrote([]byte(w))
		}
		if st.midEvent != tc.mid {
			t.Errorf("%q: midEvent %v, want %v", tc.writes, st.midEvent, tc.mid)
		}
	}
}

// waitKeepAlives polls w until it sent n keep-alives.
func waitKeepAlives(t *testing.T, w *Writer, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for w.KeepAlives() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d keep-alives sent, waited for %d", w.KeepAlives(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWriterCommitsThenTurnsAnErrorIntoAnEvent: a request held past the interval gets
// a 200 stream with keep-alives; the 503 it is answered afterwards arrives as the
// stream's error event, on the Messages API in that API's shape.
func TestWriterCommitsThenTurnsAnErrorIntoAnEvent(t *testing.T) {
	rec := httptest.NewRecorder()
	w := New(rec, Messages, 20*time.Millisecond)
	waitKeepAlives(t, w, 2)
	if !w.Committed() {
		t.Fatal("keep-alives went out before the status was committed")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Retry-After", "5")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write([]byte(`{"error":{"message":"no replica","type":"service_unavailable","param":null,"code":"no_ready_replica"}}`))
	w.Close()
	n := w.KeepAlives()
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, Content-Type %q; want 200 text/event-stream", rec.Code, rec.Header().Get("Content-Type"))
	}
	rest, ok := strings.CutPrefix(rec.Body.String(), strings.Repeat(string(Messages.Event()), n))
	if !ok {
		t.Fatalf("body %q does not start with %d pings", rec.Body.String(), n)
	}
	want := event{Name: "error", Data: map[string]any{"type": "error", "error": map[string]any{"type": "overloaded_error", "message": "no replica"}}}
	if d := cmp.Diff(want, parseEvent(t, []byte(rest))); d != "" {
		t.Errorf("the last event (-want +got):\n%s", d)
	}
}

// TestWriterPassesAStreamThrough: the handler's stream after the keep-alives goes on
// the committed response as it came, and nothing is written after Close.
func TestWriterPassesAStreamThrough(t *testing.T) {
	rec := httptest.NewRecorder()
	w := New(rec, Chat, 20*time.Millisecond)
	waitKeepAlives(t, w, 1)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Request-Id", "r1")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("data: {\"choices\":[]}\n\n"))
	_, _ = w.Write([]byte("data: [DONE]\n\n"))
	w.Close()
	n := w.KeepAlives()
	body := rec.Body.String()
	rest, ok := strings.CutPrefix(body, strings.Repeat(": keep-alive\n\n", n))
	if !ok || !strings.HasPrefix(rest, "data: {\"choices\":[]}\n\n") || !strings.HasSuffix(rest, "data: [DONE]\n\n") {
		t.Errorf("body %q", body)
	}
	if strings.Contains(rest, "data: [DONE]\n\n:") {
		t.Errorf("a keep-alive after the end: %q", body)
	}
}

// TestWriterUntouchedWhenAnsweredInTime: an answer before the interval passes is the
// handler's alone, status and headers included.
func TestWriterUntouchedWhenAnsweredInTime(t *testing.T) {
	rec := httptest.NewRecorder()
	w := New(rec, Responses, time.Hour)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write([]byte(`{"error":{}}`))
	w.Close()
	if rec.Code != http.StatusBadRequest || rec.Body.String() != `{"error":{}}` || w.KeepAlives() != 0 {
		t.Errorf("%d %q, %d keep-alives", rec.Code, rec.Body.String(), w.KeepAlives())
	}
}

// TestWriterKeepsAPrefillAlive: a stream the handler committed itself (the replica's
// headers came, its first token not yet) gets keep-alives between events, never
// inside one.
func TestWriterKeepsAPrefillAlive(t *testing.T) {
	rec := httptest.NewRecorder()
	w := New(rec, Chat, 20*time.Millisecond)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	waitKeepAlives(t, w, 1)
	_, _ = w.Write([]byte("data: {\"a\":"))
	before := w.KeepAlives()
	// Five checks inside an event: none may send a keep-alive.
	ticks := w.checks()
	for deadline := time.Now().Add(10 * time.Second); w.checks() < ticks+5; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the keep-alive loop stopped checking")
		}
	}
	if n := w.KeepAlives(); n != before {
		t.Fatalf("%d keep-alives sent inside an event", n-before)
	}
	_, _ = w.Write([]byte("1}\n\n"))
	waitKeepAlives(t, w, before+1)
	w.Close()
	if !bytes.Contains(rec.Body.Bytes(), []byte("data: {\"a\":1}\n\n: keep-alive\n\n")) {
		t.Errorf("body %q", rec.Body.String())
	}
}

// checks is how many times the keep-alive loop looked at the stream.
func (k *Writer) checks() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.ticks
}

// TestWriterTrailers: trailers the handler sets after its status (http.TrailerPrefix)
// reach the response, whether a keep-alive committed it or the handler did.
func TestWriterTrailers(t *testing.T) {
	for _, held := range []bool{false, true} {
		srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			w := New(rw, Chat, 20*time.Millisecond)
			defer w.Close()
			if held {
				waitKeepAlives(t, w, 1)
			}
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("data: [DONE]\n\n"))
			w.Flush() // as the gateway's relay does: a stream is chunked, so it can have trailers
			w.Header().Set(http.TrailerPrefix+"Macfleet-Continued", "1")
		}))
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if got := resp.Trailer.Get("Macfleet-Continued"); got != "1" || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
			t.Errorf("held %v: trailer %q, body %q", held, got, b)
		}
	}
}
