package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// serviceAccountToken mints a token of ServiceAccount ns/name with the TokenRequest
// API, as the kubelet does for a projected volume; no audience means the API server's.
func serviceAccountToken(t *testing.T, ns, name string, audiences ...string) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(fleet.Env.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), name,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: audiences}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("minting a token of %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// call sends method path with the bearer token to base, with an optional JSON body
// and headers, and returns the status and body.
func call(t *testing.T, base, method, path, token, body string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	hc := anonymousClient(t)
	if token == asGateway {
		hc = fleet.AgentHTTP
	} else {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// tenantCall posts body with token to url as a workload of ns does: checking the
// agent's certificate against the fleet CA bundle in ns (ConfigMap macfleet-ca, which
// the manager publishes in every namespace with a ModelDeployment), by chain, not by
// host name (it names a Mac).
func tenantCall(t *testing.T, ns, url, token, body string) (int, string) {
	t.Helper()
	var bundle []byte
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		cm := &corev1.ConfigMap{}
		err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: v1alpha1.CABundleConfigMap}, cm)
		bundle = []byte(cm.Data[v1alpha1.CABundleKey])
		return err == nil && len(bundle) > 0, fmt.Sprintf("the CA bundle in %s: %v", ns, err)
	})
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		t.Fatalf("the CA bundle in %s holds no certificate", ns)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true, //nolint:gosec // the chain is checked below
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no certificate")
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots})
			return err
		}}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// asGateway, as call's token, calls with the client certificate of a gateway
// (fleet.AgentHTTP) and no bearer token: the whole agent API.
const asGateway = "\x00as-gateway"

// anonymousClient calls agents over TLS (checking their fleet certificate) without a
// client certificate, as a tenant's workload does; plain http:// URLs (gateways) too.
var anonymousClient = func() func(testing.TB) *http.Client {
	var once sync.Once
	var hc *http.Client
	var err error
	return func(t testing.TB) *http.Client {
		t.Helper()
		once.Do(func() { hc, err = fleet.AgentClient(context.Background(), nil) })
		if err != nil {
			t.Fatal(err)
		}
		return hc
	}
}()

func chatBody(model string) string { return requestBody("/v1/chat/completions", model) }

