// Package tenancy is who a gateway caller is and what it may use: API keys kept as
// Kubernetes Secrets in each team's namespace, and the rule that scopes a key to its
// namespace's deployments and to those that grant its namespace access.
//
// A key is a Secret of type SecretType with the key in data["key"]:
//
//	kubectl -n team-a create secret generic ci-key --type=macfleet.dev/api-key \
//	    --from-literal=key="$(openssl rand -hex 24)"
//
// Why a typed Secret and not a custom resource whose status holds only the key's
// hash: a namespace's own RBAC on Secrets already decides who may create, read and
// revoke its keys, kubectl creates one in a single command with no tool to hash the
// key first, and Secrets get the cluster's encryption at rest. The manager watches
// only Secrets of this type (a field selector on the watch), keeps nothing of a key
// but its SHA-256 in memory, and publishes those hashes in one Secret of its own (an
// Index, controllers/apikeyindex), which is all the gateway reads. The cost is that
// whoever may read the namespace's Secrets may read its keys, which is what RBAC on
// Secrets means anyway.
//
// The decisions here are pure: Keys is an immutable snapshot built from Secrets (or
// an Index's, which read the same), MayUse says whether an identity may use a
// deployment. The manager and the gateway do the watching and the answering.
package tenancy

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/macfleet/macfleet/gateway/fairqueue"
)

const (
	// SecretType is the type of a Secret that holds a gateway API key.
	SecretType corev1.SecretType = "macfleet.dev/api-key"
	// KeyField is the Secret's data field that holds the key.
	KeyField = "key"
	// AnnotationPriority, on a key's Secret, is the highest priority its requests get
	// (interactive or batch), as priority= in the gateway's keys file.
	AnnotationPriority = "macfleet.dev/priority"
	// AnnotationCacheScope, on a key's Secret, is how far the prompt cache is shared:
	// CacheScopeNamespace (the default: every key of the namespace shares its cached
	// prefixes) or CacheScopeKey (only this key's requests do).
	AnnotationCacheScope = "macfleet.dev/cache-scope"
	CacheScopeNamespace  = "namespace"
	CacheScopeKey        = "key"
	// AllNamespaces in a deployment's spec.access.namespaces grants every namespace.
	AllNamespaces = "*"
	// minKeyBytes is the shortest key accepted from a Secret: a short key is guessable.
	minKeyBytes = 16
	// hashField and problemField are all Redact keeps of a key Secret's data: the key's
	// SHA-256, or why it holds no usable key.
	hashField    = "macfleet.dev/sha256"
	problemField = "macfleet.dev/problem"
)

// Identity is who presented a key.
type Identity struct {
	// Namespace is the namespace of the key's Secret ("" for an admin key).
	Namespace string
	// Name is the key's Secret ("" for a key of the keys file): what metrics and
	// logs name the key by, never the key itself.
	Name string
	// Admin keys (the gateway's keys file) use and see every namespace's deployments.
	Admin bool
	// Priority is the highest priority the key's requests get.
	Priority fairqueue.Priority
	// CachePerKey: the key's prefixes are cached apart from its namespace's other
	// keys (AnnotationCacheScope "key").
	CachePerKey bool
}

// CachePartition is the part of the prompt cache id's requests may hit: its
// namespace's, or its own key's when the key asks for that. Admin keys share one
// partition, "" (the whole fleet is one team's). A request's cache_salt divides a
// partition further (the runner does that).
func (id Identity) CachePartition() string {
	switch {
	case id.Admin || id.Namespace == "":
		return ""
	case id.CachePerKey:
		return id.Namespace + "/" + id.Name
	default:
		return id.Namespace
	}
}

// MayUse says whether id may use a deployment in namespace whose spec.access grants
// the namespaces granted: admins always, a key of the deployment's namespace always,
// another namespace's key when granted by name or by "*".
func MayUse(id Identity, namespace string, granted []string) bool {
	if id.Admin || id.Namespace == namespace {
		return true
	}
	return id.Namespace != "" && (slices.Contains(granted, id.Namespace) || slices.Contains(granted, AllNamespaces))
}

// Keys is an immutable snapshot of the accepted keys by SHA-256, so that a lookup's
// timing says nothing about a key's bytes.
type Keys struct {
	byHash map[[32]byte]Identity
}

// Len is how many keys the snapshot holds.
func (k *Keys) Len() int {
	if k == nil {
		return 0
	}
	return len(k.byHash)
}

// Lookup is the identity of key, if the snapshot holds it.
func (k *Keys) Lookup(key string) (Identity, bool) {
	if k == nil || key == "" {
		return Identity{}, false
	}
	id, ok := k.byHash[sha256.Sum256([]byte(key))]
	return id, ok
}

