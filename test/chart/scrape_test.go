package chart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

// TestAgentScrapeConfig: the agents' ScrapeConfig is off by default; on, it scrapes
// each listed agent over HTTPS as the metrics scraper, with the certificate, key and
// bundle of its Secret (the one credential that reaches /metrics and nothing else),
// never the gateway's, under the alerts' job name; enabled without agents is a clear
// error. docs/monitoring.md has the scrape config without the chart copy the same
// Secret.
func TestAgentScrapeConfig(t *testing.T) {
	render := func(args ...string) (string, error) {
		return helm(t, append([]string{"template", "macfleet", chartDir(t), "--namespace", testNamespace}, args...)...)
	}
	out, err := render()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range decodeObjects(t, []byte(out)) {
		if o.GetKind() == "ScrapeConfig" {
			t.Errorf("ScrapeConfig %s rendered by default", o.GetName())
		}
	}

	out, err = render("--set", "monitoring.agentScrape.enabled=true", "--set", "monitoring.prometheusRule.agentJob=macs",
		"--set", "monitoring.agentScrape.labels.release=kps", "--set", "monitoring.agentScrape.interval=1m",
		"--set-json", `monitoring.agentScrape.targets=[{"address":"10.0.0.21:8080","mac":"mac-studio-1"},{"address":"[fd00::2]:8080","mac":"mac-mini-2"}]`)
	if err != nil {
		t.Fatal(err)
	}
	sc := find(t, decodeObjects(t, []byte(out)), "ScrapeConfig", "macfleet-agents")
	if sc.GetAPIVersion() != "monitoring.coreos.com/v1alpha1" || sc.GetNamespace() != testNamespace || sc.GetLabels()["release"] != "kps" {
		t.Errorf("ScrapeConfig: %s in %q labelled %v; want monitoring.coreos.com/v1alpha1 in %q with the values' labels",
			sc.GetAPIVersion(), sc.GetNamespace(), sc.GetLabels(), testNamespace)
	}
	spec, _, _ := unstructured.NestedMap(sc.Object, "spec")
	secretRef := func(name, key string) map[string]any { return map[string]any{"name": name, "key": key} }
	want := map[string]any{
		"jobName": "macs", "scrapeInterval": "1m", "metricsPath": "/metrics", "scheme": "HTTPS",
		"tlsConfig": map[string]any{
			"ca":                 map[string]any{"secret": secretRef(mfv1.MetricsTLSSecret, mfv1.CABundleKey)},
			"cert":               map[string]any{"secret": secretRef(mfv1.MetricsTLSSecret, corev1.TLSCertKey)},
			"keySecret":          secretRef(mfv1.MetricsTLSSecret, corev1.TLSPrivateKeyKey),
			"insecureSkipVerify": true,
		},
		"staticConfigs": []any{
			map[string]any{"targets": []any{"10.0.0.21:8080"}, "labels": map[string]any{"instance": "mac-studio-1"}},
			map[string]any{"targets": []any{"[fd00::2]:8080"}, "labels": map[string]any{"instance": "mac-mini-2"}},
		},
	}
	if diff := cmp.Diff(want, spec); diff != "" {
		t.Errorf("ScrapeConfig spec (-want +got):\n%s", diff)
	}
	if b, _ := json.Marshal(sc.Object); strings.Contains(string(b), mfv1.GatewayTLSSecret) {
		t.Errorf("the ScrapeConfig names the gateway's Secret %s, which opens the whole agent API: %s", mfv1.GatewayTLSSecret, b)
	}

	if _, err := render("--set", "monitoring.agentScrape.enabled=true"); err == nil || !strings.Contains(err.Error(), "lists no agent in monitoring.agentScrape.targets") {
		t.Errorf("enabled without targets: %v; want the error naming monitoring.agentScrape.targets", err)
	}
	if _, err := render("--set-json", `monitoring.agentScrape.targets=[{"address":"http://10.0.0.21:8080","mac":"m"}]`); err == nil || !strings.Contains(err.Error(), "/monitoring/agentScrape/targets/0/address") {
		t.Errorf("a URL as a target's address: %v; want the schema's error naming it", err)
	}

	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "monitoring.md"))
	if err != nil {
		t.Fatal(err)
	}
	copied := regexp.MustCompile(`kubectl -n `+mfv1.SystemNamespace+` get secret (\S+) `).FindAllStringSubmatch(string(doc), -1)
	if len(copied) == 0 {
		t.Error("docs/monitoring.md copies no Secret for Prometheus")
	}
	for _, m := range copied {
		if m[1] != mfv1.MetricsTLSSecret {
			t.Errorf("docs/monitoring.md has Prometheus scrape with Secret %s, want %s", m[1], mfv1.MetricsTLSSecret)
		}
	}
}
