package main

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/internal/tracing"
	"github.com/macfleet/macfleet/internal/tracing/spanrelay"
)

// startTracing builds the component's tracer provider from the OTEL_* environment
// (nil when tracing is off), what exports its runners' spans (the agent's; nil when
// off) and a stop function that exports what is buffered.
func startTracing(ctx context.Context, service string, log logr.Logger) (trace.TracerProvider, *spanrelay.Forwarder, func(), error) {
	p, err := tracing.New(ctx, tracing.Options{Service: service, Log: log})
	if err != nil || p == nil {
		return nil, nil, func() {}, err
	}
	relay, err := p.RunnerRelay(ctx)
	if err != nil {
		return nil, nil, func() {}, err
	}
	log.Info("Tracing requests over OTLP/HTTP (OTEL_* environment)", "service", service)
	return p.TracerProvider(), relay, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.Shutdown(sctx); err != nil {
			log.Error(err, "Exporting the last spans failed")
		}
	}, nil
}
