package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/macfleet/macfleet/internal/httpserver"
)

// apiServer serves the OpenAI API as a manager Runnable. Told to stop, it drains:
// /readyz fails at once, the listener closes, and the requests in flight get
// drainTimeout to finish.
type apiServer struct {
	// handler is set by Run; hosts are the Host names it may answer (Guard).
	handler http.Handler
	hosts   *httpserver.Hosts
	ln      net.Listener
	// tls, when set, is the API's own TLS: ln serves it.
	tls          *servingTLS
	log          logr.Logger
	started      func(string)
	limits       httpserver.Limits
	drainTimeout time.Duration
	draining     atomic.Bool
	// running is set once Start was called; drained is closed once it returned:
	// nothing is in flight any more.
	running atomic.Bool
	drained chan struct{}
}

// newAPIServer listens on cfg's address (or listener) with cfg's limits, over TLS
// with cfg's certificate files, and completes the drain timeout and the Host names
// the API answers (any when none are configured). reg receives the TLS metrics.
func newAPIServer(cfg Config, reg prometheus.Registerer, log logr.Logger) (*apiServer, error) {
	s := &apiServer{log: log, started: cfg.Started, limits: cfg.Limits, drainTimeout: cfg.DrainTimeout,
		drained: make(chan struct{})}
	if s.drainTimeout <= 0 {
		s.drainTimeout = DefaultDrainTimeout
	}
	allowed := cfg.AllowedHosts
	if len(allowed) == 0 {
		allowed = []string{httpserver.AnyHost}
	}
	var err error
	if s.hosts, err = httpserver.NewHosts(cfg.Listen, allowed); err != nil {
		return nil, err
	}
	if s.tls, err = newServingTLS(cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSPoll, reg, log.WithName("tls")); err != nil {
		return nil, err
	}
	if cfg.Listener != nil {
		s.ln = httpserver.Listener(cfg.Listener, cfg.Limits)
	} else if s.ln, err = httpserver.Listen(cfg.Listen, cfg.Limits); err != nil {
		return nil, err
	}
	if s.tls != nil {
		// Beneath TLS, the connection caps count TCP connections (httpserver.Listener).
		s.ln = tls.NewListener(s.ln, s.tls.config)
	}
	return s, nil
}

func (s *apiServer) Start(ctx context.Context) error {
	s.running.Store(true)
	defer close(s.drained)
	srv := httpserver.New(s.handler, s.limits)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(s.ln) }()
	s.log.Info("Serving the OpenAI API", "addr", s.ln.Addr().String(), "tls", s.tls != nil)
	if s.started != nil {
		s.started(s.ln.Addr().String())
	}
	select {
	case err := <-done:
		return fmt.Errorf("serving the API: %w", err)
	case <-ctx.Done():
	}
	s.draining.Store(true)
	s.log.Info("Draining: /readyz fails and no new connection is taken; the requests in flight may finish", "timeout", s.drainTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), s.drainTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		s.log.Info("Requests still in flight were cut at the end of the drain", "timeout", s.drainTimeout, "err", err.Error())
		return nil
	}
	s.log.Info("Drained: every request in flight finished")
	return nil
}

// notDraining is the readiness check that fails from the moment the gateway is told
// to stop, so that no new client is sent to it.
func (s *apiServer) notDraining(*http.Request) error {
	if s.draining.Load() {
		return errors.New("the gateway is shutting down: it finishes the requests in flight and takes no new ones")
	}
	return nil
}

// untilDrained runs r with a context that ends once the manager's has ended and the
// API server has drained (at once when it never started).
func (s *apiServer) untilDrained(r manager.Runnable) manager.Runnable {
	return manager.RunnableFunc(func(ctx context.Context) error {
		rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		defer cancel()
		go func() {
			<-ctx.Done()
			if s.running.Load() {
				<-s.drained // within drainTimeout
			}
			cancel()
		}()
		return r.Start(rctx)
	})
}