// Problem is a key Secret that was left out, and why (never the key itself).
type Problem struct {
	Namespace, Name, Reason string
}

func (p Problem) String() string { return fmt.Sprintf("%s/%s: %s", p.Namespace, p.Name, p.Reason) }

// Redact is what the manager's informer cache keeps of a key Secret: its name,
// namespace, type, deletion and its priority and cache-scope annotations, and of its data only the key's
// SHA-256 (or why it has no usable key), so the key itself is never held in memory.
// Build reads a redacted Secret as it reads the Secret.
func Redact(s *corev1.Secret) *corev1.Secret {
	out := &corev1.Secret{TypeMeta: s.TypeMeta, Type: s.Type}
	out.Namespace, out.Name, out.UID, out.ResourceVersion = s.Namespace, s.Name, s.UID, s.ResourceVersion
	out.DeletionTimestamp = s.DeletionTimestamp
	for _, a := range []string{AnnotationPriority, AnnotationCacheScope} {
		if v, ok := s.Annotations[a]; ok {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[a] = v
		}
	}
	if h, problem := keyHash(s); problem != "" {
		out.Data = map[string][]byte{problemField: []byte(problem)}
	} else {
		out.Data = map[string][]byte{hashField: h[:]}
	}
	return out
}

// keyHash is the SHA-256 of the Secret's key, or why it has none usable.
func keyHash(s *corev1.Secret) (h [32]byte, problem string) {
	if p, ok := s.Data[problemField]; ok {
		return h, string(p)
	}
	if b, ok := s.Data[hashField]; ok && len(b) == len(h) {
		copy(h[:], b)
		return h, ""
	}
	key := strings.TrimSpace(string(s.Data[KeyField]))
	if len(key) < minKeyBytes {
		return h, fmt.Sprintf("data.%s must hold a key of at least %d characters (e.g. openssl rand -hex 24)", KeyField, minKeyBytes)
	}
	return sha256.Sum256([]byte(key)), ""
}

// Build makes a snapshot of the key Secrets (the gateway checks its admin keys file
// first: a Secret holding an admin key is never a team's key). A Secret that is being
// deleted, has no usable key, an unknown priority or cache scope is left out and reported. A key
// found in two Secrets is left out of both: it cannot belong to two namespaces.
func Build(secrets []corev1.Secret) (*Keys, []Problem) {
	k := &Keys{byHash: make(map[[32]byte]Identity, len(secrets))}
	var problems []Problem
	owner := map[[32]byte]string{}
	dup := map[[32]byte]bool{}
	for i := range secrets {
		s := &secrets[i]
		if s.Type != SecretType || s.DeletionTimestamp != nil {
			continue
		}
		bad := func(format string, a ...any) {
			problems = append(problems, Problem{Namespace: s.Namespace, Name: s.Name, Reason: fmt.Sprintf(format, a...)})
		}
		h, problem := keyHash(s)
		if problem != "" {
			bad("%s", problem)
			continue
		}
		var prio fairqueue.Priority
		if v, ok := s.Annotations[AnnotationPriority]; ok {
			p, err := fairqueue.ParsePriority(v)
			if err != nil {
				bad("annotation %s: %v", AnnotationPriority, err)
				continue
			}
			prio = p
		}
		perKey := false
		switch v := s.Annotations[AnnotationCacheScope]; v {
		case "", CacheScopeNamespace:
		case CacheScopeKey:
			perKey = true
		default:
			bad("annotation %s: %q is neither %q nor %q", AnnotationCacheScope, v, CacheScopeNamespace, CacheScopeKey)
			continue
		}
		if _, ok := k.byHash[h]; ok {
			dup[h] = true
			bad("the same key is also in %s; neither is accepted", owner[h])
			continue
		}
		owner[h] = s.Namespace + "/" + s.Name
		k.byHash[h] = Identity{Namespace: s.Namespace, Name: s.Name, Priority: prio, CachePerKey: perKey}
	}
	for h := range dup {
		delete(k.byHash, h)
	}
	return k, problems
}

// identityKey is the context key of the caller's identity.
type identityKey struct{}

// WithIdentity is ctx carrying the identity of the caller an API's authentication
// found, for the handlers that scope what it may use.
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// IdentityFrom is the identity WithIdentity put in ctx; ok false when there is none,
// which a caller must treat as an identity that may use nothing.
func IdentityFrom(ctx context.Context) (id Identity, ok bool) {
	id, ok = ctx.Value(identityKey{}).(Identity)
	return id, ok
}
