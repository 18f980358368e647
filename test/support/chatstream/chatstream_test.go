package chatstream

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// serve answers every request with body, as a server streaming events would.
func serve(t *testing.T, status int, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" || r.Method != http.MethodPost {
			http.Error(w, "wrong path", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

const (
	textA  = `data: {"choices":[{"delta":{"content":"Hel"}}]}` + "\n\n"
	textB  = `data: {"choices":[{"delta":{"content":"lo"},"finish_reason":"length"}]}` + "\n\n"
	usage  = `data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}` + "\n\n"
	done   = "data: [DONE]\n\n"
	errEvt = `data: {"error":{"message":"the model is gone"}}` + "\n\n"
)

func TestDo(t *testing.T) {
	for _, tc := range []struct {
		name    string
		status  int
		body    string
		wantErr string
	}{
		{"complete", 200, textA + textB + usage + done, ""},
		{"broken off after text", 200, textA + textB, "ended without [DONE]"},
		{"error event", 200, textA + errEvt, "error event: the model is gone"},
		{"no usage", 200, textA + textB + done, "reported no usage"},
		{"no finish reason", 200, textA + usage + done, "finish reason"},
		{"bad event", 200, "data: {nope\n\n", "bad event"},
		{"status", 503, `{"error":{"message":"busy"}}`, "503"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := serve(t, tc.status, tc.body)
			var pieces []int
			r, err := Do(context.Background(), http.DefaultClient, base, "srv",
				Request{Model: "m", Prompt: "hi", MaxTokens: 2}, func(n int) { pieces = append(pieces, n) })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.HasPrefix(err.Error(), "srv: ") {
					t.Fatalf("error %v, want one from srv containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Text != "Hello" || r.PromptTokens != 7 || r.CompletionTokens != 2 || r.FinishReason != "length" ||
				len(r.Pieces) != 2 || r.TTFT != r.Pieces[0] || r.Finish != r.Pieces[1] || !slices.Equal(pieces, []int{1, 2}) {
				t.Errorf("result %+v, onPiece calls %v", r, pieces)
			}
		})
	}
}

func TestDecodeRateAndGaps(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		r    Result
		rate float64
		gaps []time.Duration
	}{
		{Result{TTFT: 100 * ms, Finish: 1100 * ms, CompletionTokens: 11, Pieces: []time.Duration{100 * ms, 150 * ms, 400 * ms}}, 10,
			[]time.Duration{50 * ms, 250 * ms}},
		{Result{TTFT: 100 * ms, Finish: 100 * ms, CompletionTokens: 5}, 0, nil},
		{Result{TTFT: 100 * ms, Finish: 200 * ms, CompletionTokens: 1, Pieces: []time.Duration{100 * ms}}, 0, nil},
	} {
		if got := tc.r.DecodeRate(); got != tc.rate {
			t.Errorf("DecodeRate of %+v = %v, want %v", tc.r, got, tc.rate)
		}
		if got := tc.r.Gaps(); !slices.Equal(got, tc.gaps) {
			t.Errorf("Gaps of %v = %v, want %v", tc.r.Pieces, got, tc.gaps)
		}
	}
}
