package runnerproc

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/macfleet/macfleet/internal/tracing/spanrelay"
)

// A tracing runner connects nowhere: it keeps its spans in memory (--trace-relay) and
// the agent drains them over the runner's socket and exports them itself
// (ProcessConfig.SpanRelay): once each answer of a generation request has been read
// (the runner queues a request's spans before its answer ends), every
// spanRelayPeriod for callers that bypass the agent, and once more before stopping
// the runner.
const (
	spanRelayPeriod = 5 * time.Second
	// spanDrainTimeout bounds taking the spans from the runner (a local call);
	// spanExportTimeout exporting them (the collector may be slow or away).
	spanDrainTimeout  = 5 * time.Second
	spanExportTimeout = 30 * time.Second
)

// relaySpans drains the runner's spans after each generation and every
// spanRelayPeriod until it exits or is detached, or turns out to keep none (a runner
// adopted from an agent that did not trace).
func (r *ProcessRunner) relaySpans(answered <-chan struct{}) {
	t := time.NewTicker(spanRelayPeriod)
	defer t.Stop()
	for {
		select {
		case <-r.gone:
			return
		case <-r.detached:
			return
		case <-answered:
		case <-t.C:
		}
		body, err := r.drainSpans()
		if errors.Is(err, spanrelay.ErrNoRelay) {
			r.log.Info("The runner keeps no spans (started by an agent without tracing): its requests are traced " +
				"without the runner's stages until it restarts")
			return
		}
		r.exportSpans(body)
	}
}

// drainSpans takes the spans the runner holds and notes any it dropped.
func (r *ProcessRunner) drainSpans() ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), spanDrainTimeout)
	defer cancel()
	body, dropped, err := spanrelay.Drain(ctx, r.client, r.baseURL)
	if err != nil {
		select {
		case <-r.gone:
		default:
			if !errors.Is(err, spanrelay.ErrNoRelay) {
				r.log.V(1).Info("Draining the runner's spans failed", "err", err.Error())
			}
		}
		return nil, err
	}
	r.spanMu.Lock()
	if dropped > r.spansDropped {
		r.log.Info("The runner dropped spans: its queue was full between two drains (is the collector slow?)",
			"dropped", dropped-r.spansDropped)
		r.spansDropped = dropped
	}
	r.spanMu.Unlock()
	return body, nil
}

// exportSpans exports a drained body with the agent's exporter; its failures go where
// the agent's own export failures go.
func (r *ProcessRunner) exportSpans(body []byte) {
	if len(body) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), spanExportTimeout)
	defer cancel()
	if _, err := r.factory.cfg.SpanRelay.Export(ctx, body); err != nil {
		otel.Handle(err)
	}
}

// lastSpans drains the runner before it is stopped, so that the spans of its last
// requests are not lost with it, and exports them in the background.
func (r *ProcessRunner) lastSpans() {
	if r.factory.cfg.SpanRelay == nil {
		return
	}
	if body, err := r.drainSpans(); err == nil {
		go r.exportSpans(body)
	}
}

// answeredTransport signals answered (without blocking: one pending signal is enough)
// whenever the body of an answer to a generation request (/v1/…) is closed.
type answeredTransport struct {
	next     http.RoundTripper
	answered chan<- struct{}
}

func (t answeredTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || !strings.HasPrefix(req.URL.Path, "/v1/") {
		return resp, err
	}
	resp.Body = &answeredBody{ReadCloser: resp.Body, answered: t.answered}
	return resp, nil
}

type answeredBody struct {
	io.ReadCloser
	answered chan<- struct{}
	once     sync.Once
}

func (b *answeredBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() {
		select {
		case b.answered <- struct{}{}:
		default:
		}
	})
	return err
}
