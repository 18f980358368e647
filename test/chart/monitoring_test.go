package chart

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/macfleet/macfleet/agent/janitor"
	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/internal/pki"

	// The manager's controllers register their metrics on controller-runtime's
	// registry in init functions: importing the manager's wiring runs them all.
	_ "github.com/macfleet/macfleet/cmd/macfleet/manager"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

// monitoringOn turns on every monitoring object of the chart.
var monitoringOn = []string{"monitoring.dashboards.enabled=true", "monitoring.podMonitor.enabled=true",
	"monitoring.prometheusRule.enabled=true"}

// prometheusMade are series Prometheus records itself: up is 0 for a target that did
// not answer its last scrape. MacfleetAgentDown uses it for the agents, as no
// component exports a metric of a MacNode's Ready condition.
var prometheusMade = set("up")

// exporter is a component's metrics registry.
type exporter struct {
	component string
	reg       prometheus.Registerer
}

// exporters returns the registries the components' own code fills; nothing is listed
// by hand, so a metric renamed or removed in the code fails the chart's test.
func exporters(t *testing.T) []exporter {
	t.Helper()
	// The gateway registers on the Registerer it is given; `macfleet gateway` gives it
	// controller-runtime's registry (gateway/run.go), a fresh one here.
	// With prefix-cache routing and a fleet certificate, as the chart runs it, so that
	// peer fetch and warm-up register theirs.
	gw := prometheus.NewRegistry()
	ca, err := pki.NewCA(time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	gwID := pki.Gateway("chart-test")
	certs, err := ca.NewSource(&gwID, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(gateway.Options{Registerer: gw, Routing: gateway.RoutingPrefixCache, AgentCertificates: certs})
	if err != nil {
		t.Fatalf("building a gateway: %v", err)
	}
	t.Cleanup(g.Close)
	// The agent's registry as agent/clustermode/run.go fills it: the server's request
	// metrics and the pool's (enginepool.NewMetrics), then the janitor's.
	agent := prometheus.NewRegistry()
	gauge, err := enginepool.NewGauge()
	if err != nil {
		t.Fatal(err)
	}
	factory := runnerproc.NewProcessFactory(runnerproc.ProcessConfig{SocketDir: t.TempDir()})
	pool, err := enginepool.New(enginepool.Config{CeilingBytes: 4 << 30}, factory, gauge, nil, logr.Discard())
	if err != nil {
		t.Fatalf("building a pool: %v", err)
	}
	if _, err := server.New(pool, server.Options{Registerer: agent, Log: logr.Discard()}); err != nil {
		t.Fatalf("building the agent's server: %v", err)
	}
	jan := janitor.New(janitor.Options{PromptCacheRetention: time.Hour}, nil, factory, nil, logr.Discard())
	for _, c := range jan.Collectors() {
		agent.MustRegister(c)
	}
	// The manager serves controller-runtime's registry (internal/mgrhttp): its own
	// metrics and those of the controllers, the scheduler and the autoscaler.
	return []exporter{{"manager", ctrlmetrics.Registry}, {"gateway", gw}, {"agent", agent}}
}

// holds reports whether reg has a collector describing a metric named name. It
// registers a probe of that name with a help text no real metric has: the registry
// refuses it exactly when the name is taken.
func holds(reg prometheus.Registerer, name string) (bool, error) {
	p := probe{prometheus.NewDesc(name, "test/chart probe", nil, nil)}
	err := reg.Register(p)
	if err == nil {
		reg.Unregister(p)
		return false, nil
	}
	if strings.Contains(err.Error(), "same fully-qualified name") {
		return true, nil
	}
	return false, err
}

type probe struct{ desc *prometheus.Desc }

func (p probe) Describe(ch chan<- *prometheus.Desc) { ch <- p.desc }
func (p probe) Collect(chan<- prometheus.Metric)    {}

// exportedAs returns the metric that serves name (name itself, or the histogram or
// summary behind a _bucket, _sum or _count series) and the component exporting it, or
// "" when none does.
func exportedAs(t *testing.T, exps []exporter, name string) (metric, component string) {
	t.Helper()
	if prometheusMade[name] {
		return name, "Prometheus"
	}
	candidates := []string{name}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			candidates = append(candidates, base)
		}
	}
	for _, c := range candidates {
		for _, e := range exps {
			ok, err := holds(e.reg, c)
			if err != nil {
				t.Fatalf("probing the %s's registry for %s: %v", e.component, c, err)
			}
			if ok {
				return c, e.component
			}
		}
	}
	return "", ""
}

