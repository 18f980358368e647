package informers_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/internal/informers"
	"github.com/macfleet/macfleet/test/support/testenv"
)

const (
	// outage is long enough for the reflector's backoff to reach waits of 6–26 s.
	outage = 15 * time.Second
	// resumeWithin is the bound on the wrapped informer (it needs about a second),
	// generous for a loaded 2-core machine.
	resumeWithin = 5 * time.Second
	// baselineCap bounds the wait for the unwrapped informer: its longest backoff is
	// 30 s stretched by up to 2×.
	baselineCap = 65 * time.Second
)

// TestInformerResumesRightAfterOutage cuts a real API server off from two caches (one
// built with NewInformer, one with controller-runtime's default informer) for
// outage, creates a ConfigMap as soon as it is reachable again, and measures how long
// each cache takes to see it.
func TestInformerResumesRightAfterOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("cuts the API server off for 15 s")
	}
	env := testenv.Start(t, testenv.WithCRDPaths())
	ns := testenv.NewNamespace(t, env.Client)
	rc, relay := testenv.RelayConfig(t, env.Config)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	start := func(newInformer func(*testing.T) cache.Options) cache.Cache {
		opts := newInformer(t)
		opts.Scheme = env.Scheme
		opts.DefaultNamespaces = map[string]cache.Config{ns: {}}
		c, err := cache.New(rc, opts)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.GetInformer(ctx, &corev1.ConfigMap{}, cache.BlockUntilSynced(false)); err != nil {
			t.Fatal(err)
		}
		go func() { _ = c.Start(ctx) }()
		if !c.WaitForCacheSync(ctx) {
			t.Fatal("the cache did not sync")
		}
		return c
	}
	wrapped := start(func(t *testing.T) cache.Options {
		return cache.Options{NewInformer: informers.NewInformer(informers.Options{Log: testr.New(t)})}
	})
	baseline := start(func(*testing.T) cache.Options { return cache.Options{} })

	create := func(name string) client.ObjectKey {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if err := env.Client.Create(t.Context(), cm); err != nil {
			t.Fatal(err)
		}
		return client.ObjectKeyFromObject(cm)
	}
	has := func(c cache.Cache, key client.ObjectKey) bool {
		return c.Get(ctx, key, &corev1.ConfigMap{}) == nil
	}
	// Both watches are established before the cut.
	before := create("before")
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		return has(wrapped, before) && has(baseline, before), "the caches do not see a ConfigMap created before the cut"
	})

	relay.Cut()
	cut := time.NewTimer(outage)
	select {
	case <-cut.C:
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if err := relay.Restore(); err != nil {
		t.Fatal(err)
	}
	after := create("after")
	created := time.Now()

	var wrappedDelay, baselineDelay time.Duration
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for wrappedDelay == 0 || baselineDelay == 0 {
		elapsed := time.Since(created)
		if wrappedDelay == 0 && has(wrapped, after) {
			wrappedDelay = elapsed
		}
		if baselineDelay == 0 && has(baseline, after) {
			baselineDelay = elapsed
		}
		if elapsed > baselineCap {
			break
		}
		<-tick.C
	}
	switch {
	case baselineDelay == 0:
		t.Logf("After a %v outage: wrapped informer saw a new object %.1fs after the restore; the default one not within %v",
			outage, wrappedDelay.Seconds(), baselineCap)
	default:
		t.Logf("After a %v outage: wrapped informer saw a new object %.1fs after the restore, the default one %.1fs",
			outage, wrappedDelay.Seconds(), baselineDelay.Seconds())
	}
	if wrappedDelay == 0 || wrappedDelay > resumeWithin {
		t.Errorf("the wrapped informer took %v (0: never) to see an object created after the outage, want at most %v",
			wrappedDelay, resumeWithin)
	}
}
