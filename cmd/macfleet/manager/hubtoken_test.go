package manager_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/hubtoken"
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/cmd/macfleet/manager"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestManagerEstimatesAGatedModelWithTheHubTokenSecret: the manager, built as
// `macfleet manager` builds it, reads the header of a model stored in three parts in
// a gated repository (a hub double on loopback that answers 401 without its token)
// with the token of the fleet's Secret macfleet-system/macfleet-hub-token.
func TestManagerEstimatesAGatedModelWithTheHubTokenSecret(t *testing.T) {
	c, ctx := env.Client, t.Context()
	parts, err := ggufsynth.WriteParts(filepath.Join(t.TempDir(), "m"), ggufsynth.Tiny(), 3)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var auth []string
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer hf_fleet" {
			http.Error(w, "gated", http.StatusUnauthorized)
			return
		}
		http.ServeFile(w, r, filepath.Join(filepath.Dir(parts[0]), filepath.Base(r.URL.Path)))
	}))
	defer hub.Close()

	ns := testenv.NewNamespace(t, c)
	allowLoopbackHub(t, c, ns)
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: mfv1.SystemNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: mfv1.SystemNamespace, Name: hubtoken.SecretName},
		Data: map[string][]byte{hubtoken.Key: []byte("hf_fleet")}}
	if err := c.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), sec) })
	startManager(t, manager.Config{RestConfig: env.Config, Resolver: modelsource.Resolver{HFEndpoint: hub.URL},
		MetricsListener: loopback(t), ProbeListener: loopback(t)})

	md := &mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gated"},
		Spec: mfv1.ModelDeploymentSpec{Model: mfv1.ModelSource{Source: "hf://org/gated/m-00001-of-00003.gguf"}, Replicas: ptr.To[int32](1)}}
	if err := c.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(md), md); err != nil {
			return false, err.Error()
		}
		return md.Status.EstimatedMemory != nil, fmt.Sprintf("%+v", md.Status.Conditions)
	})
	mu.Lock()
	defer mu.Unlock()
	if len(auth) < 3 || slices.ContainsFunc(auth, func(a string) bool { return a != "Bearer hf_fleet" }) {
		t.Errorf("the hub saw Authorization %q; want the fleet's token on every request, one per part at least", auth)
	}
}

// allowLoopbackHub lets namespace ns use hf:// sources of a hub on loopback, and puts
// the cluster's SourcePolicy back at the test's end.
func allowLoopbackHub(t *testing.T, c client.Client, ns string) {
	t.Helper()
	ctx := t.Context()
	p := &mfv1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: mfv1.SourcePolicyName}}
	err := c.Get(ctx, client.ObjectKeyFromObject(p), p)
	existed := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	before := p.Spec.DeepCopy()
	p.Spec.Rules = append(p.Spec.Rules, mfv1.SourcePolicyRule{Namespaces: []string{ns}, Registries: []mfv1.SourceRegistry{mfv1.RegistryHF}})
	p.Spec.AllowedNetworks = append(p.Spec.AllowedNetworks, "127.0.0.0/8")
	if existed {
		err = c.Update(ctx, p)
	} else {
		err = c.Create(ctx, p)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !existed {
			_ = c.Delete(context.Background(), p)
			return
		}
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(p), p); err == nil {
			p.Spec = *before
			_ = c.Update(context.Background(), p)
		}
	})
}
