package chart

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/test/support/testenv"
)

// gatewayAPIVersion is the Gateway API release whose standard CRDs the chart's
// HTTPRoute and Gateway are applied against. They are read from the Go module cache
// (`go mod download`), not kept in the repository.
const gatewayAPIVersion = "v1.4.1"

// accessOn turns on every way in of the gateway: the Ingress, the HTTPRoute with the
// chart's Gateway, and the gateway's own TLS.
var accessOn = []string{"gateway.access.hostnames={llm.example.com,llm.example.org}", "gateway.access.ingress.enabled=true",
	"gateway.access.httpRoute.enabled=true", "gateway.access.httpRoute.createGateway=true",
	"gateway.access.httpRoute.gatewayClassName=shared", "gateway.tls.terminate=true"}

// gatewayAPICRDs returns the directory of the standard Gateway API CRDs in the module
// cache, downloading the module there when it is missing.
func gatewayAPICRDs(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(moduleDir(t, "sigs.k8s.io/gateway-api@"+gatewayAPIVersion), "config", "crd", "standard")
	if _, err := os.Stat(filepath.Join(dir, "gateway.networking.k8s.io_httproutes.yaml")); err != nil {
		t.Fatalf("the Gateway API module has no standard CRDs: %v", err)
	}
	return dir
}

// TestAccessOffByDefault: without values, the gateway is reached by port-forward
// only, over plain HTTP.
func TestAccessOffByDefault(t *testing.T) {
	objs := render(t)
	for _, o := range objs {
		switch o.GetKind() {
		case "Ingress", "HTTPRoute", "Gateway", "Certificate":
			t.Errorf("rendered %s by default", describe(o))
		}
	}
	for _, a := range findDeployment(t, objs, "macfleet-gateway").Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--tls-") {
			t.Errorf("the gateway gets %s by default", a)
		}
	}
	for _, a := range findDeployment(t, objs, "macfleet-manager").Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--gateway-serving-") {
			t.Errorf("the manager gets %s by default", a)
		}
	}
}

// TestAccessFromFleetCA: with gateway.tls.fromFleetCA the manager is told to keep the
// gateway's Secret with a certificate for the team's hostnames and the Service's
// in-cluster names, and no Certificate object is rendered.
func TestAccessFromFleetCA(t *testing.T) {
	objs := render(t, append(accessOn, "gateway.tls.fromFleetCA=true")...)
	want := []string{"--gateway-serving-secret=macfleet-gateway-https",
		"--gateway-serving-hosts=llm.example.com,llm.example.org,macfleet-gateway,macfleet-gateway.fleet-test," +
			"macfleet-gateway.fleet-test.svc,macfleet-gateway.fleet-test.svc.cluster.local"}
	var got []string
	for _, a := range findDeployment(t, objs, "macfleet-manager").Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--gateway-serving-") {
			got = append(got, a)
		}
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("the manager's serving flags (-want +got):\n%s", d)
	}
	for _, o := range objs {
		if o.GetKind() == "Certificate" {
			t.Errorf("rendered %s with the fleet CA as the issuer", describe(o))
		}
	}
}

