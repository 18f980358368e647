package gateway_test

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/apikeyindex"
	"github.com/macfleet/macfleet/internal/testenv"
)

// startKeyIndex runs the manager's API key index publisher against e, with the cache
// and clients the shipped manager gives it (internal/manager): the gateway with
// --tenant-keys reads the teams' keys from its index, not from their Secrets.
func startKeyIndex(e *testenv.Env) (stop func(), err error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: mfv1.SystemNamespace}}
	if err := e.Client.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", mfv1.SystemNamespace, err)
	}
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{Scheme: e.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		Cache:      cache.Options{ByObject: apikeyindex.CacheByObject()}})
	if err != nil {
		return nil, err
	}
	if err := (&apikeyindex.Publisher{Client: e.Client}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return func() { cancel(); <-done }, nil
}
