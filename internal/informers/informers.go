// Package informers builds client-go informers that resume within about a second of the
// API server's return after an outage.
//
// A reflector whose list or watch fails because the API server cannot be reached backs
// off exponentially (800 ms doubling to 30 s, each wait stretched by up to 2×), so after
// a 30 s outage an informer can stay blind for most of a minute after the API server is
// back. Wrap puts a retry loop under the reflector instead: while the API server cannot
// be reached, a list or watch is retried every RetryInterval (plus jitter) until it
// succeeds or the informer stops, and the reflector never sees the error, so its
// backoff never grows. Every other error (403, 410 Gone, a too-large resource version,
// 429, 500, ...) reaches the reflector unchanged and is handled as client-go handles it.
//
// NewInformer plugs this into a controller-runtime cache (cache.Options.NewInformer).
package informers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"
	"k8s.io/utils/clock"
)

const (
	// RetryInterval is how long a list or watch waits before retrying while the API
	// server cannot be reached; each wait is stretched by up to RetryJitter of it.
	RetryInterval = 600 * time.Millisecond
	RetryJitter   = 0.5
)

// Options configure Wrap and NewInformer. The zero value is usable.
type Options struct {
	// Log receives one line when an informer loses the API server and one when it
	// reaches it again.
	Log logr.Logger
	// Interval overrides RetryInterval.
	Interval time.Duration
	// Clock is the real clock when nil.
	Clock clock.WithTicker
	// Contact, when set, is told when each informer loses and regains the API server.
	Contact *Contact
}

// Contact is what a process's informers know of its own connection to the API
// server: whether one of them cannot reach it now, and when the last outage ended.
// A controller that judges other components by how recently they wrote (a node's
// Lease) must not judge them by the time it could not see: after the process itself
// lost the API server, every Lease looks old until its holder had a chance to renew
// it. Safe for concurrent use; the zero value is ready.
type Contact struct {
	mu      sync.Mutex
	lost    int       // informers in an outage now
	resumed time.Time // when the last outage ended
}

func (c *Contact) lose() {
	c.mu.Lock()
	c.lost++
	c.mu.Unlock()
}

func (c *Contact) regain(now time.Time) {
	c.mu.Lock()
	c.lost--
	c.resumed = now
	c.mu.Unlock()
}

func (c *Contact) abandon() {
	c.mu.Lock()
	c.lost--
	c.mu.Unlock()
}

// Since is the time from which the process has been in contact with the API server
// without a break: now while an informer cannot reach it, the end of the last outage
// after one, and the zero time if there was none.
func (c *Contact) Since(now time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lost > 0 {
		return now
	}
	return c.resumed
}

// NewInformer is a cache.Options.NewInformer: the shared index informer controller-runtime
// builds when NewInformer is nil (client-go's NewSharedIndexInformer), over a
// ListerWatcher wrapped by Wrap.
func NewInformer(opts Options) func(toolscache.ListerWatcher, runtime.Object, time.Duration, toolscache.Indexers) toolscache.SharedIndexInformer {
	return func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
		o := opts
		o.Log = o.Log.WithValues("type", typeName(obj))
		return toolscache.NewSharedIndexInformer(Wrap(lw, o), obj, resync, indexers)
	}
}

// typeName names an informer's type for its log lines: the GVK when the object carries
// one (unstructured and metadata-only informers), its Go type otherwise.
func typeName(obj runtime.Object) string {
	if obj == nil {
		return "<nil>"
	}
	if gvk := obj.GetObjectKind().GroupVersionKind(); !gvk.Empty() {
		return gvk.String()
	}
	return fmt.Sprintf("%T", obj)
}

// ListerWatcher is what Wrap returns: a ListerWatcher with the context-aware methods
// the reflector calls, and the optional watch-list capability of the one it wraps.
type ListerWatcher interface {
	toolscache.ListerWatcher
	toolscache.ListerWatcherWithContext
	// IsWatchListSemanticsUnSupported reports what the wrapped ListerWatcher does
	// (false if it says nothing), so the reflector keeps or drops streaming lists
	// exactly as it would without the wrapper.
	IsWatchListSemanticsUnSupported() bool
}

