package informers_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/macfleet/macfleet/internal/informers"
	"github.com/macfleet/macfleet/test/support/testenv"
)

var (
	refused   = &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}
	forbidden = apierrors.NewForbidden(corev1.Resource("configmaps"), "", errors.New("no"))
	expired   = apierrors.NewResourceExpired("too old resource version: 1 (5)")
)

const (
	msgLost    = "API server unreachable, retrying until it returns"
	msgReached = "API server reachable again"
)

// recorder is a logr sink keeping the messages logged.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Init(logr.RuntimeInfo)                  {}
func (r *recorder) Enabled(int) bool                       { return true }
func (r *recorder) WithValues(...any) logr.LogSink         { return r }
func (r *recorder) WithName(string) logr.LogSink           { return r }
func (r *recorder) Error(err error, msg string, kv ...any) { r.Info(0, msg, kv...) }
func (r *recorder) Info(_ int, msg string, _ ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, msg)
}

func (r *recorder) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}

// scripted is a ListerWatcher whose calls fail with errs in turn, then succeed.
func scripted(errs []error, calls *atomic.Int32) *toolscache.ListWatch {
	next := func() error {
		n := int(calls.Add(1))
		if n <= len(errs) {
			return errs[n-1]
		}
		return nil
	}
	return &toolscache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			if err := next(); err != nil {
				return nil, err
			}
			return &corev1.ConfigMapList{}, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			if err := next(); err != nil {
				return nil, err
			}
			return watch.NewEmptyWatch(), nil
		},
	}
}

func TestRetriesOnlyWhileUnreachable(t *testing.T) {
	cases := []struct {
		name      string
		errs      []error
		wantCalls int32
		wantErr   error
		wantLog   []string
	}{
		{name: "reachable", wantCalls: 1},
		{name: "refused three times", errs: []error{refused, refused, refused}, wantCalls: 4,
			wantLog: []string{msgLost, msgReached}},
		{name: "forbidden is returned at once", errs: []error{forbidden}, wantCalls: 1, wantErr: forbidden},
		{name: "expired after an outage is returned", errs: []error{refused, refused, expired}, wantCalls: 3,
			wantErr: expired, wantLog: []string{msgLost, msgReached}},
		{name: "a 503 is retried", errs: []error{apierrors.NewServiceUnavailable("starting"), refused}, wantCalls: 3,
			wantLog: []string{msgLost, msgReached}},
	}
	verbs := map[string]func(informers.ListerWatcher) error{
		"list": func(lw informers.ListerWatcher) error {
			_, err := lw.ListWithContext(t.Context(), metav1.ListOptions{})
			return err
		},
		"watch": func(lw informers.ListerWatcher) error {
			w, err := lw.WatchWithContext(t.Context(), metav1.ListOptions{})
			if w != nil {
				w.Stop()
			}
			return err
		},
	}
	for verb, call := range verbs {
		for _, tc := range cases {
			t.Run(verb+"/"+tc.name, func(t *testing.T) {
				var calls atomic.Int32
				rec := &recorder{}
				lw := informers.Wrap(scripted(tc.errs, &calls), informers.Options{Log: logr.New(rec), Interval: time.Millisecond})
				err := call(lw)
				if !errors.Is(err, tc.wantErr) {
					t.Errorf("error = %v, want %v", err, tc.wantErr)
				}
				if got := calls.Load(); got != tc.wantCalls {
					t.Errorf("%d calls, want %d", got, tc.wantCalls)
				}
				if diff := cmp.Diff(tc.wantLog, rec.messages()); diff != "" {
					t.Errorf("log (-want +got):\n%s", diff)
				}
			})
		}
	}
}

func TestRetryEndsWithItsContext(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	var calls atomic.Int32
	lw := informers.Wrap(scripted([]error{refused, refused, refused}, &calls), informers.Options{Clock: clk})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := lw.ListWithContext(ctx, metav1.ListOptions{})
		done <- err
	}()
	// The fake clock never moves, so the list waits for its first retry until cancelled.
	testenv.Eventually(t, 5*time.Second, time.Millisecond, func() (bool, string) {
		return clk.HasWaiters(), "the list is not waiting to retry"
	})
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("error = %v, want the last connection refused", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the list still retries after its context ended")
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("%d calls, want 1", got)
	}
}

// counting passes calls on to lw and counts those in progress.
type counting struct {
	informers.ListerWatcher
	active atomic.Int32
}

func (c *counting) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	c.active.Add(1)
	defer c.active.Add(-1)
	return c.ListerWatcher.ListWithContext(ctx, o)
}