// TestAccessRender: the Ingress and the HTTPRoute reach the gateway's Service over
// TLS with settings for long streams; the gateway's own TLS mounts the Secret its
// flags read; the Certificate names the hosts.
func TestAccessRender(t *testing.T) {
	objs := render(t, append(accessOn, "gateway.tls.certificate.create=true", "gateway.tls.certificate.issuerRef.name=org-ca",
		`gateway.access.ingress.annotations.nginx\.ingress\.kubernetes\.io/proxy-body-size=64m`)...)
	hosts := []any{"llm.example.com", "llm.example.org"}
	secret := "macfleet-gateway-https"

	ing := find(t, objs, "Ingress", "macfleet-gateway")
	wantAnn := map[string]string{
		"nginx.ingress.kubernetes.io/proxy-buffering":         "off",
		"nginx.ingress.kubernetes.io/proxy-request-buffering": "off",
		"nginx.ingress.kubernetes.io/proxy-read-timeout":      "3600",
		"nginx.ingress.kubernetes.io/proxy-send-timeout":      "3600",
		"nginx.ingress.kubernetes.io/proxy-body-size":         "64m",   // the user's annotation wins
		"nginx.ingress.kubernetes.io/backend-protocol":        "HTTPS", // the gateway terminates TLS too
	}
	if d := cmp.Diff(wantAnn, ing.GetAnnotations()); d != "" {
		t.Errorf("Ingress annotations (-want +got):\n%s", d)
	}
	tlsHosts, _, _ := unstructured.NestedSlice(ing.Object, "spec", "tls")
	if d := cmp.Diff([]any{map[string]any{"hosts": hosts, "secretName": secret}}, tlsHosts); d != "" {
		t.Errorf("Ingress tls (-want +got):\n%s", d)
	}
	rules, _, _ := unstructured.NestedSlice(ing.Object, "spec", "rules")
	if len(rules) != len(hosts) {
		t.Fatalf("Ingress rules %v, want one per host", rules)
	}
	for i, r := range rules {
		host, _, _ := unstructured.NestedString(r.(map[string]any), "host")
		paths, _, _ := unstructured.NestedSlice(r.(map[string]any), "http", "paths")
		svc, _, _ := unstructured.NestedMap(paths[0].(map[string]any), "backend", "service")
		if host != hosts[i] || len(paths) != 1 || svc["name"] != "macfleet-gateway" {
			t.Errorf("Ingress rule %d: %v", i, r)
		}
	}

	route := find(t, objs, "HTTPRoute", "macfleet-gateway")
	routeSpec, _, _ := unstructured.NestedMap(route.Object, "spec")
	wantRoute := map[string]any{
		"parentRefs": []any{map[string]any{"name": "macfleet-gateway"}},
		"hostnames":  hosts,
		"rules": []any{map[string]any{
			"matches":     []any{map[string]any{"path": map[string]any{"type": "PathPrefix", "value": "/"}}},
			"backendRefs": []any{map[string]any{"name": "macfleet-gateway", "port": float64(80)}},
			"timeouts":    map[string]any{"request": "1h", "backendRequest": "1h"},
		}},
	}
	if d := cmp.Diff(wantRoute, routeSpec); d != "" {
		t.Errorf("HTTPRoute spec (-want +got):\n%s", d)
	}
	gw := find(t, objs, "Gateway", "macfleet-gateway")
	listeners, _, _ := unstructured.NestedSlice(gw.Object, "spec", "listeners")
	if len(listeners) != len(hosts) {
		t.Fatalf("Gateway listeners %v, want one per host", listeners)
	}
	for i, l := range listeners {
		m := l.(map[string]any)
		ref, _, _ := unstructured.NestedSlice(m, "tls", "certificateRefs")
		if m["hostname"] != hosts[i] || m["protocol"] != "HTTPS" || m["port"] != float64(443) || len(ref) != 1 || ref[0].(map[string]any)["name"] != secret {
			t.Errorf("Gateway listener %d: %v", i, m)
		}
	}

	cert := find(t, objs, "Certificate", "macfleet-gateway")
	certSpec, _, _ := unstructured.NestedMap(cert.Object, "spec")
	wantCert := map[string]any{"secretName": secret, "dnsNames": hosts,
		"issuerRef": map[string]any{"group": "cert-manager.io", "kind": "ClusterIssuer", "name": "org-ca"}}
	if d := cmp.Diff(wantCert, certSpec); d != "" {
		t.Errorf("Certificate spec (-want +got):\n%s", d)
	}

	checkOwnTLS(t, objs, secret)
}

// checkOwnTLS: the gateway's TLS flags read the files of the mounted Secret.
func checkOwnTLS(t *testing.T, objs []*unstructured.Unstructured, secret string) {
	t.Helper()
	pod := findDeployment(t, objs, "macfleet-gateway").Spec.Template.Spec
	var files []string
	for _, a := range pod.Containers[0].Args {
		if f, ok := strings.CutPrefix(a, "--tls-cert-file="); ok {
			files = append(files, f)
		}
		if f, ok := strings.CutPrefix(a, "--tls-key-file="); ok {
			files = append(files, f)
		}
	}
	if len(files) != 2 {
		t.Fatalf("gateway args %v, want --tls-cert-file and --tls-key-file", pod.Containers[0].Args)
	}
	var mount string
	for _, m := range pod.Containers[0].VolumeMounts {
		if m.MountPath == filepath.Dir(files[0]) && m.SubPath == "" {
			mount = m.Name
		}
	}
	for _, v := range pod.Volumes {
		if v.Name != mount || v.Secret == nil {
			continue
		}
		if v.Secret.SecretName != secret {
			t.Errorf("the TLS volume mounts Secret %s, want %s", v.Secret.SecretName, secret)
		}
		for _, f := range files {
			if !slices.ContainsFunc(v.Secret.Items, func(k corev1.KeyToPath) bool { return k.Path == filepath.Base(f) }) {
				t.Errorf("the TLS volume has no %s: %v", filepath.Base(f), v.Secret.Items)
			}
		}
		return
	}
	t.Errorf("no Secret volume mounted whole at %s (volumes %v)", filepath.Dir(files[0]), pod.Volumes)
}

