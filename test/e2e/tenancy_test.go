package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// keyWait is how soon a key created or deleted with kubectl must take effect.
const keyWait = 5 * time.Second

func newKey(t *testing.T) string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// createKey is `kubectl create secret generic NAME --type=macfleet.dev/api-key
// --from-literal=key=KEY` in ns.
func createKey(t *testing.T, ns, name, key string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: tenancy.SecretType,
		Data: map[string][]byte{tenancy.KeyField: []byte(key)}}
	create(t, s)
	return s
}

// rawPost posts body to the gateway's path with key, returning the status and body.
func rawPost(t *testing.T, base, path, key, body string) (int, string) {
	t.Helper()
	resp := postWithKey(t, base, path, key, body)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestTenantKeysScopeTheFrontDoor runs, as team A's key would, every way to reach team
// B's deployment through the gateway: by qualified name, bare name and alias, on chat
// completions, Responses, Messages and embeddings, through /v1/models, and by waking
// team B's scaled-to-zero deployment. Each is answered as a model that does not exist,
// until team B grants team A its deployment. Keys are Secrets: one created with the
// API works within 5 s, one deleted stops within 5 s, with no restart.
func TestTenantKeysScopeTheFrontDoor(t *testing.T) {
	nsA, nsB := testenv.NewNamespace(t, fleet.Client), testenv.NewNamespace(t, fleet.Client)
	alias := func(md *v1alpha1.ModelDeployment) { md.Spec.Model.Aliases = []string{"team-model"} }
	create(t, deployment(nsA, "chat", 1, alias))
	create(t, deployment(nsB, "secret", 1, alias))
	atZero(t, nsB, "sleepy")
	adminKey := newKey(t)
	adminFile := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(adminFile, []byte(adminKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base, _ := inProcessGateway(t, gateway.Config{TenantKeys: true, APIKeysFile: adminFile}, testr.New(t))
	waitReady(t, nsA, "chat", 1, 3*time.Minute)
	waitReady(t, nsB, "secret", 1, 3*time.Minute)
	// The admin key reaches both once the gateway's table has them.
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		_, errA := chat(t.Context(), keyClient(base, adminKey, 0), nsA+"/chat", false)
		_, errB := chat(t.Context(), keyClient(base, adminKey, 0), nsB+"/secret", false)
		return errA == nil && errB == nil, fmt.Sprintf("admin key: %v; %v", errA, errB)
	})

	keyA, keyB := newKey(t), newKey(t)
	created := time.Now()
	secretA := createKey(t, nsA, "team-a", keyA)
	createKey(t, nsB, "team-b", keyB)
	clientA := keyClient(base, keyA, 0)
	testenv.Eventually(t, keyWait, 50*time.Millisecond, func() (bool, string) {
		_, err := chat(t.Context(), clientA, "chat", false)
		return err == nil, fmt.Sprintf("team A's new key: %v", err)
	})
	t.Logf("a key created as a Secret worked after %v", time.Since(created).Round(time.Millisecond))

	// A name nothing serves: what every hidden deployment must look like.
	const missing = "no-such-model-anywhere"
	bodies := map[string]func(model string) string{
		"/v1/chat/completions": func(m string) string {
			return `{"model":"` + m + `","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
		},
		"/v1/responses": func(m string) string { return `{"model":"` + m + `","max_output_tokens":1,"input":"hi"}` },
		"/v1/messages": func(m string) string {
			return `{"model":"` + m + `","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
		},
		"/v1/embeddings": func(m string) string { return `{"model":"` + m + `","input":"hi"}` },
	}
	for path, body := range bodies {
		wantCode, wantBody := rawPost(t, base, path, keyA, body(missing))
		if wantCode != http.StatusNotFound {
			t.Fatalf("%s for a missing model: %d %s", path, wantCode, wantBody)
		}
		for _, hidden := range []string{nsB + "/secret", "secret", nsB + "/team-model", nsB + "/sleepy", "sleepy"} {
			code, got := rawPost(t, base, path, keyA, body(hidden))
			if code != wantCode || strings.ReplaceAll(got, hidden, missing) != wantBody {
				t.Errorf("team A's key, %s %q: %d %s\nwant it answered as a missing model: %d %s", path, hidden, code, got,
					wantCode, strings.ReplaceAll(wantBody, missing, hidden))
			}
			if strings.Contains(got, nsB) && !strings.Contains(hidden, nsB) {
				t.Errorf("team A's key, %s %q: the answer names team B's namespace: %s", path, hidden, got)
			}
		}
	}
	// The alias both teams serve is team A's own to team A: not ambiguous, not team B's.
	if _, err := chat(t.Context(), clientA, "team-model", false); err != nil {
		t.Errorf("team A's key, its alias team-model: %v", err)
	}
	// /v1/models lists team A's deployment alone; the official client's iterator.
	pager := clientA.Models.ListAutoPaging(t.Context())
	var listed []string
	for pager.Next() {
		listed = append(listed, pager.Current().ID)
	}
	if err := pager.Err(); err != nil || len(listed) != 1 || listed[0] != "chat" {
		t.Errorf("team A's /v1/models: %q, %v; want only [chat]", listed, err)
	}
	for key, want := range map[string]int{adminKey: http.StatusOK, keyA: http.StatusNotFound} {
		if code := rawGet(t, base+"/v1/models/"+nsB+"/secret", key); code != want {
			t.Errorf("GET /v1/models/%s/secret with the %s key: %d, want %d", nsB, map[bool]string{true: "admin", false: "team A"}[key == adminKey], code, want)
		}
	}
	// Team B's scaled-to-zero deployment was not woken by team A's requests above.
	var sleepy v1alpha1.ModelDeployment
	if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: nsB, Name: "sleepy"}, &sleepy); err != nil {
		t.Fatal(err)
	}
	if v, ok := sleepy.Annotations[v1alpha1.AnnotationWakeRequested]; ok {
		t.Errorf("team A's requests woke team B's deployment (%s=%s)", v1alpha1.AnnotationWakeRequested, v)
	}

	// Team B grants team A its deployment: team A's key reaches it, by its qualified name.
	grant, _ := json.Marshal(map[string]any{"spec": map[string]any{"access": map[string]any{"namespaces": []string{nsA}}}})
	if err := fleet.Client.Patch(t.Context(), &v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: nsB, Name: "secret"}},
		client.RawPatch(types.MergePatchType, grant)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, keyWait, 50*time.Millisecond, func() (bool, string) {
		_, err := chat(t.Context(), clientA, nsB+"/secret", false)
		return err == nil, fmt.Sprintf("team A's key on the granted %s/secret: %v", nsB, err)
	})
	// Team B's key still does not reach team A's.
	if code, body := rawPost(t, base, "/v1/chat/completions", keyB, bodies["/v1/chat/completions"](nsA+"/chat")); code != http.StatusNotFound {
		t.Errorf("team B's key on team A's deployment: %d %s, want 404", code, body)
	}

	// Revoked: the Secret deleted, the key stops within 5 s.
	if err := fleet.Client.Delete(context.Background(), secretA); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	testenv.Eventually(t, keyWait, 50*time.Millisecond, func() (bool, string) {
		code, body := rawPost(t, base, "/v1/chat/completions", keyA, bodies["/v1/chat/completions"]("chat"))
		return code == http.StatusUnauthorized, fmt.Sprintf("team A's deleted key: %d %s", code, body)
	})
	t.Logf("a deleted key was refused after %v", time.Since(deleted).Round(time.Millisecond))
}

// postWithKey posts a JSON body to the gateway's path with key.
func postWithKey(t *testing.T, base, path, key, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// rawGet is the status of GET url with key.
func rawGet(t *testing.T, url, key string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
