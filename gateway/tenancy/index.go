package tenancy

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// The key index: what the manager publishes of the key Secrets for the gateways, so
// that a gateway reads one Secret of its own and no team's Secret. It holds what
// Redact keeps of each key Secret (name, namespace, the two annotations, the key's
// SHA-256 or why it has none usable), never a key.
const (
	// IndexSecretType is the type of the index Secret (api/v1alpha1 APIKeyIndexSecret).
	IndexSecretType corev1.SecretType = "macfleet.dev/api-key-index"
	// IndexField is the index Secret's data field: an Index in JSON.
	IndexField = "keys.json"
	// IndexVersion is the Index's format; a gateway refuses an index of another.
	IndexVersion = 1
)

// Index is the key index as the index Secret holds it.
type Index struct {
	Version int          `json:"version"`
	Keys    []IndexEntry `json:"keys"`
}

// IndexEntry is one key Secret as Redact keeps it.
type IndexEntry struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// SHA256 is the key's hash, or Problem why the Secret holds no usable key.
	SHA256  []byte `json:"sha256,omitempty"`
	Problem string `json:"problem,omitempty"`
	// Priority and CacheScope are the Secret's AnnotationPriority and
	// AnnotationCacheScope, when set.
	Priority   *string `json:"priority,omitempty"`
	CacheScope *string `json:"cacheScope,omitempty"`
}

// EntryOf is what the index holds of a key Secret (Redact's view of it).
func EntryOf(s *corev1.Secret) IndexEntry {
	r := Redact(s)
	e := IndexEntry{Namespace: r.Namespace, Name: r.Name}
	if v, ok := r.Annotations[AnnotationPriority]; ok {
		e.Priority = &v
	}
	if v, ok := r.Annotations[AnnotationCacheScope]; ok {
		e.CacheScope = &v
	}
	if p, ok := r.Data[problemField]; ok {
		e.Problem = string(p)
	} else {
		e.SHA256 = r.Data[hashField]
	}
	return e
}

// Secrets are the index's entries as the redacted key Secrets Build reads, or why the
// index cannot be read.
func (ix Index) Secrets() ([]corev1.Secret, error) {
	if ix.Version != IndexVersion {
		return nil, fmt.Errorf("the key index has format version %d, this gateway reads %d", ix.Version, IndexVersion)
	}
	out := make([]corev1.Secret, len(ix.Keys))
	for i, e := range ix.Keys {
		s := &out[i]
		s.Namespace, s.Name, s.Type = e.Namespace, e.Name, SecretType
		for a, v := range map[string]*string{AnnotationPriority: e.Priority, AnnotationCacheScope: e.CacheScope} {
			if v != nil {
				if s.Annotations == nil {
					s.Annotations = map[string]string{}
				}
				s.Annotations[a] = *v
			}
		}
		switch {
		case e.Problem != "":
			s.Data = map[string][]byte{problemField: []byte(e.Problem)}
		case len(e.SHA256) == 32:
			s.Data = map[string][]byte{hashField: e.SHA256}
		default:
			return nil, fmt.Errorf("the key index's entry %s/%s has neither a 32-byte sha256 nor a problem", e.Namespace, e.Name)
		}
	}
	return out, nil
}

// ParseIndex reads the index Secret's IndexField.
func ParseIndex(data []byte) (Index, error) {
	var ix Index
	if err := json.Unmarshal(data, &ix); err != nil {
		return ix, fmt.Errorf("the key index: %w", err)
	}
	return ix, nil
}
