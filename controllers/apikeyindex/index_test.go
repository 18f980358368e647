package apikeyindex

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/gateway/tenancy"
)

func keySecret(ns, name, key string, annotations map[string]string) corev1.Secret {
	return corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Type: tenancy.SecretType, Data: map[string][]byte{tenancy.KeyField: []byte(key)}}
}

func hashOf(key string) []byte { h := sha256.Sum256([]byte(key)); return h[:] }

func TestBuild(t *testing.T) {
	const keyA, keyB = "aaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbb"
	deleting := keySecret("team-c", "gone", "cccccccccccccccccccc", nil)
	deleting.DeletionTimestamp = &metav1.Time{}
	opaque := keySecret("team-c", "opaque", "dddddddddddddddddddd", nil)
	opaque.Type = corev1.SecretTypeOpaque
	batch := map[string]string{tenancy.AnnotationPriority: "batch", "team.example/owner": "ci"}
	for _, tc := range []struct {
		name    string
		secrets []corev1.Secret
		want    []tenancy.IndexEntry
	}{
		{"no key Secrets", nil, []tenancy.IndexEntry{}},
		{"only the key Secrets that are not being deleted", []corev1.Secret{deleting, opaque, keySecret("team-a", "ci", keyA, nil)},
			[]tenancy.IndexEntry{{Namespace: "team-a", Name: "ci", SHA256: hashOf(keyA)}}},
		{"the two annotations, no other", []corev1.Secret{keySecret("team-a", "ci", keyA, batch)},
			[]tenancy.IndexEntry{{Namespace: "team-a", Name: "ci", SHA256: hashOf(keyA),
				Priority: ptr("batch")}}},
		{"an unusable key is a problem, not a hash", []corev1.Secret{keySecret("team-a", "short", "tooshort", nil)},
			[]tenancy.IndexEntry{{Namespace: "team-a", Name: "short",
				Problem: "data.key must hold a key of at least 16 characters (e.g. openssl rand -hex 24)"}}},
		{"in namespace/name order", []corev1.Secret{keySecret("team-b", "a", keyB, nil), keySecret("team-a", "z", keyA, nil),
			keySecret("team-a", "b", keyB, nil)},
			[]tenancy.IndexEntry{{Namespace: "team-a", Name: "b", SHA256: hashOf(keyB)}, {Namespace: "team-a", Name: "z", SHA256: hashOf(keyA)},
				{Namespace: "team-b", Name: "a", SHA256: hashOf(keyB)}}},
		{"a Secret as the manager's cache holds it (redacted)", []corev1.Secret{*tenancy.Redact(ptr(keySecret("team-a", "ci", keyA, batch)))},
			[]tenancy.IndexEntry{{Namespace: "team-a", Name: "ci", SHA256: hashOf(keyA),
				Priority: ptr("batch")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, keys, err := Build(tc.secrets)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range tc.secrets {
				if k := s.Data[tenancy.KeyField]; len(k) > 0 && strings.Contains(string(data), string(k)) {
					t.Errorf("the index holds the key of %s/%s: %s", s.Namespace, s.Name, data)
				}
			}
			ix, err := tenancy.ParseIndex(data)
			if err != nil {
				t.Fatal(err)
			}
			if ix.Version != tenancy.IndexVersion || keys != len(tc.want) {
				t.Errorf("version %d, %d keys; want %d, %d", ix.Version, keys, tenancy.IndexVersion, len(tc.want))
			}
			if diff := cmp.Diff(tc.want, ix.Keys); diff != "" {
				t.Errorf("entries (-want +got):\n%s", diff)
			}
			// The same Secrets in another order give the same bytes: no rewrite.
			rev := slices.Clone(tc.secrets)
			slices.Reverse(rev)
			if again, _, _ := Build(rev); string(again) != string(data) {
				t.Errorf("reversed input gives\n%s\nnot\n%s", again, data)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestIndexAuthenticatesAsTheSecrets: the gateway's snapshot built from the index
// answers every lookup as one built from the key Secrets themselves, problems included.
func TestIndexAuthenticatesAsTheSecrets(t *testing.T) {
	secrets := []corev1.Secret{
		keySecret("team-a", "ci", "aaaaaaaaaaaaaaaaaaaaaaaa", map[string]string{tenancy.AnnotationPriority: "batch"}),
		keySecret("team-b", "app", "  bbbbbbbbbbbbbbbbbbbbbbbb\n", nil),
		keySecret("team-b", "short", "tooshort", nil),
		keySecret("team-b", "prio", "eeeeeeeeeeeeeeeeeeee", map[string]string{tenancy.AnnotationPriority: "urgent"}),
		keySecret("team-b", "own", "gggggggggggggggggggg", map[string]string{tenancy.AnnotationCacheScope: tenancy.CacheScopeKey}),
		keySecret("team-a", "twin1", "ffffffffffffffffffff", nil),
		keySecret("team-b", "twin2", "ffffffffffffffffffff", nil),
	}
	data, _, err := Build(secrets)
	if err != nil {
		t.Fatal(err)
	}
	ix, err := tenancy.ParseIndex(data)
	if err != nil {
		t.Fatal(err)
	}
	redacted, err := ix.Secrets()
	if err != nil {
		t.Fatal(err)
	}
	fromIndex, problemsIndex := tenancy.Build(redacted)
	fromSecrets, problemsSecrets := tenancy.Build(secrets)
	if fromIndex.Len() != fromSecrets.Len() || fromIndex.Len() != 3 {
		t.Errorf("%d keys from the index, %d from the Secrets, want 3", fromIndex.Len(), fromSecrets.Len())
	}
	for _, key := range []string{"aaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbb", "tooshort", "eeeeeeeeeeeeeeeeeeee",
		"gggggggggggggggggggg", "ffffffffffffffffffff", "nobody's key at all"} {
		idI, okI := fromIndex.Lookup(key)
		idS, okS := fromSecrets.Lookup(key)
		if idI != idS || okI != okS {
			t.Errorf("Lookup(%q): %+v, %v from the index; %+v, %v from the Secrets", key, idI, okI, idS, okS)
		}
	}
	slices.SortFunc(problemsIndex, func(a, b tenancy.Problem) int { return strings.Compare(a.String(), b.String()) })
	slices.SortFunc(problemsSecrets, func(a, b tenancy.Problem) int { return strings.Compare(a.String(), b.String()) })
	if diff := cmp.Diff(problemsSecrets, problemsIndex); diff != "" || len(problemsIndex) != 3 {
		t.Errorf("problems (-secrets +index), want 3:\n%s", diff)
	}
}

// manyKeys are n key Secrets with names of the given lengths, with both annotations
// when annotated.
func manyKeys(n, nsLen, nameLen int, annotated bool) []corev1.Secret {
	out := make([]corev1.Secret, n)
	var ann map[string]string
	if annotated {
		ann = map[string]string{tenancy.AnnotationPriority: "interactive", tenancy.AnnotationCacheScope: tenancy.CacheScopeNamespace}
	}
	for i := range out {
		ns := fmt.Sprintf("%0*d", nsLen, i%100)
		name := fmt.Sprintf("%0*d", nameLen, i)
		out[i] = keySecret("n"+ns[1:], "k"+name[1:], fmt.Sprintf("%032x", i), ann)
	}
	return out
}

// TestIndexSize: how many keys one index Secret holds, with names as long as
// team-007/ci-key-0001, with and without both annotations, and with the longest
// names the API allows (a 63-character namespace, a 253-character name); more keys
// than fit is an error naming the count, and no index.
func TestIndexSize(t *testing.T) {
	for _, tc := range []struct {
		name             string
		nsLen, nameLen   int
		annotated        bool
		fits, doesNotFit int
	}{
		{"typical names", 8, 11, false, 9000, 12000},
		{"typical names, both annotations", 8, 11, true, 6500, 8000},
		{"longest names, both annotations", 63, 253, true, 2300, 2500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, keys, err := Build(manyKeys(tc.fits, tc.nsLen, tc.nameLen, tc.annotated))
			if err != nil || keys != tc.fits {
				t.Fatalf("%d keys: %d keys, %v", tc.fits, keys, err)
			}
			perKey := float64(len(data)) / float64(keys)
			t.Logf("%s: %.0f bytes a key, %d keys in %d bytes", tc.name, perKey, int(float64(MaxBytes)/perKey), MaxBytes)
			data, keys, err = Build(manyKeys(tc.doesNotFit, tc.nsLen, tc.nameLen, tc.annotated))
			if err == nil || data != nil || !strings.Contains(err.Error(), fmt.Sprintf("%d key Secrets", tc.doesNotFit)) {
				t.Errorf("%d keys: %d bytes, %v; want an error naming the count", tc.doesNotFit, len(data), err)
			}
			if keys != tc.doesNotFit {
				t.Errorf("keys = %d, want %d", keys, tc.doesNotFit)
			}
		})
	}
}
