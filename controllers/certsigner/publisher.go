package certsigner

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/pki"
)

// The bundle in every namespace with a ModelDeployment.
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;create;update

// BundlePublisher copies the fleet CA bundle into every namespace that has a
// ModelDeployment (ConfigMap macfleet-ca, key ca.crt), for the workloads there that call
// a deployment's Service (the agents) and check its certificate. It checks each
// namespace again every DefaultResync, so a rotated bundle reaches it within that.
type BundlePublisher struct {
	// Client writes the ConfigMaps directly (the manager caches none).
	Client    client.Client
	Authority *Authority
}

// SetupWithManager watches ModelDeployments.
func (p *BundlePublisher) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("cabundle").For(&mfv1.ModelDeployment{}).Complete(p)
}

// Reconcile writes the bundle into the deployment's namespace.
func (p *BundlePublisher) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	select {
	case <-p.Authority.Loaded():
	case <-ctx.Done():
		return ctrl.Result{}, ctx.Err()
	}
	if err := ensureBundle(ctx, p.Client, req.Namespace, pki.EncodeCerts(p.Authority.Bundle()...)); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: DefaultResync}, nil
}
