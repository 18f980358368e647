package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/test/support/browsertest"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestConsoleScopedPerTeamOnFleet opens the console of a gateway with an admin key and
// two teams' keys on the local fleet, where team B runs a private deployment and one
// granted to team A on the real Macs. Team A's key, on every page over HTTP and in the
// browser's playground, gets nothing of team B's private deployment, replicas, keys or
// usage, and no Mac; the playground streams from team A's own model. The admin key
// sees both teams and the Macs.
func TestConsoleScopedPerTeamOnFleet(t *testing.T) {
	bin := browsertest.Chromium(t)
	nsA, nsB := testenv.NewNamespace(t, fleet.Client), testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(nsA, "a-chat", 1))
	create(t, deployment(nsB, "b-private", 1))
	create(t, deployment(nsB, "b-granted", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Access = &v1alpha1.Access{Namespaces: []string{nsA}}
	}))
	adminKey, keyA, keyB := newKey(t), newKey(t), newKey(t)
	adminFile := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(adminFile, []byte(adminKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base, _ := runGateway(t, gateway.Config{TenantKeys: true, APIKeysFile: adminFile}, testr.New(t))
	createKey(t, nsA, "team-a-ci", keyA)
	createKey(t, nsB, "team-b-ci-secret-name", keyB)
	waitReady(t, nsA, "a-chat", 1, 3*time.Minute)
	waitReady(t, nsB, "b-granted", 1, 3*time.Minute)
	private := waitReady(t, nsB, "b-private", 1, 3*time.Minute)
	day := time.Now().UTC().Format("2006-01-02")
	for ns, u := range map[string]v1alpha1.KeyUsage{
		nsA: {Key: "team-a-ci", Deployment: nsB + "/b-granted", Requests: 2, InputTokens: 1234, OutputTokens: 5},
		nsB: {Key: "team-b-ci-secret-name", Deployment: nsB + "/b-private", Requests: 9, InputTokens: 987654, OutputTokens: 5},
	} {
		create(t, &v1alpha1.TokenUsage{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gw-0-" + day},
			Spec: v1alpha1.TokenUsageSpec{Gateway: "gw-0", Day: day, Usage: []v1alpha1.KeyUsage{u}}})
	}
	var replicasB v1alpha1.ModelReplicaList
	if err := fleet.Client.List(t.Context(), &replicasB, client.InNamespace(nsB)); err != nil {
		t.Fatal(err)
	}
	secrets := []string{"b-private", "team-b-ci-secret-name", "987654", localfleetNode(0), localfleetNode(1)}
	if ep := private[0].Status.Endpoint; ep != "" {
		secrets = append(secrets, ep)
	}
	for _, r := range replicasB.Items {
		secrets = append(secrets, r.Name)
	}
	testenv.Eventually(t, keyWait, 50*time.Millisecond, func() (bool, string) {
		code := rawGet(t, base+"/v1/models", keyA)
		return code == http.StatusOK, fmt.Sprintf("team A's key: %d", code)
	})

	ui := base + "/ui"
	for path, want := range map[string]int{"/": http.StatusForbidden, "/models": http.StatusOK, "/unloads": http.StatusOK,
		"/playground": http.StatusOK, "/usage": http.StatusOK, "/usage?namespace=" + nsB: http.StatusForbidden} {
		resp, body := testenv.Do(t, http.MethodGet, ui+path, nil, "Authorization", "Bearer "+keyA)
		if resp.StatusCode != want {
			t.Errorf("GET %s with team A's key: %d, want %d", path, resp.StatusCode, want)
		}
		for _, s := range secrets {
			if strings.Contains(string(body), s) {
				t.Errorf("GET %s with team A's key shows %q", path, s)
			}
		}
	}
	for path, want := range map[string][]string{"/": {localfleetNode(0), localfleetNode(1)}, "/models": {"b-private", private[0].Name},
		"/usage?namespace=" + nsB: {"team-b-ci-secret-name", "987654"}} {
		resp, body := testenv.Do(t, http.MethodGet, ui+path, nil, "Authorization", "Bearer "+adminKey)
		for _, w := range want {
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), w) {
				t.Errorf("GET %s with the admin key: %d, lacks %q", path, resp.StatusCode, w)
			}
		}
	}

	// The browser: team A's playground offers its model and the granted one, and
	// streams an answer from its own.
	art := browsertest.ArtifactDir(t)
	ctx := browsertest.New(t, bin, 4*time.Minute)
	if err := chromedp.Do(ctx, chromedp.Navigate(ui+"/playground"), chromedp.WaitVisible(chromedp.CSS(`#key`)),
		chromedp.SendKeys(chromedp.CSS(`#key`), keyA), chromedp.Click(chromedp.CSS(`form.login button`)),
		chromedp.WaitVisible(chromedp.CSS(`#pg-model`))); err != nil {
		t.Fatalf("signing in with team A's key: %v", err)
	}
	options, err := browsertest.PlaygroundModels(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a-chat", "b-granted"}; !slices.Equal(options, want) {
		t.Errorf("the playground offers team A %v, want %v", options, want)
	}
	browsertest.Playground(t, ctx, ui+"/playground", "a-chat", art, "team-a-playground.png")
	html, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets {
		if strings.Contains(html, s) {
			t.Errorf("team A's playground shows %q", s)
		}
	}
}
