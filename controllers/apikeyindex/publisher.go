package apikeyindex

import (
	"bytes"
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy"
)

// The key Secrets of every namespace (the cache keeps only their redacted form); the
// index is written with the manager's Role in macfleet-system (certsigner's markers).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=list;watch

// DefaultResync bounds how long an index deleted or edited by hand stays so.
const DefaultResync = time.Minute

// indexKey is the index Secret, the one request the controller reconciles.
var indexKey = types.NamespacedName{Namespace: mfv1.SystemNamespace, Name: mfv1.APIKeyIndexSecret}

// CacheByObject is the manager cache's view of Secrets: only the key Secrets (the API
// server filters by type), and of each only what tenancy.Redact keeps, so the manager
// holds no key in memory either.
func CacheByObject() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{&corev1.Secret{}: {
		Field: fields.OneTermEqualSelector("type", string(tenancy.SecretType)),
		Transform: func(obj any) (any, error) {
			if s, ok := obj.(*corev1.Secret); ok {
				return tenancy.Redact(s), nil
			}
			return obj, nil
		},
	}}
}

// Publisher rewrites the index Secret on every change of a key Secret, once at its
// start and every DefaultResync.
type Publisher struct {
	// Reader lists the key Secrets (the manager's cache, with CacheByObject); nil
	// means the manager's.
	Reader client.Reader
	// Client reads and writes the index Secret directly (the cache holds only key
	// Secrets).
	Client client.Client
	// Resync is DefaultResync when zero.
	Resync time.Duration
}

// SetupWithManager watches the key Secrets; every event reconciles the one index.
func (p *Publisher) SetupWithManager(mgr ctrl.Manager) error {
	if p.Reader == nil {
		p.Reader = mgr.GetCache()
	}
	toIndex := handler.TypedEnqueueRequestsFromMapFunc(func(context.Context, *corev1.Secret) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: indexKey}}
	})
	atStart := source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(reconcile.Request{NamespacedName: indexKey})
		return nil
	})
	return ctrl.NewControllerManagedBy(mgr).Named("apikeyindex").
		WatchesRawSource(source.Kind(mgr.GetCache(), &corev1.Secret{}, toIndex)).
		WatchesRawSource(atStart).
		Complete(p)
}

// Reconcile builds the index from the cached key Secrets and writes it if it changed.
func (p *Publisher) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	var list corev1.SecretList
	if err := p.Reader.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the API key Secrets: %w", err)
	}
	data, keys, err := Build(list.Items)
	if err != nil {
		return ctrl.Result{}, err
	}
	wrote, err := p.write(ctx, data)
	if err != nil {
		return ctrl.Result{}, err
	}
	if wrote {
		ctrl.LoggerFrom(ctx).Info("Published the API key index", "secret", indexKey.String(), "keys", keys, "bytes", len(data))
	}
	resync := p.Resync
	if resync <= 0 {
		resync = DefaultResync
	}
	return ctrl.Result{RequeueAfter: resync}, nil
}

// write makes the index Secret hold data; wrote is false when it already did.
func (p *Publisher) write(ctx context.Context, data []byte) (wrote bool, err error) {
	var cur corev1.Secret
	err = p.Client.Get(ctx, indexKey, &cur)
	switch {
	case apierrors.IsNotFound(err):
		if err := p.Client.Create(ctx, Desired(data)); err != nil {
			return false, fmt.Errorf("creating the API key index Secret %s: %w", indexKey, err)
		}
		return true, nil
	case err != nil:
		return false, fmt.Errorf("reading the API key index Secret %s: %w", indexKey, err)
	case cur.Type != tenancy.IndexSecretType:
		return false, fmt.Errorf("Secret %s has type %q, not %q: delete it, and the manager publishes the API key index there",
			indexKey, cur.Type, tenancy.IndexSecretType)
	case len(cur.Data) == 1 && bytes.Equal(cur.Data[tenancy.IndexField], data):
		return false, nil
	}
	cur.Data = Desired(data).Data
	if err := p.Client.Update(ctx, &cur); err != nil {
		return false, fmt.Errorf("updating the API key index Secret %s: %w", indexKey, err)
	}
	return true, nil
}
