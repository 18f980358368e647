package spanrelay

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// spans are n ResourceSpans of one span each, named prefix0, prefix1, …
func spans(prefix string, n int) []*tracepb.ResourceSpans {
	var rs []*tracepb.ResourceSpans
	for i := range n {
		rs = append(rs, &tracepb.ResourceSpans{ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{
			{Name: prefix + string(rune('0'+i)), TraceId: bytes.Repeat([]byte{1}, 16), SpanId: []byte{byte(i + 1), 0, 0, 0, 0, 0, 0, 2}},
		}}}})
	}
	return rs
}

// names decodes a drained body and lists its spans' names in order.
func names(t *testing.T, body []byte) []string {
	t.Helper()
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		t.Fatalf("the drained body does not decode: %v", err)
	}
	var out []string
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				out = append(out, s.GetName())
			}
		}
	}
	return out
}

func TestQueue(t *testing.T) {
	one, _ := proto.Marshal(&coltracepb.ExportTraceServiceRequest{ResourceSpans: spans("a", 1)})
	size := len(one) // every upload of one span below has this size
	for _, tc := range []struct {
		name        string
		limit       int
		uploads     [][]*tracepb.ResourceSpans
		want        []string
		wantDropped uint64
	}{
		{"empty", 10 * size, nil, nil, 0},
		{"all fit, in order", 10 * size, [][]*tracepb.ResourceSpans{spans("a", 1), spans("b", 1), spans("c", 1)}, []string{"a0", "b0", "c0"}, 0},
		{"oldest dropped", 2 * size, [][]*tracepb.ResourceSpans{spans("a", 1), spans("b", 1), spans("c", 1)}, []string{"b0", "c0"}, 1},
		{"just under the limit keeps one", 2*size - 1, [][]*tracepb.ResourceSpans{spans("a", 1), spans("b", 1)}, []string{"b0"}, 1},
		{"an upload over the limit is dropped whole", size, [][]*tracepb.ResourceSpans{spans("a", 1), spans("big", 3)}, []string{"a0"}, 3},
		{"one upload of several", 10 * size, [][]*tracepb.ResourceSpans{spans("m", 3)}, []string{"m0", "m1", "m2"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := NewQueue(tc.limit)
			for _, u := range tc.uploads {
				if err := q.UploadTraces(context.Background(), u); err != nil {
					t.Fatal(err)
				}
			}
			body, dropped := q.Drain()
			if got := names(t, body); strings.Join(got, ",") != strings.Join(tc.want, ",") || dropped != tc.wantDropped {
				t.Errorf("Drain = %v, %d dropped; want %v, %d", got, dropped, tc.want, tc.wantDropped)
			}
			if body, _ := q.Drain(); len(body) != 0 {
				t.Errorf("a second Drain = %d bytes; want none", len(body))
			}
		})
	}
}

// TestDrain: the agent's side of a drain against a runner's queue, a runner without
// one, and one whose answer is over the bound.
func TestDrain(t *testing.T) {
	q := NewQueue(0)
	_ = q.UploadTraces(context.Background(), spans("x", 2))
	mux := http.NewServeMux()
	mux.Handle("POST "+Path, q)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	body, dropped, err := Drain(context.Background(), srv.Client(), srv.URL)
	if err != nil || dropped != 0 || strings.Join(names(t, body), ",") != "x0,x1" {
		t.Fatalf("Drain = %v, %d, %v; want x0,x1", names(t, body), dropped, err)
	}

	none := httptest.NewServer(http.NotFoundHandler())
	defer none.Close()
	if _, _, err := Drain(context.Background(), none.Client(), none.URL); !errors.Is(err, ErrNoRelay) {
		t.Errorf("Drain of a runner without a queue: %v; want ErrNoRelay", err)
	}

	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write(make([]byte, MaxDrainBytes+1))
	}))
	defer huge.Close()
	if _, _, err := Drain(context.Background(), huge.Client(), huge.URL); err == nil || !strings.Contains(err.Error(), "over") {
		t.Errorf("Drain of an oversized answer: %v; want an error saying it is over the bound", err)
	}
}