// promQL is one PromQL expression of the rendered chart and where it is.
type promQL struct{ where, expr string }

// labelValues is Grafana's variable query label_values(<selector>, <label>).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*[A-Za-z_][A-Za-z0-9_]*\)$`)

// chartPromQL returns the expressions of the PrometheusRule's rules and of the
// dashboards' panels and variables.
func chartPromQL(t *testing.T, objs []*unstructured.Unstructured) []promQL {
	t.Helper()
	var out []promQL
	for _, o := range objs {
		switch {
		case o.GetKind() == "PrometheusRule":
			groups, _, _ := unstructured.NestedSlice(o.Object, "spec", "groups")
			for _, g := range groups {
				rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
				for _, r := range rules {
					r := r.(map[string]any)
					expr, _ := r["expr"].(string)
					out = append(out, promQL{fmt.Sprintf("PrometheusRule %s, alert %v", o.GetName(), r["alert"]), expr})
				}
			}
		case o.GetKind() == "ConfigMap" && o.GetLabels()["grafana_dashboard"] == "1":
			data, _, _ := unstructured.NestedStringMap(o.Object, "data")
			for file, text := range data {
				var d dashboard
				if err := json.Unmarshal([]byte(text), &d); err != nil {
					t.Fatalf("ConfigMap %s: %s: %v", o.GetName(), file, err)
				}
				out = append(out, d.promQL(t, "dashboard "+file)...)
			}
		}
	}
	return out
}

