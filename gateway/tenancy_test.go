package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/runnerapi"
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy"
)

// Keys of the scoping tests: a team-a key, a team-b key, an admin key.
const (
	keyTeamA = "key-of-team-a"
	keyTeamB = "key-of-team-b"
	keyAdmin = "key-of-the-admin"
)

func identifyTest(key string) (tenancy.Identity, bool) {
	switch key {
	case keyTeamA:
		return tenancy.Identity{Namespace: "team-a", Name: "a"}, true
	case keyTeamB:
		return tenancy.Identity{Namespace: "team-b", Name: "b"}, true
	case keyAdmin:
		return tenancy.Identity{Admin: true}, true
	}
	return tenancy.Identity{}, false
}

// scopedGateway serves team-a/chat (alias "shared"), team-b/secret (alias "shared"),
// team-b/granted (spec.access: team-a) and team-b/public (spec.access: "*"), each on
// up, to the keys of identifyTest; opts, when given, are the gateway's options instead.
func scopedGateway(t *testing.T, up string, opts ...Options) *testGateway {
	o := Options{Identify: identifyTest}
	if len(opts) > 0 {
		o = opts[0]
	}
	g := newTestGateway(t, o)
	grant := func(d mfv1.ModelDeployment, ns ...string) mfv1.ModelDeployment {
		d.Spec.Access = &mfv1.Access{Namespaces: ns}
		return d
	}
	deps := []mfv1.ModelDeployment{
		deployment("team-a", "chat", "", "shared"),
		deployment("team-b", "secret", "", "shared"),
		grant(deployment("team-b", "granted", ""), "team-c", "team-a"),
		grant(deployment("team-b", "public", ""), tenancy.AllNamespaces),
	}
	var rs []mfv1.ModelReplica
	for _, d := range deps {
		rs = append(rs, replica(d.Namespace, d.Name+"-r", d.Name, "mac", up, metav1.ConditionTrue))
	}
	g.SetTable(BuildTable(deps, rs, []mfv1.MacNode{node("mac", metav1.ConditionTrue)}))
	return g
}

// TestScopedResolution: a team's key reaches its own deployments and those granted to
// its namespace; every other deployment is, by every name and on every path, answered
// exactly as a model that does not exist.
func TestScopedResolution(t *testing.T) {
	up := newScopedUpstream(t)
	g := scopedGateway(t, up.host())
	for _, tc := range []struct {
		key, model string
		want       int
		wantRoute  string
	}{
		{keyTeamA, "chat", 200, "team-a/chat"},
		{keyTeamA, "team-a/chat", 200, "team-a/chat"},
		{keyTeamA, "shared", 200, "team-a/chat"}, // team-b's alias is not visible: not ambiguous
		{keyTeamA, "secret", 404, ""},
		{keyTeamA, "team-b/secret", 404, ""},
		{keyTeamA, "team-b/shared", 404, ""},
		{keyTeamA, "granted", 200, "team-b/granted"},
		{keyTeamA, "team-b/granted", 200, "team-b/granted"},
		{keyTeamA, "public", 200, "team-b/public"},
		{keyTeamB, "shared", 200, "team-b/secret"},
		{keyTeamB, "chat", 404, ""},
		{keyTeamB, "team-a/chat", 404, ""},
		{keyAdmin, "team-b/secret", 200, "team-b/secret"},
		{keyAdmin, "shared", 400, ""}, // the admin sees both: ambiguous
	} {
		for _, path := range []string{"/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/embeddings"} {
			resp, body := postPath(t, g.url+path, `{"model":"`+tc.model+`","max_tokens":1,"messages":[]}`,
				"Authorization", "Bearer "+tc.key)
			if resp.StatusCode != tc.want {
				t.Errorf("%s %s as %s: %d %s, want %d", path, tc.model, tc.key, resp.StatusCode, body, tc.want)
				continue
			}
			if want := `{"replica":"` + tc.wantRoute + `-r"}`; tc.want == 200 && body != want {
				t.Errorf("%s %s as %s: %s, want %s", path, tc.model, tc.key, body, want)
			}
		}
	}
}

