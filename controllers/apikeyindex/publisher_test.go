package apikeyindex_test

import (
	"crypto/sha256"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/apikeyindex"
	"github.com/macfleet/macfleet/controllers/apikeyindex/apikeyindextest"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// One API server for the package, started on first use, so that the pure tests run
// without one.
var shared = testenv.NewLazy()

func TestMain(m *testing.M) { os.Exit(shared.Run(m)) }

// indexKey is the index Secret.
var indexKey = types.NamespacedName{Namespace: mfv1.SystemNamespace, Name: mfv1.APIKeyIndexSecret}

// index is the entries of the index Secret, or why there are none.
func index(t *testing.T, e *testenv.Env) ([]tenancy.IndexEntry, string) {
	var s corev1.Secret
	if err := e.Client.Get(t.Context(), indexKey, &s); err != nil {
		return nil, err.Error()
	}
	ix, err := tenancy.ParseIndex(s.Data[tenancy.IndexField])
	if err != nil {
		return nil, err.Error()
	}
	return ix.Keys, fmt.Sprintf("%d entries: %s", len(ix.Keys), s.Data[tenancy.IndexField])
}

// systemNamespace makes macfleet-system, where the index goes.
func systemNamespace(t *testing.T, e *testenv.Env) {
	t.Helper()
	if err := e.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: mfv1.SystemNamespace}}); err != nil &&
		!apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// TestPublisherLeavesAnotherSecretAlone: a Secret of another type under the index's
// name is an error naming the fix, and is left as it is.
func TestPublisherLeavesAnotherSecretAlone(t *testing.T) {
	e := shared.Get(t)
	ctx := t.Context()
	systemNamespace(t, e)
	// No publisher runs here; an index of another test's goes first.
	if err := e.Client.Delete(ctx, apikeyindex.Desired(nil)); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	squatter := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: indexKey.Namespace, Name: indexKey.Name},
		Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"x": []byte("y")}}
	if err := e.Client.Create(ctx, squatter); err != nil {
		t.Fatal(err)
	}
	p := &apikeyindex.Publisher{Client: e.Client, Reader: e.Client, Resync: 200 * time.Millisecond}
	if _, err := p.Reconcile(ctx, ctrl.Request{}); err == nil || !strings.Contains(err.Error(), "delete it") {
		t.Errorf("an Opaque Secret under the index's name: %v, want an error naming the fix", err)
	}
	if err := e.Client.Get(ctx, indexKey, squatter); err != nil || squatter.Type != corev1.SecretTypeOpaque {
		t.Fatalf("the Opaque Secret: %v, type %q; want it left alone", err, squatter.Type)
	}
	if err := e.Client.Delete(ctx, squatter); err != nil {
		t.Fatal(err)
	}
}

// TestPublisher runs the publisher as the manager does against a real API server: the
// index exists once it starts, with no key Secret in the cluster; a key Secret created,
// annotated and deleted is in it, changed and gone; the index holds no key; an index
// deleted or overwritten by hand is restored within a resync.
func TestPublisher(t *testing.T) {
	e := shared.Get(t)
	ctx := t.Context()
	stop, err := apikeyindextest.Start(e, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	const wait, poll = 30 * time.Second, 10 * time.Millisecond
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		keys, msg := index(t, e)
		return keys != nil && len(keys) == 0, "the index at start: " + msg
	})

	ns := testenv.NewNamespace(t, e.Client)
	const key = "a-team-key-0123456789abcdef"
	sum := sha256.Sum256([]byte(key))
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ci"}, Type: tenancy.SecretType,
		Data: map[string][]byte{tenancy.KeyField: []byte(key)}}
	opaque := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "database"}, Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{tenancy.KeyField: []byte("not-a-key-0123456789abcdef")}}
	for _, obj := range []*corev1.Secret{opaque, s} {
		if err := e.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		keys, msg := index(t, e)
		return len(keys) == 1 && keys[0].Namespace == ns && keys[0].Name == "ci" && string(keys[0].SHA256) == string(sum[:]),
			"the index with one key Secret: " + msg
	})
	var raw corev1.Secret
	if err := e.Client.Get(ctx, indexKey, &raw); err != nil {
		t.Fatal(err)
	}
	if b := raw.Data[tenancy.IndexField]; strings.Contains(string(b), key) || strings.Contains(string(b), "not-a-key") {
		t.Errorf("the index holds a Secret's key: %s", b)
	}

	s.Annotations = map[string]string{tenancy.AnnotationPriority: "batch"}
	if err := e.Client.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		keys, msg := index(t, e)
		return len(keys) == 1 && keys[0].Priority != nil && *keys[0].Priority == "batch", "the annotated key: " + msg
	})

	// By hand: deleted, then overwritten; restored each time.
	if err := e.Client.Delete(ctx, &raw); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		keys, msg := index(t, e)
		return len(keys) == 1, "the index deleted by hand: " + msg
	})
	if err := e.Client.Get(ctx, indexKey, &raw); err != nil {
		t.Fatal(err)
	}
	raw.Data = map[string][]byte{tenancy.IndexField: []byte(`{"version":1,"keys":[]}`)}
	if err := e.Client.Update(ctx, &raw); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		keys, msg := index(t, e)
		return len(keys) == 1, "the index emptied by hand: " + msg
	})

	if err := e.Client.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		keys, msg := index(t, e)
		return keys != nil && len(keys) == 0, "the index after the key Secret's deletion: " + msg
	})
}
