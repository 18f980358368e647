// Package apikeyindex publishes the teams' API keys for the gateways: the manager
// watches the key Secrets (type tenancy.SecretType, in every namespace) and keeps one
// Secret, macfleet-system/macfleet-api-keys, that holds of each only what
// tenancy.Redact keeps — its name, namespace, priority and cache-scope annotations and
// the key's SHA-256 — never a key. A gateway's ServiceAccount may read that Secret by
// name and no other but its own certificate's, so a compromised gateway reads neither
// the fleet CA's key nor any team's Secret.
//
// Build is the pure part (the Secrets in, the index's bytes out); Publisher writes it.
package apikeyindex

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy"
)

// MaxBytes is the most index data a Secret holds: the API server refuses a Secret
// whose data (field names and values) is over 1 MiB.
const MaxBytes = 1<<20 - len(tenancy.IndexField)

// Build is the index of the key Secrets: each Secret of type tenancy.SecretType that
// is not being deleted, as tenancy.EntryOf keeps it, in namespace/name order so that
// the same Secrets always give the same bytes (an unchanged index is not rewritten).
// keys is how many entries it holds. An index over MaxBytes is an error.
func Build(secrets []corev1.Secret) (data []byte, keys int, err error) {
	ix := tenancy.Index{Version: tenancy.IndexVersion, Keys: []tenancy.IndexEntry{}}
	for i := range secrets {
		s := &secrets[i]
		if s.Type != tenancy.SecretType || s.DeletionTimestamp != nil {
			continue
		}
		ix.Keys = append(ix.Keys, tenancy.EntryOf(s))
	}
	slices.SortFunc(ix.Keys, func(a, b tenancy.IndexEntry) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	data, err = json.Marshal(ix)
	if err != nil {
		return nil, 0, fmt.Errorf("encoding the API key index: %w", err)
	}
	if len(data) > MaxBytes {
		return nil, len(ix.Keys), fmt.Errorf("the API key index of %d key Secrets takes %d bytes, over the %d a Secret holds: "+
			"the gateways keep the keys of the last index that fit until key Secrets are deleted", len(ix.Keys), len(data), MaxBytes)
	}
	return data, len(ix.Keys), nil
}

// Desired is the index Secret holding data.
func Desired(data []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: mfv1.SystemNamespace, Name: mfv1.APIKeyIndexSecret,
			Labels: map[string]string{"app.kubernetes.io/part-of": "macfleet", "app.kubernetes.io/managed-by": "macfleet-manager"}},
		Type: tenancy.IndexSecretType,
		Data: map[string][]byte{tenancy.IndexField: data},
	}
}