func (c *counting) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	c.active.Add(1)
	defer c.active.Add(-1)
	return c.ListerWatcher.WatchWithContext(ctx, o)
}

// TestInformerStopEndsRetries runs a real informer against an API server that never
// answers: its reflector never sees an error (so never backs off), and stopping the
// informer ends the retry loop.
func TestInformerStopEndsRetries(t *testing.T) {
	var calls atomic.Int32
	never := make([]error, 1<<20)
	for i := range never {
		never[i] = refused
	}
	lw := &counting{ListerWatcher: informers.Wrap(scripted(never, &calls), informers.Options{Interval: time.Millisecond})}
	inf := toolscache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, toolscache.Indexers{})
	var seen atomic.Int32
	if err := inf.SetWatchErrorHandlerWithContext(func(context.Context, *toolscache.Reflector, error) { seen.Add(1) }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan struct{})
	go func() { inf.RunWithContext(ctx); close(stopped) }()
	testenv.Eventually(t, 10*time.Second, time.Millisecond, func() (bool, string) {
		return calls.Load() >= 20, "the list is not being retried"
	})
	cancel()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the informer did not stop")
	}
	// The reflector does not wait for its list goroutine; the retry loop must end anyway.
	testenv.Eventually(t, 5*time.Second, time.Millisecond, func() (bool, string) {
		return lw.active.Load() == 0, "a list or watch is still retrying after the informer stopped"
	})
	if n := seen.Load(); n != 0 {
		t.Errorf("the reflector saw %d errors, want none", n)
	}
}

type watchListSupport bool

func (w watchListSupport) IsWatchListSemanticsUnSupported() bool { return !bool(w) }

func TestKeepsWatchListSupport(t *testing.T) {
	lw := &toolscache.ListWatch{}
	cases := []struct {
		name  string
		inner toolscache.ListerWatcher
		want  bool
	}{
		{"says nothing", lw, false},
		{"supports it", struct {
			toolscache.ListerWatcher
			watchListSupport
		}{lw, true}, false},
		{"does not support it", struct {
			toolscache.ListerWatcher
			watchListSupport
		}{lw, false}, true},
		{"client-go's wrapper", toolscache.ToListWatcherWithWatchListSemantics(lw, watchListSupport(false)), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := informers.Wrap(tc.inner, informers.Options{}).IsWatchListSemanticsUnSupported(); got != tc.want {
				t.Errorf("IsWatchListSemanticsUnSupported() = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestContactFollowsOutages: Contact.Since is now while any wrapped list or watch
// cannot reach the API server, the end of the outage once all can, and an informer
// that stops during an outage does not keep it in one.
func TestContactFollowsOutages(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	contact := &informers.Contact{}
	if got := contact.Since(clk.Now()); !got.IsZero() {
		t.Fatalf("before any outage Since = %v, want the zero time", got)
	}

	// An outage that ends: one refusal, then an answer a minute later.
	var calls atomic.Int32
	lw := informers.Wrap(scripted([]error{refused}, &calls), informers.Options{Clock: clk, Contact: contact})
	done := make(chan error, 1)
	go func() {
		_, err := lw.ListWithContext(t.Context(), metav1.ListOptions{})
		done <- err
	}()
	testenv.Eventually(t, 5*time.Second, time.Millisecond, func() (bool, string) {
		return clk.HasWaiters(), "the list is not waiting to retry"
	})
	if now := clk.Now(); !contact.Since(now).Equal(now) {
		t.Errorf("during the outage Since = %v, want now (%v)", contact.Since(now), now)
	}
	clk.Step(time.Minute)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	resumed := clk.Now()
	clk.Step(time.Hour)
	if got := contact.Since(clk.Now()); !got.Equal(resumed) {
		t.Errorf("after the outage Since = %v, want its end %v", got, resumed)
	}

	// An informer that stops during an outage: the outage is not called over, and
	// contact is no longer held in it.
	var calls2 atomic.Int32
	lw2 := informers.Wrap(scripted([]error{refused, refused}, &calls2), informers.Options{Clock: clk, Contact: contact})
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		_, err := lw2.WatchWithContext(ctx, metav1.ListOptions{})
		done <- err
	}()
	testenv.Eventually(t, 5*time.Second, time.Millisecond, func() (bool, string) {
		return clk.HasWaiters(), "the watch is not waiting to retry"
	})
	if now := clk.Now(); !contact.Since(now).Equal(now) {
		t.Errorf("during the second outage Since = %v, want now", contact.Since(now))
	}
	cancel()
	<-done
	if got := contact.Since(clk.Now()); !got.Equal(resumed) {
		t.Errorf("after an informer stopped mid-outage Since = %v, want the last end %v", got, resumed)
	}
}
