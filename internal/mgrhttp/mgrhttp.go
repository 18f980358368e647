// Package mgrhttp serves a controller-runtime manager's health probes and metrics on
// listeners the caller holds, instead of addresses the manager binds out of sight: a
// test binds port 0 and reads the address back, with no window in which another
// process could take the port.
package mgrhttp

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/macfleet/macfleet/internal/httpserver"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Listen returns ln when it is set, nil when addr is "" or "0" (disabled), and
// otherwise a new listener on addr.
func Listen(ln net.Listener, addr string) (net.Listener, error) {
	if ln != nil || addr == "" || addr == "0" {
		return ln, nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	return l, nil
}

// Probes are the checks of /healthz and /readyz (and of /healthz/NAME, /readyz/NAME).
type Probes struct {
	Healthz, Readyz map[string]healthz.Checker
}

// Add makes mgr serve the probes on probes and the controller-runtime metrics
// registry (/metrics) on metricsLn; a nil listener serves nothing. The manager's own
// probe and metrics servers are expected to be disabled ("0").
func Add(mgr manager.Manager, probes net.Listener, p Probes, metricsLn net.Listener) error {
	if probes != nil {
		mux := http.NewServeMux()
		for path, checks := range map[string]map[string]healthz.Checker{"/healthz": p.Healthz, "/readyz": p.Readyz} {
			h := unavailable(http.StripPrefix(path, &healthz.Handler{Checks: checks}))
			mux.Handle(path, h)
			mux.Handle(path+"/", h)
		}
		if err := mgr.Add(server("health probe", probes, mux)); err != nil {
			return err
		}
	}
	if metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
		if err := mgr.Add(server("metrics", metricsLn, mux)); err != nil {
			return err
		}
	}
	return nil
}

func server(name string, ln net.Listener, h http.Handler) *manager.Server {
	grace := time.Minute
	return &manager.Server{Name: name, Listener: httpserver.Listener(ln, httpserver.Limits{}), ShutdownTimeout: &grace,
		Server: httpserver.New(h, httpserver.Limits{})}
}

// unavailable answers a failed check 503 Service Unavailable (what it means: do not
// send traffic here now) where the checks' handler answers 500.
func unavailable(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&unavailableWriter{ResponseWriter: w}, r)
	})
}

type unavailableWriter struct{ http.ResponseWriter }

func (w *unavailableWriter) WriteHeader(code int) {
	if code == http.StatusInternalServerError {
		code = http.StatusServiceUnavailable
	}
	w.ResponseWriter.WriteHeader(code)
}
