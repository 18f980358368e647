package tenancy

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/gateway/fairqueue"
)

func TestMayUse(t *testing.T) {
	a := Identity{Namespace: "team-a", Name: "k"}
	for _, tc := range []struct {
		name      string
		id        Identity
		namespace string
		granted   []string
		want      bool
	}{
		{"own namespace", a, "team-a", nil, true},
		{"another namespace", a, "team-b", nil, false},
		{"another namespace granting others", a, "team-b", []string{"team-c"}, false},
		{"another namespace granting it", a, "team-b", []string{"team-c", "team-a"}, true},
		{"another namespace granting every namespace", a, "team-b", []string{AllNamespaces}, true},
		{"a prefix is not a grant", a, "team-b", []string{"team"}, false},
		{"admin", Identity{Admin: true}, "team-b", nil, true},
		{"no identity", Identity{}, "team-b", []string{AllNamespaces}, false},
		{"no identity, empty namespace", Identity{}, "", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := MayUse(tc.id, tc.namespace, tc.granted); got != tc.want {
				t.Errorf("MayUse(%+v, %q, %q) = %v, want %v", tc.id, tc.namespace, tc.granted, got, tc.want)
			}
		})
	}
}

func keySecret(ns, name, key string, annotations map[string]string) corev1.Secret {
	return corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Type: SecretType, Data: map[string][]byte{KeyField: []byte(key)}}
}

func TestBuild(t *testing.T) {
	t.Run("secrets", func(t *testing.T) { testBuild(t, func(s corev1.Secret) corev1.Secret { return s }) })
	// What the manager's cache holds: the same keys, the same problems, no key bytes.
	t.Run("redacted", func(t *testing.T) {
		testBuild(t, func(s corev1.Secret) corev1.Secret {
			r := Redact(&s)
			for field, v := range r.Data {
				if field == KeyField || strings.Contains(string(v), string(s.Data[KeyField])) {
					t.Errorf("Redact(%s/%s) kept the key in data[%q]", s.Namespace, s.Name, field)
				}
			}
			return *r
		})
	})
}

func testBuild(t *testing.T, view func(corev1.Secret) corev1.Secret) {
	const (
		keyA = "aaaaaaaaaaaaaaaaaaaaaaaa"
		keyB = "bbbbbbbbbbbbbbbbbbbbbbbb"
	)
	deleting := keySecret("team-c", "gone", "cccccccccccccccccccc", nil)
	deleting.DeletionTimestamp = &metav1.Time{}
	opaque := keySecret("team-c", "opaque", "dddddddddddddddddddd", nil)
	opaque.Type = corev1.SecretTypeOpaque
	secrets := []corev1.Secret{
		keySecret("team-a", "ci", keyA, map[string]string{AnnotationPriority: "batch"}),
		keySecret("team-b", "app", "  "+keyB+"\n", nil), // kubectl --from-file keeps the newline
		keySecret("team-b", "short", "tooshort", nil),
		keySecret("team-b", "prio", "eeeeeeeeeeeeeeeeeeee", map[string]string{AnnotationPriority: "urgent"}),
		keySecret("team-b", "own", "gggggggggggggggggggg", map[string]string{AnnotationCacheScope: CacheScopeKey}),
		keySecret("team-b", "scope", "hhhhhhhhhhhhhhhhhhhh", map[string]string{AnnotationCacheScope: "user"}),
		keySecret("team-a", "twin1", "ffffffffffffffffffff", nil),
		keySecret("team-b", "twin2", "ffffffffffffffffffff", nil),
		deleting, opaque,
	}
	for i := range secrets {
		secrets[i] = view(secrets[i])
	}
	keys, problems := Build(secrets)
	for _, tc := range []struct {
		key  string
		want Identity
		ok   bool
	}{
		{keyA, Identity{Namespace: "team-a", Name: "ci", Priority: fairqueue.Batch}, true},
		{keyB, Identity{Namespace: "team-b", Name: "app"}, true},
		{"tooshort", Identity{}, false},
		{"eeeeeeeeeeeeeeeeeeee", Identity{}, false},
		{"gggggggggggggggggggg", Identity{Namespace: "team-b", Name: "own", CachePerKey: true}, true},
		{"hhhhhhhhhhhhhhhhhhhh", Identity{}, false},
		{"ffffffffffffffffffff", Identity{}, false},
		{"cccccccccccccccccccc", Identity{}, false},
		{"dddddddddddddddddddd", Identity{}, false},
		{"", Identity{}, false},
	} {
		got, ok := keys.Lookup(tc.key)
		if ok != tc.ok || got != tc.want {
			t.Errorf("Lookup(%q) = %+v, %v; want %+v, %v", tc.key, got, ok, tc.want, tc.ok)
		}
	}
	if keys.Len() != 3 {
		t.Errorf("Len() = %d, want 3", keys.Len())
	}
	var got []string
	for _, p := range problems {
		got = append(got, p.String())
		if strings.Contains(p.Reason, "ffff") || strings.Contains(p.Reason, "tooshort") {
			t.Errorf("a problem shows the key: %s", p)
		}
	}
	want := []string{
		"team-b/short: data.key must hold a key of at least 16 characters",
		"team-b/prio: annotation macfleet.dev/priority",
		`team-b/scope: annotation macfleet.dev/cache-scope: "user" is neither`,
		"team-b/twin2: the same key is also in team-a/twin1",
	}
	if len(got) != len(want) {
		t.Fatalf("problems %q, want %d of them", got, len(want))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %d = %q, want it to start with %q", i, got[i], want[i])
		}
	}
	var nilKeys *Keys
	if _, ok := nilKeys.Lookup(keyA); ok || nilKeys.Len() != 0 {
		t.Error("a nil snapshot holds keys")
	}
}

func TestCachePartition(t *testing.T) {
	for _, tc := range []struct {
		id   Identity
		want string
	}{
		{Identity{Admin: true}, ""},
		{Identity{}, ""},
		{Identity{Namespace: "team-a", Name: "ci"}, "team-a"},
		{Identity{Namespace: "team-a", Name: "app"}, "team-a"},
		{Identity{Namespace: "team-a", Name: "ci", CachePerKey: true}, "team-a/ci"},
		{Identity{Namespace: "team-b", Name: "ci"}, "team-b"},
	} {
		if got := tc.id.CachePartition(); got != tc.want {
			t.Errorf("%+v.CachePartition() = %q, want %q", tc.id, got, tc.want)
		}
	}
}
