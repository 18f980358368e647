package admission

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/rebuild"
	"github.com/macfleet/macfleet/gateway/tenancy"
)

// The index of the teams' keys that the manager publishes (controllers/apikeyindex),
// by name: the gateway reads no team's Secret.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch,resourceNames=macfleet-api-keys,namespace=macfleet-system

// indexKey is the key index Secret.
var indexKey = client.ObjectKey{Namespace: mfv1.SystemNamespace, Name: mfv1.APIKeyIndexSecret}

// KeyIndex is the informer cache's view of Secrets: the key index alone (a watch by
// name in macfleet-system, which the gateway's Role allows and nothing wider).
func KeyIndex() cache.ByObject {
	return cache.ByObject{
		Namespaces: map[string]cache.Config{indexKey.Namespace: {}},
		Field:      fields.OneTermEqualSelector("metadata.name", indexKey.Name),
	}
}

// TenantKeys keeps a snapshot of the teams' API keys (tenancy.Build) in step with the
// key index the manager publishes from the key Secrets: every change of the index
// rebuilds it, so a key created with kubectl works, and a deleted one stops, within
// a second or so of the change (the manager's watch, its write, the gateway's watch).
// The index holds hashes, never a key.
type TenantKeys struct {
	cache  cache.Cache
	log    logr.Logger
	keys   atomic.Pointer[tenancy.Keys]
	kick   chan struct{}
	synced atomic.Bool
	// problems is the last rebuild's, logged when they change.
	problems []string
}

// NewTenantKeys reads the key index from c once started (it is a manager Runnable).
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

// Start watches the key index and rebuilds the snapshot on every change until ctx
// ends.
func (k *TenantKeys) Start(ctx context.Context) error {
	inf, err := k.cache.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return fmt.Errorf("informer for the API key index: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { k.poke() }, UpdateFunc: func(any, any) { k.poke() }, DeleteFunc: func(any) { k.poke() },
	}); err != nil {
		return fmt.Errorf("watching the API key index: %w", err)
	}
	if !k.cache.WaitForCacheSync(ctx) {
		return ctx.Err()
	}
	rebuild.Loop(ctx, k.kick, k.rebuild, func(err error) {
		k.log.Error(err, "Reading the API key index; keeping the previous keys")
	}, &k.synced)
	return nil
}

func (k *TenantKeys) rebuild(ctx context.Context) error {
	var sec corev1.Secret
	if err := k.cache.Get(ctx, indexKey, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("the API key index Secret %s does not exist yet: the manager publishes it (is it running?)", indexKey)
		}
		return fmt.Errorf("reading the API key index Secret %s: %w", indexKey, err)
	}
	if sec.Type != tenancy.IndexSecretType {
		return fmt.Errorf("Secret %s has type %q, not %q: delete it, and the manager publishes the API key index there",
			indexKey, sec.Type, tenancy.IndexSecretType)
	}
	ix, err := tenancy.ParseIndex(sec.Data[tenancy.IndexField])
	if err != nil {
		return fmt.Errorf("Secret %s: %w", indexKey, err)
	}
	secrets, err := ix.Secrets()
	if err != nil {
		return fmt.Errorf("Secret %s: %w", indexKey, err)
	}
	keys, problems := tenancy.Build(secrets)
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