// TestHiddenModelAnswersAsMissing: the 404 for another team's deployment is the 404
// for a name nothing serves, byte for byte, on the OpenAI and Anthropic paths and on
// GET /v1/models/{id}; no other team's namespace or deployment appears in it.
func TestHiddenModelAnswersAsMissing(t *testing.T) {
	up := newScopedUpstream(t)
	g := scopedGateway(t, up.host())
	for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
		for _, hidden := range []string{"secret", "team-b/secret", "team-b/shared"} {
			body := func(model string) string {
				resp, b := postPath(t, g.url+path, `{"model":"`+model+`","max_tokens":1,"messages":[]}`,
					"Authorization", "Bearer "+keyTeamA)
				if resp.StatusCode != http.StatusNotFound {
					t.Errorf("%s %s: %d %s, want 404", path, model, resp.StatusCode, b)
				}
				return strings.ReplaceAll(b, model, "MODEL")
			}
			got, missing := body(hidden), body("nothing-serves-this")
			if got != missing {
				t.Errorf("%s: another team's %q answers\n%s\nbut a missing model\n%s", path, hidden, got, missing)
			}
		}
	}
	get := func(id string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, g.url+"/v1/models/"+id, nil)
		req.Header.Set("Authorization", "Bearer "+keyTeamA)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.ReplaceAll(string(b), id, "MODEL")
	}
	c1, b1 := get("team-b/secret")
	c2, b2 := get("team-b/nothing")
	if c1 != http.StatusNotFound || b1 != b2 || c1 != c2 {
		t.Errorf("GET /v1/models/team-b/secret: %d %s; a missing one: %d %s", c1, b1, c2, b2)
	}
}

// TestListModelsScoped: /v1/models lists what the caller may use, and a served name
// that only one visible deployment has is listed bare.
func TestListModelsScoped(t *testing.T) {
	up := newScopedUpstream(t)
	g := scopedGateway(t, up.host())
	list := func(key string) []string {
		req, _ := http.NewRequest(http.MethodGet, g.url+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got struct{ Data []modelObject }
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range got.Data {
			ids = append(ids, m.Namespace+":"+m.ID)
		}
		return ids
	}
	for key, want := range map[string][]string{
		keyTeamA: {"team-a:chat", "team-b:granted", "team-b:public"},
		keyTeamB: {"team-b:granted", "team-b:public", "team-b:secret"},
		keyAdmin: {"team-a:chat", "team-b:granted", "team-b:public", "team-b:secret"},
	} {
		if got := list(key); !slices.Equal(got, want) {
			t.Errorf("/v1/models as %s: %q, want %q", key, got, want)
		}
	}
}

func newScopedUpstream(t *testing.T) *upstream {
	return newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) { okJSON(w, r) })
}

// TestCallerHeadersAreTheGateways: the agent learns the caller's prompt cache
// partition from the gateway alone. A key's own namespace is sent whatever the client
// forges; an admin key's partition is the shared one (no header); no X-Macfleet-
// header the gateway sets passes from a client.
func TestCallerHeadersAreTheGateways(t *testing.T) {
	got := make(chan http.Header, 1)
	up := newUpstream(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		fmt.Fprint(w, `{}`)
	})
	g := scopedGateway(t, up.host())
	forged := []string{"X-Macfleet-Cache-Partition", "team-b", mfv1.HeaderQueued, "999", "X-Macfleet-Some-Future-Header", "x"}
	for _, tc := range []struct {
		key, model, want string
	}{
		{keyTeamA, "chat", "team-a"},
		{keyTeamA, "team-b/granted", "team-a"}, // a granted deployment: still the caller's partition
		{keyAdmin, "team-b/secret", ""},
	} {
		resp, body := postPath(t, g.url+"/v1/chat/completions", `{"model":"`+tc.model+`","messages":[]}`,
			append([]string{"Authorization", "Bearer " + tc.key, HeaderPriority, "batch", runnerapi.HeaderSpeculation, "off"}, forged...)...)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s as %s: %d %s", tc.model, tc.key, resp.StatusCode, body)
		}
		h := <-got
		if p := h.Get(runnerapi.HeaderCachePartition); p != tc.want {
			t.Errorf("%s as %s: the agent got partition %q, want %q", tc.model, tc.key, p, tc.want)
		}
		if q := h.Get(mfv1.HeaderQueued); q == "999" {
			t.Errorf("%s as %s: the client's %s reached the agent", tc.model, tc.key, mfv1.HeaderQueued)
		}
		if v := h.Get("X-Macfleet-Some-Future-Header"); v != "" {
			t.Errorf("%s as %s: an unknown X-Macfleet- header from the client reached the agent", tc.model, tc.key)
		}
		for hdr, want := range map[string]string{HeaderPriority: "batch", runnerapi.HeaderSpeculation: "off"} {
			if v := h.Get(hdr); v != want {
				t.Errorf("%s as %s: the client's %s did not reach the agent (%q)", tc.model, tc.key, hdr, v)
			}
		}
	}
}
