// Package apikeyindextest runs the manager's API key index publisher (package
// apikeyindex) against a test's API server, with the cache and clients
// cmd/macfleet/manager gives it, for tests of the gateway with --tenant-keys, which
// reads the teams' keys from the index.
package apikeyindextest

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/apikeyindex"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// Start creates the namespace macfleet-system if it is missing and runs the publisher
// (resync 0: apikeyindex.DefaultResync) in a manager of its own until stop is called.
// It returns a stop function rather than taking a test, so that a package may run one
// publisher for all its tests.
func Start(e *testenv.Env, resync time.Duration) (stop func() error, err error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: mfv1.SystemNamespace}}
	if err := e.Client.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", mfv1.SystemNamespace, err)
	}
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{Scheme: e.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: new(true)},
		Cache:      cache.Options{ByObject: apikeyindex.CacheByObject()}})
	if err != nil {
		return nil, err
	}
	if err := (&apikeyindex.Publisher{Client: e.Client, Resync: resync}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return func() error {
		cancel()
		if err := <-done; err != nil {
			return fmt.Errorf("the API key index publisher's manager: %w", err)
		}
		return nil
	}, nil
}