// dashboard is the part of Grafana's dashboard JSON that holds queries.
type dashboard struct {
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"` // a string, or {"query": "..."} in newer Grafana
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"` // of a collapsed row
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

func (d *dashboard) promQL(t *testing.T, where string) []promQL {
	t.Helper()
	var out []promQL
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out = append(out, promQL{where + ", panel " + p.Title, tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		if sm := labelValues.FindStringSubmatch(q); sm != nil {
			q = sm[1]
		} else {
			t.Errorf("%s, variable %s: query %q is not label_values(<selector>, <label>)", where, v.Name, q)
		}
		out = append(out, promQL{where + ", variable " + v.Name, q})
	}
	return out
}

// TestMonitoringMetricsExported is the check that keeps the dashboards and alerts
// true: every metric they use is one the manager, the gateway or the agent registers,
// and docs/monitoring.md lists it.
func TestMonitoringMetricsExported(t *testing.T) {
	exprs := chartPromQL(t, render(t, monitoringOn...))
	if len(exprs) < 40 {
		t.Fatalf("found %d PromQL expressions in the rendered dashboards and rules, want the chart's 40 or more", len(exprs))
	}
	exps := exporters(t)
	usedBy := map[string]string{} // metric → component
	for _, e := range exprs {
		names, err := metricNames(e.expr)
		if err != nil {
			t.Errorf("%s: %q: %v", e.where, e.expr, err)
			continue
		}
		if len(names) == 0 {
			t.Errorf("%s: %q uses no metric", e.where, e.expr)
		}
		for _, n := range names {
			metric, component := exportedAs(t, exps, n)
			if component == "" {
				t.Errorf("%s uses %s, which neither the manager, the gateway nor the agent exports", e.where, n)
				continue
			}
			usedBy[metric] = component
		}
	}

	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "monitoring.md"))
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for m, component := range usedBy {
		if !strings.Contains(string(doc), "`"+m+"`") {
			missing = append(missing, m+" ("+component+")")
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("docs/monitoring.md does not list these metrics the chart uses:\n%s", strings.Join(missing, "\n"))
	}
}

// TestMonitoringRender checks the monitoring objects: none by default; with them on,
// a ConfigMap per dashboard file holding it verbatim, PodMonitors selecting the
// Deployments' pods on a port they have, and alerts with the values' thresholds.
func TestMonitoringRender(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(chartDir(t), "dashboards", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in charts/macfleet/dashboards (%v)", err)
	}
	tests := []struct {
		name           string
		set            []string
		setJSON        []string  // --set-json: --set makes a string of 2.5
		wantLabel      [2]string // the sidecar's label; "" no dashboards
		wantNamespace  string
		wantMonitors   []string
		wantMonitorTag map[string]string
		wantInRules    []string // "" no PrometheusRule
	}{{
		name: "defaults: off",
	}, {
		name:         "on",
		set:          monitoringOn,
		wantLabel:    [2]string{"grafana_dashboard", "1"},
		wantMonitors: []string{"macfleet-gateway", "macfleet-manager"},
		wantInRules: []string{`up{job="macfleet-agents"} == 0`, "> 10\n", "> 0.05\n",
			"sum by (model, reason) (rate(macfleet_gateway_queue_rejections_total[5m])) > 0.1"},
	}, {
		name: "on, tuned, without the gateway",
		set: append(slices.Clone(monitoringOn), "gateway.enabled=false",
			"monitoring.dashboards.label=dashboards.example/macfleet", "monitoring.dashboards.labelValue=yes",
			"monitoring.dashboards.namespace=grafana", "monitoring.dashboards.annotations.grafana_folder=macfleet",
			"monitoring.podMonitor.labels.release=kps", "monitoring.podMonitor.interval=1m",
			"monitoring.prometheusRule.labels.release=kps", "monitoring.prometheusRule.agentJob=macs",
			"monitoring.prometheusRule.queueRejectionsPerSecond=3"),
		setJSON:        []string{"monitoring.prometheusRule.ttftP99Seconds=2.5", "monitoring.prometheusRule.errorRatio=0.2"},
		wantLabel:      [2]string{"dashboards.example/macfleet", "yes"},
		wantNamespace:  "grafana",
		wantMonitors:   []string{"macfleet-manager"},
		wantMonitorTag: map[string]string{"release": "kps"},
		wantInRules:    []string{`up{job="macs"} == 0`, "> 2.5\n", "> 0.2\n", "[5m])) > 3"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"template", "macfleet", chartDir(t), "--namespace", testNamespace}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			for _, s := range tc.setJSON {
				args = append(args, "--set-json", s)
			}
			objs := decodeObjects(t, []byte(mustHelm(t, args...)))

			var dashboards []string
			for _, o := range objs {
				if o.GetKind() != "ConfigMap" {
					continue
				}
				if tc.wantLabel[0] == "" || o.GetLabels()[tc.wantLabel[0]] != tc.wantLabel[1] {
					t.Errorf("ConfigMap %s rendered, without the dashboard label %v", o.GetName(), tc.wantLabel)
					continue
				}
				dashboards = append(dashboards, o.GetName())
				want := tc.wantNamespace
				if want == "" {
					want = testNamespace
				}
				if o.GetNamespace() != want {
					t.Errorf("ConfigMap %s in namespace %q, want %q", o.GetName(), o.GetNamespace(), want)
				}
			}
			if tc.wantLabel[0] != "" {
				var want []string
				uids := map[string]string{}
				for _, f := range files {
					name := strings.TrimSuffix(filepath.Base(f), ".json")
					want = append(want, "macfleet-dashboard-"+name)
					cm := find(t, objs, "ConfigMap", "macfleet-dashboard-"+name)
					data, err := os.ReadFile(f)
					if err != nil {
						t.Fatal(err)
					}
					got, _, _ := unstructured.NestedString(cm.Object, "data", filepath.Base(f))
					if got != strings.TrimRight(string(data), "\n") {
						t.Errorf("ConfigMap %s does not hold %s verbatim", cm.GetName(), filepath.Base(f))
					}
					var d dashboard
					if err := json.Unmarshal(data, &d); err != nil || d.UID == "" {
						t.Errorf("%s: not a dashboard with a uid (%v)", filepath.Base(f), err)
					} else if other, dup := uids[d.UID]; dup {
						t.Errorf("%s and %s share the uid %s", other, filepath.Base(f), d.UID)
					}
					uids[d.UID] = filepath.Base(f)
				}
				slices.Sort(dashboards)
				if diff := cmp.Diff(want, dashboards); diff != "" {
					t.Errorf("dashboard ConfigMaps (-files +rendered):\n%s", diff)
				}
				if tc.wantNamespace != "" && cmp.Diff(map[string]string{"grafana_folder": "macfleet"},
					find(t, objs, "ConfigMap", want[0]).GetAnnotations()) != "" {
					t.Errorf("dashboard ConfigMap annotations = %v, want the values'", find(t, objs, "ConfigMap", want[0]).GetAnnotations())
				}
			}

			var monitors []string
			for _, o := range objs {
				if o.GetKind() != "PodMonitor" {
					continue
				}
				monitors = append(monitors, o.GetName())
				checkPodMonitor(t, o, findDeployment(t, objs, o.GetName()).Spec.Selector.MatchLabels, tc.wantMonitorTag)
			}
			slices.Sort(monitors)
			if diff := cmp.Diff(tc.wantMonitors, monitors); diff != "" {
				t.Errorf("PodMonitors (-want +got):\n%s", diff)
			}

			var rules []*unstructured.Unstructured
			for _, o := range objs {
				if o.GetKind() == "PrometheusRule" {
					rules = append(rules, o)
				}
			}
			if len(tc.wantInRules) == 0 {
				if len(rules) > 0 {
					t.Errorf("rendered %d PrometheusRules, want none", len(rules))
				}
				return
			}
			var exprs strings.Builder
			for _, e := range chartPromQL(t, []*unstructured.Unstructured{find(t, objs, "PrometheusRule", "macfleet")}) {
				exprs.WriteString(strings.TrimRight(e.expr, "\n") + "\n")
			}
			for _, w := range tc.wantInRules {
				if !strings.Contains(exprs.String(), w) {
					t.Errorf("no alert expression contains %q:\n%s", w, exprs.String())
				}
			}
			if tc.wantMonitorTag != nil && rules[0].GetLabels()["release"] != tc.wantMonitorTag["release"] {
				t.Errorf("PrometheusRule labels %v lack the values' %v", rules[0].GetLabels(), tc.wantMonitorTag)
			}
		})
	}
}

