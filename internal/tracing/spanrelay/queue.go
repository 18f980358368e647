// Package spanrelay carries a sandboxed runner's spans to the tracing collector
// through its agent: the runner, which may connect nowhere, keeps its encoded spans in
// a bounded in-memory Queue that its OTLP exporter writes to; the agent drains the
// queue over the runner's own socket (POST Path) and exports what it got with its own
// exporter settings (Forwarder). Trace and span ids and parent links are the runner's,
// untouched, so runner spans join the gateway's and the agent's in one trace.
//
// docs/tracing.md and docs/security.md ("6. Runner processes") describe the relay.
package spanrelay

import (
	"context"
	"net/http"
	"strconv"
	"sync"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Path is the runner endpoint the agent drains spans from (POST).
const Path = "/spans"

// DroppedHeader carries, on a drain's answer, how many spans the runner has dropped
// since it started because its queue was full.
const DroppedHeader = "X-Macfleet-Spans-Dropped"

// ContentType is the drain answer's: OTLP's protobuf encoding of one
// ExportTraceServiceRequest.
const ContentType = "application/x-protobuf"

// DefaultQueueBytes bounds a runner's queue: about a thousand traced requests' spans,
// many seconds of them at any rate a runner serves, against a drain after each answer
// the agent relays and every few seconds.
const DefaultQueueBytes = 2 << 20

// Queue is a runner's spans waiting for the agent: encoded ExportTraceServiceRequest
// messages, at most limit bytes together; when a new one does not fit, the oldest are
// dropped (and counted). It is the otlptrace.Client of the runner's exporter: an
// upload never leaves the process. Safe for concurrent use.
type Queue struct {
	limit int

	mu      sync.Mutex
	batches []batch
	bytes   int
	dropped uint64
}

type batch struct {
	body  []byte
	spans int
}

// NewQueue returns a queue of at most limit bytes (DefaultQueueBytes when not
// positive).
func NewQueue(limit int) *Queue {
	if limit <= 0 {
		limit = DefaultQueueBytes
	}
	return &Queue{limit: limit}
}

// Start is part of otlptrace.Client: there is no connection to make.
func (q *Queue) Start(context.Context) error { return nil }

// Stop is part of otlptrace.Client: what is queued stays for a last drain.
func (q *Queue) Stop(context.Context) error { return nil }

// UploadTraces is part of otlptrace.Client: it encodes the spans as the collector's
// request and queues them.
func (q *Queue) UploadTraces(_ context.Context, rs []*tracepb.ResourceSpans) error {
	body, err := proto.Marshal(&coltracepb.ExportTraceServiceRequest{ResourceSpans: rs})
	if err != nil {
		return err
	}
	q.push(batch{body: body, spans: countSpans(rs)})
	return nil
}

func countSpans(rs []*tracepb.ResourceSpans) int {
	n := 0
	for _, r := range rs {
		for _, s := range r.GetScopeSpans() {
			n += len(s.GetSpans())
		}
	}
	return n
}

// push queues b, dropping the oldest batches (or b itself, when it alone is over the
// limit) so that the queue stays within its limit.
func (q *Queue) push(b batch) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(b.body) > q.limit {
		q.dropped += uint64(b.spans)
		return
	}
	drop := 0
	for q.bytes+len(b.body) > q.limit {
		old := q.batches[drop]
		q.bytes -= len(old.body)
		q.dropped += uint64(old.spans)
		drop++
	}
	q.batches = append(q.batches[drop:], b)
	q.bytes += len(b.body)
}

// Drain empties the queue: body is one encoded ExportTraceServiceRequest holding every
// queued span (the concatenation of the queued messages, which protobuf decodes as
// their merge: the repeated resource_spans of each, in order), dropped the number of
// spans dropped since the queue was made.
func (q *Queue) Drain() (body []byte, dropped uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	body = make([]byte, 0, q.bytes)
	for _, b := range q.batches {
		body = append(body, b.body...)
	}
	q.batches, q.bytes = nil, 0
	return body, q.dropped
}

// ServeHTTP answers a drain (POST Path on the runner's socket) with Drain's body and
// DroppedHeader.
func (q *Queue) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	body, dropped := q.Drain()
	w.Header().Set("Content-Type", ContentType)
	w.Header().Set(DroppedHeader, strconv.FormatUint(dropped, 10))
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}
