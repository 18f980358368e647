package e2e

import (
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/callercert"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// scrapeSecretInDocs is the Secret of macfleet-system whose certificate
// docs/monitoring.md ("Scraping the agents") has Prometheus scrape the agents with:
// the one its copy command reads.
func scrapeSecretInDocs(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "monitoring.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(b), "\n## Scraping the agents\n")
	section, _, _ = strings.Cut(section, "\n## ")
	m := regexp.MustCompile(`kubectl -n ` + v1alpha1.SystemNamespace + ` get secret (\S+) `).FindStringSubmatch(section)
	if m == nil {
		t.Fatal(`docs/monitoring.md, "Scraping the agents", copies no Secret of ` + v1alpha1.SystemNamespace + ` for Prometheus`)
	}
	return m[1]
}

// modelOn is the entry of the pool of agent (with the gateway's certificate) named name.
func modelOn(t *testing.T, agent, name string) enginepool.ModelSnapshot {
	t.Helper()
	code, body := call(t, agent, http.MethodGet, "/api/status", asGateway, "")
	var st server.StatusResponse
	if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil {
		t.Fatalf("the agent's status with the gateway's certificate: %d %s", code, body)
	}
	for _, m := range st.Models {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("the agent holds no model %s: %s", name, body)
	return enginepool.ModelSnapshot{}
}

// TestAttackScrapeCredentialUnloadsAModel: whoever holds the credential Prometheus
// scrapes the agents with (the Secret docs/monitoring.md copies to it) unloads a
// tenant's model, clears its cache, loads, reads the status and chats; it must get
// 403 forbidden_caller on each, the model stays loaded in the same runner, and
// /metrics still answers it.
func TestAttackScrapeCredentialUnloadsAModel(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "scraped", 1))
	r := waitReady(t, ns, "scraped", 1, 3*time.Minute)[0]
	agent := localfleet.AgentURL(r.Status.Endpoint)
	key := r.Namespace + "/" + r.Name
	before := modelOn(t, agent, key)

	secret := scrapeSecretInDocs(t)
	src := &pki.Source{}
	if err := callercert.Load(t.Context(), kubernetes.NewForConfigOrDie(fleet.Env.Config), v1alpha1.SystemNamespace, secret, src); err != nil {
		t.Fatal(err)
	}
	scraper, err := fleet.AgentClientWith(t.Context(), src.Certificate())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []struct{ method, path, body string }{
		{http.MethodPost, "/api/models/" + url.PathEscape(key) + "/unload", ""},
		{http.MethodPost, "/api/cache/clear", ""},
		{http.MethodPost, "/api/models/" + url.PathEscape(key) + "/load", ""},
		{http.MethodGet, "/api/status", ""},
		{http.MethodPost, "/v1/chat/completions", chatBody(key)},
	} {
		code, body := do(t, scraper, a.method, agent+a.path, a.body, v1alpha1.HeaderReplica, key)
		if code != http.StatusForbidden || !strings.Contains(body, "forbidden_caller") {
			t.Errorf("the scrape credential (Secret %s) on %s's agent, %s %s: %d %s; want 403 forbidden_caller",
				secret, r.Spec.NodeName, a.method, a.path, code, body)
		}
	}
	if after := modelOn(t, agent, key); after.State != enginepool.StateReady || after.PID != before.PID {
		t.Errorf("after the attempts the model is %s in runner %d; want it %s in the same runner %d", after.State, after.PID, enginepool.StateReady, before.PID)
	}
	code, body := do(t, scraper, http.MethodGet, agent+"/metrics", "")
	if code != http.StatusOK || !strings.Contains(body, "macfleet_agent_memory_ceiling_bytes") {
		t.Errorf("the scrape credential on /metrics: %d %.300s; want 200 with the agent's metrics", code, body)
	}
}
