package chart

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/test/support/testenv"
)

// The controllers whose CRDs the presets' objects are applied against, read from the
// Go module cache (`go mod download`) as the Gateway API's are: their projects publish
// their CRDs in their Go modules. GKE's (BackendConfig, GCPBackendPolicy,
// HealthCheckPolicy) are in none, so they are stubbed (gkeCRDs).
const (
	envoyGatewayModule = "github.com/envoyproxy/gateway@v1.5.0"
	traefikModule      = "github.com/traefik/traefik/v3@v3.5.0"
)

// moduleDir is the directory of module@version in the module cache, downloaded there
// when missing.
func moduleDir(t *testing.T, module string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "mod", "download", "-json", module)
	cmd.Dir = t.TempDir() // outside the main module: nothing of go.mod changes
	out, err := cmd.Output()
	var mod struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &mod); err != nil || jerr != nil || mod.Error != "" {
		t.Fatalf("go mod download %s: %v %v %s", module, err, jerr, mod.Error)
	}
	return mod.Dir
}

// presetCRDs is a directory with the CRDs of Envoy Gateway's and Traefik's objects
// the presets make, as those projects publish them, and GKE's stubbed.
func presetCRDs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	envoy := filepath.Join(moduleDir(t, envoyGatewayModule), "charts", "gateway-helm", "crds", "generated")
	traefik := filepath.Join(moduleDir(t, traefikModule), "docs", "content", "reference", "dynamic-configuration")
	for _, f := range []string{filepath.Join(envoy, "gateway.envoyproxy.io_backendtrafficpolicies.yaml"),
		filepath.Join(envoy, "gateway.envoyproxy.io_clienttrafficpolicies.yaml"),
		filepath.Join(traefik, "traefik.io_serverstransports.yaml"), filepath.Join(traefik, "traefik.io_ingressroutes.yaml")} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range gkeCRDs {
		if err := os.WriteFile(filepath.Join(dir, c.plural+"."+c.group+".yaml"), []byte(c.manifest()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// stubCRD is a CRD of a kind whose schema is not published as a manifest: the API
// server takes any object of that group, version and kind (namespaced), so applying
// proves the chart renders the kinds GKE serves, not their fields (TestPresetsRender
// checks those).
type stubCRD struct{ group, version, kind, plural string }

var gkeCRDs = []stubCRD{
	{"cloud.google.com", "v1", "BackendConfig", "backendconfigs"},
	{"networking.gke.io", "v1", "GCPBackendPolicy", "gcpbackendpolicies"},
	{"networking.gke.io", "v1", "HealthCheckPolicy", "healthcheckpolicies"},
}

func (c stubCRD) manifest() string {
	return fmt.Sprintf(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: %[4]s.%[1]s
spec:
  group: %[1]s
  scope: Namespaced
  names: {kind: %[3]s, plural: %[4]s, singular: %[5]s, listKind: %[3]sList}
  versions:
    - name: %[2]s
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, c.group, c.version, c.kind, c.plural, strings.ToLower(c.kind))
}

// presetOn is every way in (the Ingress, the HTTPRoute and the chart's Gateway) with
// the preset and a stream timeout of 1800 s.
func presetOn(preset string) []string {
	return []string{"gateway.access.hostnames={llm.example.com,llm.example.org}", "gateway.access.ingress.enabled=true",
		"gateway.access.httpRoute.enabled=true", "gateway.access.httpRoute.createGateway=true",
		"gateway.access.httpRoute.gatewayClassName=shared", "gateway.access.preset=" + preset, "gateway.access.timeoutSeconds=1800"}
}

// field is one value a preset must set: the object and the path to it.
type field struct {
	kind, name string
	path       []string
	want       any
}

// TestPresetsRender: each preset sets its load balancer's timeouts to
// access.timeoutSeconds and checks /readyz where it checks health; the objects of
// the other presets are not rendered.
func TestPresetsRender(t *testing.T) {
	probe := float64(8081) // numbers decode as JSON does
	for _, tc := range []struct {
		preset string
		fields []field
		absent []string // kinds not rendered
	}{
		{"aws-alb", []field{
			{"Ingress", "macfleet-gateway", []string{"metadata", "annotations", "alb.ingress.kubernetes.io/load-balancer-attributes"}, "idle_timeout.timeout_seconds=1800"},
			{"Ingress", "macfleet-gateway", []string{"metadata", "annotations", "alb.ingress.kubernetes.io/healthcheck-path"}, "/readyz"},
			{"Ingress", "macfleet-gateway", []string{"metadata", "annotations", "alb.ingress.kubernetes.io/healthcheck-port"}, "8081"},
			{"Ingress", "macfleet-gateway", []string{"metadata", "annotations", "alb.ingress.kubernetes.io/target-type"}, "ip"},
		}, []string{"BackendConfig", "BackendTrafficPolicy", "IngressRoute"}},
		{"gke", []field{
			{"BackendConfig", "macfleet-gateway", []string{"spec", "timeoutSec"}, float64(1800)},
			{"BackendConfig", "macfleet-gateway", []string{"spec", "healthCheck", "requestPath"}, "/readyz"},
			{"BackendConfig", "macfleet-gateway", []string{"spec", "healthCheck", "port"}, probe},
			{"Service", "macfleet-gateway", []string{"metadata", "annotations", "cloud.google.com/backend-config"}, `{"default":"macfleet-gateway"}`},
			{"GCPBackendPolicy", "macfleet-gateway", []string{"spec", "default", "timeoutSec"}, float64(1800)},
			{"HealthCheckPolicy", "macfleet-gateway", []string{"spec", "default", "config", "httpHealthCheck", "requestPath"}, "/readyz"},
			{"HealthCheckPolicy", "macfleet-gateway", []string{"spec", "default", "config", "httpHealthCheck", "port"}, probe},
		}, []string{"BackendTrafficPolicy", "IngressRoute"}},
		{"envoy-gateway", []field{
			{"BackendTrafficPolicy", "macfleet-gateway", []string{"spec", "timeout", "http", "requestTimeout"}, "1800s"},
			{"BackendTrafficPolicy", "macfleet-gateway", []string{"spec", "timeout", "http", "connectionIdleTimeout"}, "1800s"},
			{"ClientTrafficPolicy", "macfleet-gateway", []string{"spec", "timeout", "http", "idleTimeout"}, "1800s"},
			{"ClientTrafficPolicy", "macfleet-gateway", []string{"spec", "timeout", "http", "streamIdleTimeout"}, "1800s"},
		}, []string{"BackendConfig", "GCPBackendPolicy", "IngressRoute"}},
		{"traefik", []field{
			{"ServersTransport", "macfleet-gateway", []string{"spec", "forwardingTimeouts", "responseHeaderTimeout"}, "1800s"},
			{"ServersTransport", "macfleet-gateway", []string{"spec", "forwardingTimeouts", "idleConnTimeout"}, "1800s"},
		}, []string{"Ingress", "BackendConfig", "BackendTrafficPolicy"}},
		{"ingress-nginx", []field{
			{"Ingress", "macfleet-gateway", []string{"metadata", "annotations", "nginx.ingress.kubernetes.io/proxy-read-timeout"}, "3600"},
		}, []string{"BackendConfig", "GCPBackendPolicy", "BackendTrafficPolicy", "ServersTransport", "IngressRoute"}},
	} {
		t.Run(tc.preset, func(t *testing.T) {
			objs := render(t, presetOn(tc.preset)...)
			for _, f := range tc.fields {
				got, ok, err := unstructured.NestedFieldNoCopy(find(t, objs, f.kind, f.name).Object, f.path...)
				if !ok || err != nil || got != f.want {
					t.Errorf("%s %s %s = %#v (%v %v), want %#v", f.kind, f.name, strings.Join(f.path, "."), got, ok, err, f.want)
				}
			}
			for _, o := range objs {
				for _, k := range tc.absent {
					if o.GetKind() == k {
						t.Errorf("rendered %s with preset %s", describe(o), tc.preset)
					}
				}
			}
		})
	}
	// Traefik's route names every host, through the ServersTransport.
	route := find(t, render(t, presetOn("traefik")...), "IngressRoute", "macfleet-gateway")
	routes, _, _ := unstructured.NestedSlice(route.Object, "spec", "routes")
	if len(routes) != 1 || routes[0].(map[string]any)["match"] != "Host(`llm.example.com`) || Host(`llm.example.org`)" {
		t.Errorf("IngressRoute routes %v", routes)
	}
}

// TestPresetsRefused: a preset without the way in it configures is refused, saying
// which to turn on.
func TestPresetsRefused(t *testing.T) {
	for preset, want := range map[string]string{
		"aws-alb":       "set gateway.access.ingress.enabled=true",
		"gke":           "set gateway.access.ingress.enabled=true or gateway.access.httpRoute.enabled=true",
		"envoy-gateway": "set gateway.access.httpRoute.enabled=true",
		"traefik":       "set gateway.access.ingress.enabled=true",
		"haproxy":       "preset",
	} {
		_, err := helm(t, "template", "macfleet", chartDir(t), "--set", "gateway.access.hostnames={llm.example.com}", "--set", "gateway.access.preset="+preset)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("preset %s alone: %v, want an error saying %q", preset, err, want)
		}
	}
}

// TestPresetsApply installs the chart with each preset in turn (helm upgrade) into a
// real API server with the Gateway API's, Envoy Gateway's and Traefik's CRDs (GKE's
// stubbed): the API server takes every preset's objects as rendered, validated by
// the published CRDs' schemas and rules, and an upgrade to another preset removes the
// previous one's.
func TestPresetsApply(t *testing.T) {
	env := testenv.Start(t, testenv.WithCRDPaths(gatewayAPICRDs(t), presetCRDs(t)))
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	gvk := map[string]schema.GroupVersionKind{
		"Ingress":              {Group: "networking.k8s.io", Version: "v1", Kind: "Ingress"},
		"BackendConfig":        {Group: "cloud.google.com", Version: "v1", Kind: "BackendConfig"},
		"GCPBackendPolicy":     {Group: "networking.gke.io", Version: "v1", Kind: "GCPBackendPolicy"},
		"HealthCheckPolicy":    {Group: "networking.gke.io", Version: "v1", Kind: "HealthCheckPolicy"},
		"BackendTrafficPolicy": {Group: "gateway.envoyproxy.io", Version: "v1alpha1", Kind: "BackendTrafficPolicy"},
		"ClientTrafficPolicy":  {Group: "gateway.envoyproxy.io", Version: "v1alpha1", Kind: "ClientTrafficPolicy"},
		"ServersTransport":     {Group: "traefik.io", Version: "v1alpha1", Kind: "ServersTransport"},
		"IngressRoute":         {Group: "traefik.io", Version: "v1alpha1", Kind: "IngressRoute"},
	}
	exists := func(kind string) bool {
		o := &unstructured.Unstructured{}
		o.SetGroupVersionKind(gvk[kind])
		return env.Client.Get(t.Context(), client.ObjectKey{Namespace: installNamespace, Name: "macfleet-gateway"}, o) == nil
	}
	verb := []string{"install", "--create-namespace"}
	for _, step := range []struct {
		preset     string
		made, gone []string
	}{
		{"gke", []string{"Ingress", "BackendConfig", "GCPBackendPolicy", "HealthCheckPolicy"}, []string{"BackendTrafficPolicy"}},
		{"envoy-gateway", []string{"BackendTrafficPolicy", "ClientTrafficPolicy"}, []string{"BackendConfig", "GCPBackendPolicy", "HealthCheckPolicy"}},
		{"traefik", []string{"ServersTransport", "IngressRoute"}, []string{"Ingress", "BackendTrafficPolicy", "ClientTrafficPolicy"}},
		{"aws-alb", []string{"Ingress"}, []string{"ServersTransport", "IngressRoute"}},
	} {
		args := append(append([]string{}, verb...), "macfleet", chartDir(t), "--kubeconfig", kubeconfig, "--namespace", installNamespace)
		for _, s := range presetOn(step.preset) {
			args = append(args, "--set", s)
		}
		mustHelm(t, args...)
		verb = []string{"upgrade"}
		for _, k := range step.made {
			if !exists(k) {
				t.Errorf("preset %s: no %s after helm %s", step.preset, k, args[0])
			}
		}
		for _, k := range step.gone {
			if exists(k) {
				t.Errorf("preset %s: %s still there after helm %s", step.preset, k, args[0])
			}
		}
	}
}
