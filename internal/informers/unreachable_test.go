package informers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/macfleet/macfleet/internal/informers"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// statusHandler answers every request with err's Status, as the API server does.
func statusHandler(err *apierrors.StatusError) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		st := err.Status()
		st.Kind, st.APIVersion = "Status", "v1"
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(int(st.Code))
		_ = json.NewEncoder(w).Encode(&st)
	}
}

// hangUp closes the connection without an answer; with reset, with an RST.
func hangUp(reset bool) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		c, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(err)
		}
		if reset {
			_ = c.(*net.TCPConn).SetLinger(0)
		}
		c.Close()
	}
}

func tooLargeResourceVersion() *apierrors.StatusError {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusGatewayTimeout, Reason: metav1.StatusReasonTimeout,
		Message: "Too large resource version: 100, current: 10",
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{
			Type: metav1.CauseTypeResourceVersionTooLarge, Message: "Too large resource version"}}},
	}}
}

// TestUnreachableFromClientErrors classifies the errors client-go's REST client really
// returns for a list, against servers and sockets that behave as described.
func TestUnreachableFromClientErrors(t *testing.T) {
	cm := schema.GroupResource{Resource: "configmaps"}
	cases := []struct {
		name    string
		handler http.HandlerFunc // nil: nothing listens
		tls     bool
		cancel  bool
		want    bool
	}{
		{name: "connection refused", want: true},
		{name: "closed without an answer (EOF)", handler: hangUp(false), want: true},
		{name: "connection reset", handler: hangUp(true), want: true},
		{name: "503 from a starting API server", handler: statusHandler(apierrors.NewServiceUnavailable("not ready")), want: true},
		{name: "503 page from a load balancer", handler: func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "no healthy upstream", http.StatusServiceUnavailable)
		}, want: true},
		{name: "403 forbidden", handler: statusHandler(apierrors.NewForbidden(cm, "", errors.New("no"))), want: false},
		{name: "401 unauthorized", handler: statusHandler(apierrors.NewUnauthorized("expired token")), want: false},
		{name: "404 not found", handler: statusHandler(apierrors.NewNotFound(cm, "")), want: false},
		{name: "410 expired resource version", handler: statusHandler(apierrors.NewResourceExpired("too old resource version: 1 (5)")), want: false},
		{name: "410 gone", handler: statusHandler(apierrors.NewGone("gone")), want: false},
		{name: "504 too large resource version", handler: statusHandler(tooLargeResourceVersion()), want: false},
		{name: "429 too many requests", handler: statusHandler(apierrors.NewTooManyRequests("slow down", 0)), want: false},
		{name: "500 internal error", handler: statusHandler(apierrors.NewInternalError(errors.New("etcd"))), want: false},
		{name: "502 from a proxy", handler: func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "bad gateway", http.StatusBadGateway)
		}, want: false},
		{name: "unknown certificate authority", handler: statusHandler(apierrors.NewServiceUnavailable("x")), tls: true, want: false},
		{name: "cancelled context", handler: hangUp(false), cancel: true, want: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			host := testenv.ReservePort(t).Addr
			proto := "http"
			if tc.handler != nil {
				srv := httptest.NewUnstartedServer(tc.handler)
				if tc.tls {
					srv.StartTLS()
					proto = "https"
				} else {
					srv.Start()
				}
				t.Cleanup(srv.Close)
				host = srv.Listener.Addr().String()
			}
			c, err := rest.RESTClientFor(&rest.Config{
				Host:    (&url.URL{Scheme: proto, Host: host}).String(),
				APIPath: "/api",
				ContentConfig: rest.ContentConfig{
					GroupVersion:         &corev1.SchemeGroupVersion,
					NegotiatedSerializer: scheme.Codecs.WithoutConversion(),
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			if tc.cancel {
				cancel()
			}
			defer cancel()
			// No client-side retries: the reflector's request would retry EOFs and
			// 503s with Retry-After, then fail with the same error.
			_, err = c.Get().Namespace("ns").Resource("configmaps").MaxRetries(0).Do(ctx).Get()
			if err == nil {
				t.Fatal("the list succeeded")
			}
			if got := informers.Unreachable(err); got != tc.want {
				t.Errorf("Unreachable(%q) = %v, want %v", err, got, tc.want)
			}
		})
	}
}

// TestUnreachableWrapped covers error shapes the servers above do not produce
// reliably, built as the standard library and client-go build them.
func TestUnreachableWrapped(t *testing.T) {
	urlErr := func(err error) error { return &url.Error{Op: "Get", URL: "https://10.0.0.1:6443/api", Err: err} }
	dial := func(err error) error { return &net.OpError{Op: "dial", Net: "tcp", Err: err} }
	read := func(errno syscall.Errno) error {
		return &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", errno)}
	}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"dial timeout", urlErr(dial(timeoutError{})), true},
		{"dial DNS failure", urlErr(dial(&net.DNSError{Err: "no such host", Name: "api", IsNotFound: true})), true},
		{"no route to host", urlErr(dial(os.NewSyscallError("connect", syscall.EHOSTUNREACH))), true},
		{"network unreachable", urlErr(dial(os.NewSyscallError("connect", syscall.ENETUNREACH))), true},
		{"read: connection timed out", urlErr(read(syscall.ETIMEDOUT)), true},
		{"read: connection reset", urlErr(read(syscall.ECONNRESET)), true},
		{"write: broken pipe", urlErr(&net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}), true},
		{"unexpected EOF", urlErr(io.ErrUnexpectedEOF), true},
		{"HTTP/2 connection lost", urlErr(errors.New("http2: client connection lost")), true},
		{"HTTP/2 GOAWAY", urlErr(errors.New("http2: server sent GOAWAY and closed the connection; LastStreamID=1")), true},
		{"TLS handshake timeout", urlErr(errors.New("net/http: TLS handshake timeout")), true},
		{"wrapped by the reflector", fmt.Errorf("failed to list *v1.ConfigMap: %w", urlErr(dial(os.NewSyscallError("connect", syscall.ECONNREFUSED)))), true},
		{"request timed out on a live connection", urlErr(fmt.Errorf("%w (Client.Timeout exceeded while awaiting headers)", context.DeadlineExceeded)), false},
		{"context deadline", context.DeadlineExceeded, false},
		{"context cancelled during dial", urlErr(dial(context.Canceled)), false},
		{"a 503 wrapped", fmt.Errorf("listing: %w", apierrors.NewServiceUnavailable("x")), true},
		{"a 403 wrapped", fmt.Errorf("listing: %w", apierrors.NewForbidden(schema.GroupResource{}, "", errors.New("no"))), false},
		{"an unrelated error", errors.New("unable to understand list result"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := informers.Unreachable(tc.err); got != tc.want {
				t.Errorf("Unreachable(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }
