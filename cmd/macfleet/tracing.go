package main

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/tracing"
)

// startTracing builds the component's tracer provider from the OTEL_* environment
// (nil when tracing is off) and a stop function that exports what is buffered.
func startTracing(ctx context.Context, service string, log logr.Logger) (trace.TracerProvider, func(), error) {
	p, err := tracing.New(ctx, tracing.Options{Service: service, Log: log})
	if err != nil || p == nil {
		return nil, func() {}, err
	}
	log.Info("Tracing requests over OTLP/HTTP (OTEL_* environment)", "service", service)
	return p.TracerProvider(), func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.Shutdown(sctx); err != nil {
			log.Error(err, "Exporting the last spans failed")
		}
	}, nil
}
