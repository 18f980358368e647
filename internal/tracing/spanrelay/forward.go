package spanrelay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/sdk/resource"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// MaxDrainBytes bounds the answer to one drain that the agent reads: a runner's queue
// holds at most DefaultQueueBytes, so more is a runner misbehaving.
const MaxDrainBytes = 2 * DefaultQueueBytes

// ErrNoRelay is a runner that keeps no spans for the agent (started without
// --trace-relay, e.g. adopted from an agent that did not trace).
var ErrNoRelay = errors.New("the runner does not relay spans (started without --trace-relay)")

// Forwarder exports the spans drained from runners with the agent's own OTLP client
// (its endpoint, headers, certificates, compression, retries). Each span keeps its
// ids, parent, times, attributes and instrumentation scope; the resource is the
// agent's: service.name macfleet-runner with the agent's host and resource
// attributes, whatever the runner claimed, so a runner cannot pass its spans off as
// another service's or another Mac's. Safe for concurrent use.
type Forwarder struct {
	client   otlptrace.Client
	resource *resourcepb.Resource
	schema   string
}

// NewForwarder exports through client (already started) under res.
func NewForwarder(client otlptrace.Client, res *resource.Resource) *Forwarder {
	return &Forwarder{client: client, resource: resourceProto(res), schema: res.SchemaURL()}
}

// Drained is what one Relay did.
type Drained struct {
	// Spans were exported.
	Spans int
	// Dropped is the runner's count of spans it dropped since it started (its queue
	// was full).
	Dropped uint64
}

// Relay drains the runner that c reaches at baseURL and exports what it held.
func (f *Forwarder) Relay(ctx context.Context, c *http.Client, baseURL string) (Drained, error) {
	body, dropped, err := Drain(ctx, c, baseURL)
	if err != nil {
		return Drained{}, err
	}
	n, err := f.Export(ctx, body)
	return Drained{Spans: n, Dropped: dropped}, err
}

// Drain takes a runner's queued spans (POST Path): an encoded
// ExportTraceServiceRequest and the runner's dropped count. ErrNoRelay when the runner
// keeps none.
func Drain(ctx context.Context, c *http.Client, baseURL string) (body []byte, dropped uint64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+Path, nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("draining the runner's spans: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, 0, ErrNoRelay
	}
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("draining the runner's spans: status %d", resp.StatusCode)
	}
	body, err = io.ReadAll(io.LimitReader(resp.Body, MaxDrainBytes+1))
	if err != nil {
		return nil, 0, fmt.Errorf("draining the runner's spans: %w", err)
	}
	if len(body) > MaxDrainBytes {
		return nil, 0, fmt.Errorf("draining the runner's spans: the answer is over %d bytes", MaxDrainBytes)
	}
	dropped, _ = strconv.ParseUint(resp.Header.Get(DroppedHeader), 10, 64)
	return body, dropped, nil
}

// Export decodes body (an encoded ExportTraceServiceRequest) and uploads its spans
// under the forwarder's resource; it returns how many spans it uploaded.
func (f *Forwarder) Export(ctx context.Context, body []byte) (int, error) {
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		return 0, fmt.Errorf("decoding the runner's spans: %w", err)
	}
	rs := &tracepb.ResourceSpans{Resource: f.resource, SchemaUrl: f.schema}
	for _, r := range req.GetResourceSpans() {
		rs.ScopeSpans = append(rs.ScopeSpans, r.GetScopeSpans()...)
	}
	n := countSpans([]*tracepb.ResourceSpans{rs})
	if n == 0 {
		return 0, nil
	}
	if err := f.client.UploadTraces(ctx, []*tracepb.ResourceSpans{rs}); err != nil {
		return 0, fmt.Errorf("exporting the runner's spans: %w", err)
	}
	return n, nil
}

// resourceProto is res in OTLP's form.
func resourceProto(res *resource.Resource) *resourcepb.Resource {
	out := &resourcepb.Resource{}
	for _, kv := range res.Attributes() {
		out.Attributes = append(out.Attributes, &commonpb.KeyValue{Key: string(kv.Key), Value: anyValue(kv.Value)})
	}
	return out
}

func anyValue(v attribute.Value) *commonpb.AnyValue {
	switch v.Type() {
	case attribute.BOOL:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v.AsBool()}}
	case attribute.INT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v.AsInt64()}}
	case attribute.FLOAT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: v.AsFloat64()}}
	case attribute.BOOLSLICE, attribute.INT64SLICE, attribute.FLOAT64SLICE, attribute.STRINGSLICE:
		var vals []*commonpb.AnyValue
		switch v.Type() {
		case attribute.BOOLSLICE:
			for _, b := range v.AsBoolSlice() {
				vals = append(vals, anyValue(attribute.BoolValue(b)))
			}
		case attribute.INT64SLICE:
			for _, i := range v.AsInt64Slice() {
				vals = append(vals, anyValue(attribute.Int64Value(i)))
			}
		case attribute.FLOAT64SLICE:
			for _, x := range v.AsFloat64Slice() {
				vals = append(vals, anyValue(attribute.Float64Value(x)))
			}
		default:
			for _, s := range v.AsStringSlice() {
				vals = append(vals, anyValue(attribute.StringValue(s)))
			}
		}
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: vals}}}
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.Emit()}}
}