// TestAccessRefused: a way in that cannot work fails the render and names the value
// to set.
func TestAccessRefused(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"gateway.access.ingress.enabled=true"}, "gateway.access.hostnames is empty"},
		{[]string{"gateway.access.httpRoute.enabled=true", "gateway.access.hostnames={llm.example.com}"}, "gateway.access.httpRoute.parentRefs is empty"},
		{[]string{"gateway.access.httpRoute.createGateway=true", "gateway.access.hostnames={llm.example.com}"}, "gatewayClassName is empty"},
		{[]string{"gateway.tls.certificate.create=true", "gateway.access.hostnames={llm.example.com}"}, "issuerRef.name is empty"},
		{[]string{"gateway.tls.terminate=true", "gateway.tls.secretName="}, "gateway.tls.secretName is empty"},
		{[]string{"gateway.tls.fromFleetCA=true", "gateway.tls.secretName="}, "gateway.tls.secretName is empty"},
		{[]string{"gateway.tls.fromFleetCA=true", "gateway.tls.certificate.create=true", "gateway.tls.certificate.issuerRef.name=org-ca",
			"gateway.access.hostnames={llm.example.com}"}, "choose the cluster's issuer or the fleet CA"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			args := []string{"template", "macfleet", chartDir(t)}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			_, err := helm(t, args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("helm template --set %v: %v, want an error saying %q", tc.set, err, tc.want)
			}
		})
	}
}

// TestAccessApplies installs the chart with the Ingress, the HTTPRoute and its Gateway
// into a real API server that has the Gateway API CRDs: the API server accepts them
// as rendered, and its validation of the route's timeouts and the absence of the
// Certificate kind reach the user as helm errors.
func TestAccessApplies(t *testing.T) {
	env := testenv.Start(t, testenv.WithCRDPaths(gatewayAPICRDs(t)))
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	release := []string{"macfleet", chartDir(t), "--kubeconfig", kubeconfig, "--namespace", installNamespace}
	for _, s := range accessOn {
		release = append(release, "--set", s)
	}
	notes := mustHelm(t, append(append([]string{"install"}, release...), "--create-namespace")...)
	if want := "curl https://llm.example.com/v1/chat/completions"; !strings.Contains(notes, want) || strings.Contains(notes, "port-forward svc/macfleet-gateway") {
		t.Errorf("helm install output lacks %q or still says port-forward:\n%s", want, notes)
	}
	for _, gvk := range []schema.GroupVersionKind{{Group: "networking.k8s.io", Version: "v1", Kind: "Ingress"},
		{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "HTTPRoute"}, {Group: "gateway.networking.k8s.io", Version: "v1", Kind: "Gateway"}} {
		o := &unstructured.Unstructured{}
		o.SetGroupVersionKind(gvk)
		if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: installNamespace, Name: "macfleet-gateway"}, o); err != nil {
			t.Errorf("%s after install: %v", gvk.Kind, err)
		}
	}

	upgrade := append([]string{"upgrade"}, release...)
	// The API server's own rule: an attempt may not outlast the whole request.
	_, err := helm(t, append(upgrade, "--set", "gateway.access.httpRoute.timeouts.backendRequest=2h")...)
	if err == nil || !strings.Contains(err.Error(), "backendRequest timeout cannot be longer than request timeout") {
		t.Errorf("upgrade with backendRequest above request: %v, want the HTTPRoute refused", err)
	}
	// Without the issuer's CRDs, a Certificate cannot be made, and helm says so.
	_, err = helm(t, append(upgrade, "--set", "gateway.tls.certificate.create=true", "--set", "gateway.tls.certificate.issuerRef.name=org-ca")...)
	if err == nil || !strings.Contains(err.Error(), "Certificate") {
		t.Errorf("upgrade with a Certificate and no CRD for it: %v, want an error naming the kind", err)
	}
	// A LoadBalancer without TLS of the gateway's own is warned of.
	notes = mustHelm(t, append(upgrade, "--set", "gateway.service.type=LoadBalancer", "--set", "gateway.tls.terminate=false")...)
	if want := "WARNING: the LoadBalancer Service serves plain HTTP"; !strings.Contains(notes, want) {
		t.Errorf("helm upgrade output lacks %q:\n%s", want, notes)
	}
	// Neither failed upgrade left a change behind.
	route := &unstructured.Unstructured{}
	route.SetGroupVersionKind(schema.GroupVersionKind{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "HTTPRoute"})
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: installNamespace, Name: "macfleet-gateway"}, route); err != nil {
		t.Fatal(err)
	}
	rules, _, _ := unstructured.NestedSlice(route.Object, "spec", "rules")
	if got, _, _ := unstructured.NestedString(rules[0].(map[string]any), "timeouts", "backendRequest"); got != "1h" {
		t.Errorf("the HTTPRoute's backendRequest timeout is %q after the refused upgrade, want 1h", got)
	}
}
