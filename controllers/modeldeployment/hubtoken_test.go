package modeldeployment

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/hubtoken"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/internal/modelsource"
)

// gatedHub is a hub double on loopback serving a model stored in three parts from a
// gated repository (/hub/org/gated/resolve/main/m-0000i-of-00003.gguf): 401 without
// a token, 403 with another than its own. It records each request's Authorization.
type gatedHub struct {
	*httptest.Server
	parts []string
	mu    sync.Mutex
	auth  []string
}

func newGatedHub(t *testing.T, token string) *gatedHub {
	t.Helper()
	parts, err := ggufsynth.WriteParts(filepath.Join(t.TempDir(), "m"), ggufsynth.Tiny(), 3)
	if err != nil {
		t.Fatal(err)
	}
	h := &gatedHub{parts: parts}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.auth = append(h.auth, r.Header.Get("Authorization"))
		h.mu.Unlock()
		dir, name := filepath.Split(r.URL.Path)
		switch {
		case dir != "/hub/org/gated/resolve/main/":
			http.NotFound(w, r)
		case r.Header.Get("Authorization") == "":
			http.Error(w, "gated", http.StatusUnauthorized)
		case r.Header.Get("Authorization") != "Bearer "+token:
			http.Error(w, "no access", http.StatusForbidden)
		default:
			http.ServeFile(w, r, filepath.Join(filepath.Dir(parts[0]), filepath.Base(name)))
		}
	}))
	t.Cleanup(h.Close)
	return h
}

// seen is every Authorization the hub saw since the last call.
func (h *gatedHub) seen() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.auth
	h.auth = nil
	return out
}

// putHubToken creates or replaces the fleet's hub token Secret; the test deletes it at
// its end.
func putHubToken(t *testing.T, c client.Client, token string) {
	t.Helper()
	ctx := t.Context()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.SystemNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: v1alpha1.SystemNamespace, Name: hubtoken.SecretName},
		Data: map[string][]byte{hubtoken.Key: []byte(token)}}
	err := c.Create(ctx, sec)
	if apierrors.IsAlreadyExists(err) {
		err = c.Update(ctx, sec)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), sec) })
}

// TestEstimateOfAGatedRepositoryReadsWithTheHubToken: a deployment of a model stored
// in parts in a gated repository is MemoryEstimateFailed naming the Secret to create
// while the fleet has no hub token, and says the token has no access while it has
// another; once the Secret holds a token with access, the deployment is estimated
// (every part's header read with it) within the token's TTL. An http(s):// source
// never gets the token.
func TestEstimateOfAGatedRepositoryReadsWithTheHubToken(t *testing.T) {
	hub := newGatedHub(t, "hf_gated")
	f := newFixture(t)
	tokens := &hubtoken.Source{Clientset: kubernetes.NewForConfigOrDie(apiServer(t).Config), TTL: 100 * time.Millisecond}
	f.start(&Reconciler{Resolver: &modelsource.Resolver{HFEndpoint: hub.URL + "/hub"}, HubToken: tokens.Token,
		HubTokenRetry: 200 * time.Millisecond, EstimateRetryInitial: time.Hour, EstimateRetryMax: time.Hour})
	const source = "hf://org/gated/m-00001-of-00003.gguf"
	first := hub.URL + "/hub/org/gated/resolve/main/m-00001-of-00003.gguf"
	f.create(newDeployment("gated", source, 1, ""))
	waitScheduled := func(want string) {
		t.Helper()
		f.waitStatus("gated", func(md *v1alpha1.ModelDeployment) (bool, string) {
			got := condition(md, v1alpha1.DeploymentScheduled)
			return got == want, got
		})
	}
	waitScheduled("False/" + v1alpha1.ReasonEstimateFailed + ": estimating the memory of " + source + ": GET " + first +
		": 401 Unauthorized: a gated or private repository needs the fleet's hub token: create the Secret " +
		"macfleet-system/macfleet-hub-token with the token under the key token " +
		"(kubectl -n macfleet-system create secret generic macfleet-hub-token --from-literal=token=hf_…)")
	if reps := f.replicas(); len(reps) != 0 {
		t.Fatalf("replicas %v created without a reservation", names(reps))
	}

	putHubToken(t, f.c, "hf_other")
	waitScheduled("False/" + v1alpha1.ReasonEstimateFailed + ": estimating the memory of " + source + ": GET " + first +
		": 403 Forbidden: the fleet's hub token (the Secret macfleet-system/macfleet-hub-token) has no access to this repository: " +
		"accept its terms on the hub with the token's account, or store a token that has access")

	putHubToken(t, f.c, "hf_gated")
	res, err := estimate.Estimate(t.Context(), estimate.Params{Path: hub.parts[0], ContextLength: 4096, Parallel: 1})
	if err != nil {
		t.Fatal(err)
	}
	md := f.waitStatus("gated", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.EstimatedMemory != nil && md.Status.Replicas == 1, condition(md, v1alpha1.DeploymentScheduled)
	})
	if got, want := md.Status.EstimatedMemory.String(), roundUpMiB(res.Total).String(); got != want {
		t.Errorf("estimatedMemory %s, want %s (the three parts' estimate)", got, want)
	}
	hub.seen()

	// The same file by its URL: the hub's refusal as it is, and no token sent.
	f.create(newDeployment("by-url", first, 1, ""))
	f.waitStatus("by-url", func(md *v1alpha1.ModelDeployment) (bool, string) {
		got := condition(md, v1alpha1.DeploymentScheduled)
		return got == "False/"+v1alpha1.ReasonEstimateFailed+": estimating the memory of "+first+": GET "+first+": 401 Unauthorized", got
	})
	for _, a := range hub.seen() {
		if a != "" {
			t.Errorf("an http(s):// source's estimate sent Authorization %q", a)
		}
	}
}

func TestHubRefusal(t *testing.T) {
	hf, _ := modelsource.Parse("hf://org/gated/m.gguf")
	web, _ := modelsource.Parse("https://models.example/m.gguf")
	status := func(code int) error {
		return fmt.Errorf("reading: %w", &modelsource.StatusError{URL: "u", StatusCode: code, Status: fmt.Sprint(code)})
	}
	other := errors.New("unreachable")
	for _, tc := range []struct {
		name      string
		src       modelsource.Source
		sent      bool
		err       error
		want      string // the message's end; empty: err unchanged
		tokenSent bool
	}{
		{"401 without a token", hf, false, status(401), "create the Secret macfleet-system/macfleet-hub-token with the token under the key token " +
			"(kubectl -n macfleet-system create secret generic macfleet-hub-token --from-literal=token=hf_…)", false},
		{"403 without a token", hf, false, status(403), "--from-literal=token=hf_…)", false},
		{"401 with a token", hf, true, status(401), "or store a token that has access", true},
		{"404", hf, true, status(404), "", false},
		{"not a status", hf, false, other, "", false},
		{"another host's 401", web, false, status(401), "", false},
		{"no error", hf, false, nil, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := hubRefusal(tc.src, tc.sent, tc.err)
			var refused *HubRefusedError
			if tc.want == "" {
				if got != tc.err {
					t.Errorf("hubRefusal = %v, want %v unchanged", got, tc.err)
				}
				return
			}
			if !errors.As(got, &refused) || refused.TokenSent != tc.tokenSent || !strings.HasSuffix(got.Error(), tc.want) ||
				!strings.HasPrefix(got.Error(), tc.err.Error()+": ") {
				t.Errorf("hubRefusal = %v, want a HubRefusedError (token sent %v) ending %q", got, tc.tokenSent, tc.want)
			}
		})
	}
}