// Wrap returns lw with ListWithContext and WatchWithContext retried while the API
// server cannot be reached (see Unreachable), for as long as their context lives. The
// context-free List and Watch are passed through without retries: with no context
// there would be no way to stop retrying.
func Wrap(lw toolscache.ListerWatcher, opts Options) ListerWatcher {
	if opts.Interval <= 0 {
		opts.Interval = RetryInterval
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &retrying{inner: lw, ctxInner: toolscache.ToListerWatcherWithContext(lw), opts: opts}
}

type retrying struct {
	inner    toolscache.ListerWatcher
	ctxInner toolscache.ListerWatcherWithContext
	opts     Options

	mu sync.Mutex
	// since is when the current outage began; zero while the API server is reachable.
	since time.Time
}

func (r *retrying) List(options metav1.ListOptions) (runtime.Object, error) {
	return r.inner.List(options)
}

func (r *retrying) Watch(options metav1.ListOptions) (watch.Interface, error) {
	return r.inner.Watch(options)
}

func (r *retrying) ListWithContext(ctx context.Context, options metav1.ListOptions) (runtime.Object, error) {
	return retry(ctx, r, "list", func() (runtime.Object, error) { return r.ctxInner.ListWithContext(ctx, options) })
}

func (r *retrying) WatchWithContext(ctx context.Context, options metav1.ListOptions) (watch.Interface, error) {
	return retry(ctx, r, "watch", func() (watch.Interface, error) { return r.ctxInner.WatchWithContext(ctx, options) })
}

func (r *retrying) IsWatchListSemanticsUnSupported() bool {
	return watchlist.DoesClientNotSupportWatchListSemantics(r.inner)
}

// retry calls call until it succeeds, fails with an error that is not Unreachable, or
// ctx ends; then it returns call's last result.
func retry[T any](ctx context.Context, r *retrying, verb string, call func() (T, error)) (T, error) {
	for {
		v, err := call()
		if err == nil || ctx.Err() != nil || !Unreachable(err) {
			// Any answer, even an error, means the API server is reachable again.
			if ctx.Err() == nil {
				r.reached()
			} else {
				r.abandon()
			}
			return v, err
		}
		r.lost(verb, err)
		t := r.opts.Clock.NewTimer(wait.Jitter(r.opts.Interval, RetryJitter))
		select {
		case <-ctx.Done():
			t.Stop()
			r.abandon()
			return v, err
		case <-t.C():
		}
	}
}

func (r *retrying) lost(verb string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.since.IsZero() {
		return
	}
	r.since = r.opts.Clock.Now()
	if r.opts.Contact != nil {
		r.opts.Contact.lose()
	}
	r.opts.Log.Info("API server unreachable, retrying until it returns", "verb", verb,
		"every", r.opts.Interval, "err", err.Error())
}

func (r *retrying) reached() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.since.IsZero() {
		return
	}
	r.opts.Log.Info("API server reachable again", "unreachableFor", r.opts.Clock.Since(r.since).Round(time.Millisecond))
	r.since = time.Time{}
	if r.opts.Contact != nil {
		r.opts.Contact.regain(r.opts.Clock.Now())
	}
}

// abandon ends the outage of an informer that stops during it, without calling it
// over: a stopped informer must not hold its Contact in an outage forever.
func (r *retrying) abandon() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.since.IsZero() {
		return
	}
	r.since = time.Time{}
	if r.opts.Contact != nil {
		r.opts.Contact.abandon()
	}
}

// Unreachable reports whether err says the API server could not be reached, rather
// than that it answered: dialing failed (refused, timed out, no route, DNS), the
// connection was reset, aborted or closed early (EOF, a lost HTTP/2 connection), the
// TLS handshake timed out, or the answer was a 503 (an API server still starting, or a
// load balancer with no API server behind it). Any other answer (403, 404, 410 Gone,
// 429, 500, 504 including "too large resource version", ...) is not, nor is a request
// that timed out on a live connection (a slow API server, which the reflector's backoff
// should spare), a TLS certificate error, or a cancelled context.
func Unreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Code == http.StatusServiceUnavailable
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return true
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
			syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ETIMEDOUT:
			return true
		}
	}
	return utilnet.IsProbableEOF(err) || utilnet.IsHTTP2ConnectionLost(err) ||
		strings.Contains(err.Error(), "TLS handshake timeout")
}
