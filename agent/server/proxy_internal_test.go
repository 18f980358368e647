package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/internal/openaierr"
)

func TestRewriteModel(t *testing.T) {
	tests := []struct {
		name, in, served, requested, want string
	}{
		{name: "same name untouched", in: `{"model":"qwen","x":1}`, served: "qwen", requested: "qwen", want: `{"model":"qwen","x":1}`},
		{name: "alias", in: `{"id":"c","model":"qwen","choices":[]}`, served: "qwen", requested: "q", want: `{"id":"c","model":"q","choices":[]}`},
		{
			name: "generated text quoting the field is left alone", served: "qwen", requested: "q",
			in:   `{"choices":[{"delta":{"content":"\"model\":\"qwen\""}}],"model":"qwen"}`,
			want: `{"choices":[{"delta":{"content":"\"model\":\"qwen\""}}],"model":"q"}`,
		},
		{name: "names needing escapes", in: `{"model":"a\"b"}`, served: `a"b`, requested: `c<d`, want: `{"model":"c\u003cd"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(rewriteModel([]byte(tt.in), tt.served, tt.requested)); got != tt.want {
				t.Errorf("rewriteModel = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestEventData(t *testing.T) {
	tests := []struct{ in, want string }{
		{"data: {\"a\":1}\n\n", `{"a":1}`},
		{"data:[DONE]\r\n\r\n", "[DONE]"},
		{"event: x\ndata: a\ndata: b\n\n", "a\nb"},
		{": comment\n\n", ""},
	}
	for _, tt := range tests {
		if got := string(eventData([]byte(tt.in))); got != tt.want {
			t.Errorf("eventData(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestWithUsage(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"model":"m","stream":true}`, `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream_options":null}`, `{"stream_options":{"include_usage":true}}`},
		{`{"stream_options":{"include_usage":false,"x":1}}`, `{"stream_options":{"include_usage":true,"x":1}}`},
	}
	for _, tt := range tests {
		b, err := withUsage([]byte(tt.in))
		if err != nil {
			t.Fatal(err)
		}
		var got, want any
		_ = json.Unmarshal(b, &got)
		_ = json.Unmarshal([]byte(tt.want), &want)
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("withUsage(%s) (-want +got):\n%s", tt.in, d)
		}
	}
	if _, err := withUsage([]byte(`[1]`)); err == nil {
		t.Error("withUsage accepted a non-object body")
	}
}

func TestReadLineLongerThanTheBuffer(t *testing.T) {
	long := strings.Repeat("x", 100)
	br := bufio.NewReaderSize(strings.NewReader(long+"\nshort\ntail"), 16)
	var got []string
	for {
		line, err := readLine(br, maxEventBytes)
		if len(line) > 0 {
			got = append(got, string(line))
		}
		if err != nil {
			break
		}
	}
	if d := cmp.Diff([]string{long + "\n", "short\n", "tail"}, got); d != "" {
		t.Errorf("lines (-want +got):\n%s", d)
	}
}

func TestRecovererAnswers500OnlyBeforeHeaders(t *testing.T) {
	s := &Server{log: logr.Discard()}
	before := s.recoverer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	rec := httptest.NewRecorder()
	before.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/x", nil))
	var body struct {
		Error struct {
			Type, Code string
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	if rec.Code != http.StatusInternalServerError || body.Error.Code != openaierr.CodeInternal || body.Error.Type != openaierr.TypeServer {
		t.Errorf("panic before headers: %d %+v, want 500 %s", rec.Code, body.Error, openaierr.CodeInternal)
	}

	after := s.recoverer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		panic("late")
	}))
	defer func() {
		if v := recover(); v != http.ErrAbortHandler {
			t.Errorf("panic after headers re-panicked with %v, want http.ErrAbortHandler", v)
		}
	}()
	after.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/x", nil))
	t.Error("a panic after the headers did not abort the response")
}

// BenchmarkCopyStream measures the relay of one SSE event (a chat chunk of one token)
// from the runner's body to the client, flushed, with and without an alias rewrite.
func BenchmarkCopyStream(b *testing.B) {
	chunk := []byte(`data: {"id":"chatcmpl-0123456789abcdef01234567","object":"chat.completion.chunk","created":1795220491,"model":"qwen","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	const events = 1000
	body := bytes.Repeat(chunk, events)
	body = append(body, "data: [DONE]\n\n"...)
	for _, requested := range []string{"qwen", "q"} {
		b.Run("model="+requested, func(b *testing.B) {
			s := &Server{log: logr.Discard(), metrics: newRequestMetrics()}
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			b.SetBytes(int64(len(chunk)))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N / events {
				rec := httptest.NewRecorder()
				s.copyStream(rec, req, nil, nil, bytes.NewReader(body),
					proxyRequest{stream: true, served: "qwen", requested: requested, generates: true})
			}
		})
	}
}
