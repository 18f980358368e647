//go:build cgo && !race

package server

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/internal/tracing"
)

// The runner's spans (docs/tracing.md): a server span per generation request
// continuing the agent's traceparent, and below it runner.prompt_cache (the lookup),
// runner.queue (waiting for a slot), runner.prefill (with runner.prompt_cache.restore
// when a cached state was restored) and runner.decode. The engine goroutine only
// stamps times on the job (and, on a split runner, adds each step's link figures,
// split_meter.go); the spans are made by the handler once the job is over, so tracing
// costs the decode loop nothing.

const tracerName = "github.com/macfleet/macfleet/runner/server"

// traced wraps a generation handler in a server span; h itself when tracing is off.
func (g *generator) traced(h http.HandlerFunc) http.HandlerFunc {
	if g.tracer == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		r, span := tracing.StartServer(g.tracer, r, "runner")
		sw := &openaierr.StatusWriter{ResponseWriter: w}
		h(sw, r)
		span.SetAttributes(attribute.Int("http.response.status_code", sw.Status))
		if sw.Status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.Status))
		}
		span.End()
	}
}

// lookupSpan is the prompt cache lookup of one request.
type lookupSpan struct {
	start, end time.Time
	restore    *restoreState
}

// traceJob records the stages of a finished job as children of ctx's span.
func (g *generator) traceJob(ctx context.Context, lookup lookupSpan, j *job) {
	if g.tracer == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return
	}
	if g.cache.on() && !lookup.start.IsZero() { // a spent answer looked nothing up
		attrs := []attribute.KeyValue{attribute.Bool("macfleet.prompt_cache.hit", lookup.restore != nil)}
		if r := lookup.restore; r != nil {
			attrs = append(attrs, attribute.Int("macfleet.prompt_cache.tokens", r.n), attribute.String("macfleet.prompt_cache.tier", string(r.tier)))
		}
		g.span(ctx, "runner.prompt_cache", lookup.start, lookup.end, attrs...)
	}
	j.mu.Lock()
	t, first, cached, generated, err := j.times, j.firstAt, j.cached, j.generated, j.err
	accepted, rejected := j.accepted, j.rejected
	var link *jobLink
	if j.link != nil {
		l := *j.link
		link = &l
	}
	j.mu.Unlock()
	now := time.Now()
	if t.ended.IsZero() {
		t.ended = now // the client went away first
	}
	if t.admitted.IsZero() {
		g.span(ctx, "runner.queue", t.submitted, t.ended, attribute.Bool("macfleet.admitted", false))
		return
	}
	g.span(ctx, "runner.queue", t.submitted, t.admitted)
	prefillEnd := first
	if prefillEnd.IsZero() {
		prefillEnd = t.ended
	}
	pctx := g.span(ctx, "runner.prefill", t.admitted, prefillEnd, append(linkAttrs(link, false),
		attribute.Int("macfleet.prompt_tokens", len(j.tokens)), attribute.Int("macfleet.cached_tokens", cached))...)
	if t.restoreTook > 0 {
		g.span(pctx, "runner.prompt_cache.restore", t.admitted, t.admitted.Add(t.restoreTook),
			attribute.Int("macfleet.prompt_cache.restored_tokens", t.restored))
	}
	if !first.IsZero() {
		dctx := g.span(ctx, "runner.decode", first, t.ended, append(linkAttrs(link, true),
			attribute.Int("macfleet.completion_tokens", generated),
			attribute.Int("macfleet.speculation.accepted_tokens", accepted),
			attribute.Int("macfleet.speculation.rejected_tokens", rejected))...)
		if err != nil {
			trace.SpanFromContext(dctx).SetStatus(codes.Error, err.Message)
		}
	}
}

// span records one finished span from start to end and returns its context.
func (g *generator) span(ctx context.Context, name string, start, end time.Time, attrs ...attribute.KeyValue) context.Context {
	ctx, sp := g.tracer.Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	sp.End(trace.WithTimestamp(end))
	return ctx
}