// checkPodMonitor checks that m selects exactly the pods of selector on their metrics
// port and carries the chart's labels and extra.
func checkPodMonitor(t *testing.T, m *unstructured.Unstructured, selector, extra map[string]string) {
	t.Helper()
	if m.GetAPIVersion() != "monitoring.coreos.com/v1" || m.GetNamespace() != testNamespace {
		t.Errorf("PodMonitor %s: %s in %q, want monitoring.coreos.com/v1 in %q", m.GetName(), m.GetAPIVersion(), m.GetNamespace(), testNamespace)
	}
	got, _, _ := unstructured.NestedStringMap(m.Object, "spec", "selector", "matchLabels")
	if diff := cmp.Diff(selector, got); diff != "" {
		t.Errorf("PodMonitor %s selects other pods than its Deployment (-deployment +monitor):\n%s", m.GetName(), diff)
	}
	endpoints, _, _ := unstructured.NestedSlice(m.Object, "spec", "podMetricsEndpoints")
	if len(endpoints) != 1 || endpoints[0].(map[string]any)["port"] != "metrics" || endpoints[0].(map[string]any)["path"] != "/metrics" {
		t.Errorf("PodMonitor %s endpoints = %v, want /metrics on the container port named metrics", m.GetName(), endpoints)
	}
	for k, v := range extra {
		if m.GetLabels()[k] != v {
			t.Errorf("PodMonitor %s labels %v lack %s=%s", m.GetName(), m.GetLabels(), k, v)
		}
	}
	if m.GetLabels()["app.kubernetes.io/managed-by"] != "Helm" {
		t.Errorf("PodMonitor %s lacks the chart's labels: %v", m.GetName(), m.GetLabels())
	}
}
