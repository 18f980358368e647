package soak

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeGateway answers each request by the model it names; attempts counts them, and
// total counts those of every fake gateway of a test.
type fakeGateway struct {
	attempts atomic.Int32
	total    *atomic.Int32
}

const (
	usageChunk = `data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}` + "\n\n"
	textChunk  = `data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n"
	completion = `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`
)

func (g *fakeGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.attempts.Add(1)
	n := g.total.Add(1)
	buf := make([]byte, 4096)
	k, _ := r.Body.Read(buf)
	req := string(buf[:k])
	stream := strings.Contains(req, `"stream":true`)
	switch {
	case strings.Contains(req, `"model":"bad-gateway"`):
		http.Error(w, `{"error":{"message":"upstream failed","type":"server_error"}}`, http.StatusBadGateway)
	case strings.Contains(req, `"model":"busy-once"`) && n == 1:
		w.Header().Set("Retry-After", "0")
		http.Error(w, `{"error":{"message":"busy","type":"server_error"}}`, http.StatusServiceUnavailable)
	case strings.Contains(req, `"model":"breaks"`):
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte(textChunk))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection breaks mid-stream
	case stream:
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte(textChunk + usageChunk + "data: [DONE]\n\n"))
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(completion))
	}
}

// The traffic's accounting against a fake gateway: a 502 is not retried by the
// client and is a lost request, a 503 is retried, a stream cut after its first
// chunk is broken mid-stream, and the attempts alternate between the gateways.
func TestTrafficAccounting(t *testing.T) {
	for _, tc := range []struct {
		name  string
		model string
		kind  string
		want  Counts
	}{
		{"answered", "ok", Chat, Counts{Sent: 1, Succeeded: 1}},
		{"streamed", "ok", ChatStream, Counts{Sent: 1, Succeeded: 1}},
		{"502 is lost", "bad-gateway", Chat, Counts{Sent: 1, FailedBeforeFirstByte: 1}},
		{"503 is retried", "busy-once", ChatStream, Counts{Sent: 1, Succeeded: 1, Retries: 1}},
		{"broken mid-stream", "breaks", ChatStream, Counts{Sent: 1, BrokenMidStream: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var total atomic.Int32
			g1, g2 := &fakeGateway{total: &total}, &fakeGateway{total: &total}
			s1, s2 := httptest.NewServer(g1), httptest.NewServer(g2)
			defer s1.Close()
			defer s2.Close()
			tr := &Traffic{Gateways: []string{s1.URL, s2.URL}, ChatModel: tc.model, RequestTimeout: 10 * time.Second, MaxRetries: 3}
			tr.start = time.Now()
			tr.do(context.Background(), tr.client(), tc.kind)
			kinds, _ := tr.Stats.Kinds()
			if diff := cmp.Diff(tc.want, kinds[tc.kind]); diff != "" {
				t.Errorf("counts (-want +got):\n%s\nerrors: %q", diff, tr.Stats.Errors())
			}
			if tc.want.Retries > 0 && (g1.attempts.Load() == 0 || g2.attempts.Load() == 0) {
				t.Errorf("attempts %d and %d: the retry did not go to the other gateway", g1.attempts.Load(), g2.attempts.Load())
			}
		})
	}
}
