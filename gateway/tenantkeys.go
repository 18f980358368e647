package gateway

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/tenancy"
)

// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch

// tenantSecrets is the informer cache's view of Secrets: only the API key type (the
// API server filters), so the gateway never holds the cluster's other Secrets, and of
// each only what tenancy.Redact keeps: the key's hash, never the key.
func tenantSecrets() cache.ByObject {
	return cache.ByObject{
		Field: fields.OneTermEqualSelector("type", string(tenancy.SecretType)),
		Transform: func(obj any) (any, error) {
			if s, ok := obj.(*corev1.Secret); ok {
				return tenancy.Redact(s), nil
			}
			return obj, nil
		},
	}
}

// TenantKeys keeps a snapshot of the teams' API keys (tenancy.Build) in step with the
// key Secrets: every add, update or delete rebuilds it, so a key created with kubectl
// works, and a deleted one stops, within a second of the watch event.
type TenantKeys struct {
	cache  cache.Cache
	log    logr.Logger
	keys   atomic.Pointer[tenancy.Keys]
	kick   chan struct{}
	synced atomic.Bool
	// problems is the last rebuild's, logged when they change.
	problems []string
}

// NewTenantKeys reads the key Secrets from c once started (it is a manager Runnable).
func NewTenantKeys(c cache.Cache, log logr.Logger) *TenantKeys {
	return &TenantKeys{cache: c, log: log, kick: make(chan struct{}, 1)}
}

// Lookup is the identity of a team's key; false before the first snapshot.
func (k *TenantKeys) Lookup(key string) (tenancy.Identity, bool) { return k.keys.Load().Lookup(key) }

// Synced reports whether a snapshot of synced informers is in place.
func (k *TenantKeys) Synced() bool { return k.synced.Load() }

func (k *TenantKeys) poke() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// Start watches the key Secrets and rebuilds the snapshot on every change until ctx
// ends.
func (k *TenantKeys) Start(ctx context.Context) error {
	inf, err := k.cache.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return fmt.Errorf("informer for API key Secrets: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { k.poke() }, UpdateFunc: func(any, any) { k.poke() }, DeleteFunc: func(any) { k.poke() },
	}); err != nil {
		return fmt.Errorf("watching API key Secrets: %w", err)
	}
	if !k.cache.WaitForCacheSync(ctx) {
		return ctx.Err()
	}
	rebuildLoop(ctx, k.kick, k.rebuild, func(err error) {
		k.log.Error(err, "Reading the API key Secrets; keeping the previous keys")
	}, &k.synced)
	return nil
}

func (k *TenantKeys) rebuild(ctx context.Context) error {
	var list corev1.SecretList
	if err := k.cache.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing Secrets: %w", err)
	}
	keys, problems := tenancy.Build(list.Items)
	k.keys.Store(keys)
	var ps []string
	for _, p := range problems {
		ps = append(ps, p.String())
	}
	slices.Sort(ps)
	if !slices.Equal(ps, k.problems) {
		for _, p := range ps {
			k.log.Info("API key Secret left out", "problem", p)
		}
		k.problems = ps
	}
	k.log.V(1).Info("API keys read", "teamKeys", keys.Len())
	return nil
}