// requestBody is a minimal valid request for model on an OpenAI or Anthropic path.
func requestBody(path, model string) string {
	switch path {
	case "/v1/responses":
		return `{"model":"` + model + `","max_output_tokens":1,"input":"hi"}`
	case "/v1/embeddings":
		return `{"model":"` + model + `","input":"hi"}`
	}
	return `{"model":"` + model + `","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
}

// TestInClusterCallersAreScoped is a workload of team A calling with its
// ServiceAccount's token, projected for the fleet's audience, through the gateway and
// straight to the agents of team B's Service (their addresses from its
// EndpointSlice), as in-cluster clients do. Team A's token:
//   - reaches team A's deployment through the gateway, and team B's token team B's
//     own Service;
//   - gets team B's deployment answered exactly like a model that does not exist, on
//     the gateway and on team B's Service, by name, qualified name or the replica
//     header, and does not see it in /v1/models;
//   - never reaches an agent's admin API (unload, cache clear, status, metrics);
//   - minted for another audience, is a 401 everywhere;
//   - reaches team B's deployment on both paths once team B grants team A
//     (spec.access);
//   - stops within the review cache's TTL once its ServiceAccount is deleted.
func TestInClusterCallersAreScoped(t *testing.T) {
	nsA, nsB := testenv.NewNamespace(t, fleet.Client), testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(nsA, "chat", 1))
	create(t, deployment(nsB, "secret", 1))
	for _, ns := range []string{nsA, nsB} {
		create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app"}})
	}
	base, _ := inProcessGateway(t, gateway.Config{TenantKeys: true}, testr.New(t))
	waitReady(t, nsA, "chat", 1, 3*time.Minute)
	replicasB := waitReady(t, nsB, "secret", 1, 3*time.Minute)
	agentsB := sliceAddresses(t, nsB, "secret", 1)
	agentB := localfleet.AgentURL(agentsB[0])
	tokA := serviceAccountToken(t, nsA, "app", satoken.DefaultAudience)
	tokB := serviceAccountToken(t, nsB, "app", satoken.DefaultAudience)

	// Team A's workload reaches its own deployment through the gateway, and team B's
	// workload its own Service.
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		code, body := call(t, base, http.MethodPost, "/v1/chat/completions", tokA, chatBody("chat"))
		return code == http.StatusOK, fmt.Sprintf("team A's token on its own deployment through the gateway: %d %s", code, body)
	})
	if code, body := call(t, agentB, http.MethodPost, "/v1/chat/completions", tokB, chatBody("secret")); code != http.StatusOK {
		t.Fatalf("team B's token on its own Service: %d %s", code, body)
	}
	// As team B's workload checks the agent: against the CA bundle the manager
	// published in team B's namespace.
	if code, body := tenantCall(t, nsB, agentB+"/v1/chat/completions", tokB, chatBody("secret")); code != http.StatusOK {
		t.Fatalf("team B's token on its own Service, the agent checked against the bundle in %s: %d %s", nsB, code, body)
	}

	// Team A's token on team B's deployment: the answer of a model that does not exist.
	const missing = "no-such-model-anywhere"
	hidden := func(where, base string) {
		t.Helper()
		for _, path := range []string{"/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/embeddings"} {
			wantCode, wantBody := call(t, base, http.MethodPost, path, tokA, requestBody(path, missing))
			if wantCode != http.StatusNotFound {
				t.Fatalf("%s %s: a missing model: %d %s", where, path, wantCode, wantBody)
			}
			for _, model := range []string{"secret", nsB + "/secret"} {
				code, got := call(t, base, http.MethodPost, path, tokA, requestBody(path, model))
				if code != wantCode || strings.ReplaceAll(got, model, missing) != wantBody {
					t.Errorf("%s %s: team A's token on %q: %d %s\nwant it answered as a missing model: %d %s", where, path, model, code, got,
						wantCode, strings.ReplaceAll(wantBody, missing, model))
				}
			}
		}
	}
	hidden("the gateway", base)
	hidden("team B's Service", agentB)
	// Naming team B's replica, as the gateway does, is no way around it.
	replicaKey := nsB + "/" + replicasB[0].Name
	if code, body := call(t, agentB, http.MethodPost, "/v1/chat/completions", tokA, chatBody("secret"),
		v1alpha1.HeaderReplica, replicaKey); code != http.StatusNotFound || strings.Contains(body, `"choices"`) {
		t.Errorf("team A's token naming team B's replica %s: %d %s, want 404", replicaKey, code, body)
	}
	for where, b := range map[string]string{"the gateway": base, "team B's Service": agentB} {
		if code, body := call(t, b, http.MethodGet, "/v1/models", tokA, ""); code != http.StatusOK || strings.Contains(body, "secret") {
			t.Errorf("%s: team A's /v1/models: %d %s, want 200 without team B's deployment", where, code, body)
		}
		if code, body := call(t, b, http.MethodGet, "/v1/models/secret", tokA, ""); code != http.StatusNotFound {
			t.Errorf("%s: team A's GET /v1/models/secret: %d %s, want 404", where, code, body)
		}
	}

	// The admin API takes only a gateway's or the manager's certificate: not team A's token, not even team B's own.
	admin := []struct{ method, path string }{
		{http.MethodPost, "/api/models/" + url.PathEscape(replicaKey) + "/unload"},
		{http.MethodPost, "/api/cache/clear"},
		{http.MethodGet, "/api/status"},
		{http.MethodGet, "/metrics"},
	}
	for _, tok := range []string{tokA, tokB} {
		for _, a := range admin {
			if code, body := call(t, agentB, a.method, a.path, tok, ""); code != http.StatusUnauthorized {
				t.Errorf("a tenant's token on the admin API %s %s: %d %s, want 401", a.method, a.path, code, body)
			}
		}
	}
	if code, body := call(t, agentB, http.MethodGet, "/api/status", asGateway, ""); code != http.StatusOK {
		t.Errorf("a gateway's certificate on /api/status: %d %s", code, body)
	}
	// Team B's model is still loaded: nothing was unloaded.
	if code, body := call(t, agentB, http.MethodPost, "/v1/chat/completions", tokB, chatBody("secret")); code != http.StatusOK {
		t.Errorf("team B's token after team A's attempts: %d %s", code, body)
	}

	// A token of team A's ServiceAccount minted for the API server's audience.
	wrong := serviceAccountToken(t, nsA, "app")
	for where, b := range map[string]string{"the gateway": base, "team B's Service": agentB} {
		code, body := call(t, b, http.MethodPost, "/v1/chat/completions", wrong, chatBody("chat"))
		if code != http.StatusUnauthorized || !strings.Contains(body, "invalid ServiceAccount token") {
			t.Errorf("%s: a token for another audience: %d %s, want 401 invalid ServiceAccount token", where, code, body)
		}
	}

	// The agent counted how it answered the tokens (read as a gateway): a token for
	// another audience is refused before any review (unfit).
	code, metrics := call(t, agentB, http.MethodGet, "/metrics", asGateway, "")
	for _, result := range []string{satoken.ResultCached, satoken.ResultAccepted, satoken.ResultUnfit} {
		if line := `macfleet_agent_token_reviews_total{result="` + result + `"} `; code != http.StatusOK || !strings.Contains(metrics, line) {
			t.Errorf("the agent's /metrics (%d) has no %s", code, line)
		}
	}

	// tokenOnB waits until team A's token on team B's deployment gets want on both
	// paths, within timeout.
	tokenOnB := func(want int, timeout time.Duration, what string) {
		t.Helper()
		for where, b := range map[string]string{"the gateway": base, "team B's Service": agentB} {
			testenv.Eventually(t, timeout, 100*time.Millisecond, func() (bool, string) {
				code, body := call(t, b, http.MethodPost, "/v1/chat/completions", tokA, chatBody(nsB+"/secret"))
				return code == want, fmt.Sprintf("%s: team A's token %s: %d %s, want %d", where, what, code, body, want)
			})
		}
	}
	setAccess := func(access string) {
		t.Helper()
		if err := fleet.Client.Patch(t.Context(), &v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: nsB, Name: "secret"}},
			client.RawPatch(types.MergePatchType, []byte(`{"spec":{"access":`+access+`}}`))); err != nil {
			t.Fatal(err)
		}
	}

	// Team B grants team A its deployment: both paths let team A in; taken back, they
	// refuse it again.
	grant := `{"namespaces":["` + nsA + `"]}`
	setAccess(grant)
	granted := time.Now()
	tokenOnB(http.StatusOK, 30*time.Second, "on the granted deployment")
	t.Logf("the grant reached the gateway and the agent after %v", time.Since(granted).Round(time.Millisecond))
	setAccess("null")
	tokenOnB(http.StatusNotFound, 30*time.Second, "after the grant was taken back")
	setAccess(grant)
	tokenOnB(http.StatusOK, 30*time.Second, "granted again")
	// The grants moved no replica: the same one serves.
	if reps := waitReady(t, nsB, "secret", 1, time.Minute); reps[0].Name != replicasB[0].Name {
		t.Errorf("the grant replaced replica %s with %s", replicasB[0].Name, reps[0].Name)
	}

	// Team A's ServiceAccount is deleted: its token stops within the cache's TTL.
	if err := fleet.Client.Delete(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: nsA, Name: "app"}}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	tokenOnB(http.StatusUnauthorized, satoken.DefaultTTL+5*time.Second, "of the deleted ServiceAccount")
	t.Logf("the deleted ServiceAccount's token was refused on both paths after %v (cache TTL %v)",
		time.Since(deleted).Round(time.Millisecond), satoken.DefaultTTL)
}
