package chart

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestGatewayTunnel: with gateway.tunnel.enabled the gateway takes agents' outbound
// connections (--tunnel-listen on container port "tunnel"), a TCP Service of its own
// exposes that port outside the cluster, and the gateway's NetworkPolicy admits it;
// off (the default) none of it is rendered; with more than one replica the replicas
// reach each other's tunnels (--tunnel-replicas, a headless Service of their tunnel
// ports, and NetworkPolicy rules between them both ways).
func TestGatewayTunnel(t *testing.T) {
	off := render(t)
	if args := findDeployment(t, off, "macfleet-gateway").Spec.Template.Spec.Containers[0].Args; slices.ContainsFunc(args, isTunnelArg) {
		t.Errorf("tunnel off: the gateway's args %v take tunnels", args)
	}
	for _, o := range off {
		if o.GetName() == "macfleet-gateway-tunnel" {
			t.Errorf("tunnel off: %s %s rendered", o.GetKind(), o.GetName())
		}
	}

	on := render(t, append([]string{"gateway.tunnel.enabled=true", "gateway.tunnel.port=9443",
		"gateway.tunnel.service.port=443", "networkPolicy.gateway.tunnelPeers[0].ipBlock.cidr=203.0.113.0/24"}, networkPolicyOn...)...)
	c := findDeployment(t, on, "macfleet-gateway").Spec.Template.Spec.Containers[0]
	if !slices.Contains(c.Args, "--tunnel-listen=:9443") {
		t.Errorf("tunnel on: the gateway's args %v lack --tunnel-listen=:9443", c.Args)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "tunnel" && p.ContainerPort == 9443 }) {
		t.Errorf("tunnel on: the gateway's ports %v lack tunnel 9443", c.Ports)
	}
	var svc corev1.Service
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(find(t, on, "Service", "macfleet-gateway-tunnel").Object, &svc); err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 443 ||
		svc.Spec.Ports[0].TargetPort != intstr.FromString("tunnel") {
		t.Errorf("the tunnel Service: type %s, ports %+v; want LoadBalancer, 443 → tunnel", svc.Spec.Type, svc.Spec.Ports)
	}
	gw := networkPolicies(t, on)["macfleet-gateway"]
	if gw == nil {
		t.Fatal("no gateway NetworkPolicy")
	}
	admitted := false
	for _, r := range ingressRules(gw) {
		if len(r.ports) == 1 && r.ports[0].Port != nil && *r.ports[0].Port == intstr.FromString("tunnel") &&
			len(r.peers) == 1 && r.peers[0].IPBlock != nil && r.peers[0].IPBlock.CIDR == "203.0.113.0/24" {
			admitted = true
		}
	}
	if !admitted {
		t.Errorf("the gateway's NetworkPolicy does not admit the tunnel port from tunnelPeers: %+v", gw.Spec.Ingress)
	}

	if args := c.Args; slices.ContainsFunc(args, isReplicasArg) {
		t.Errorf("tunnel on, one replica: the gateway's args %v name other replicas", args)
	}
	checkTunnelReplicas(t, render(t, append(slices.Clone(tunnelOn), append([]string{"gateway.replicas=3"}, networkPolicyOn...)...)...))
	_, err := helm(t, "template", "macfleet", chartDir(t), "--set", "gateway.tunnel.service.type=ClusterIP")
	if err == nil || !strings.Contains(err.Error(), "gateway/tunnel/service/type") {
		t.Errorf("a ClusterIP tunnel Service: %v, want a schema error", err)
	}
}

func isTunnelArg(a string) bool { return strings.HasPrefix(a, "--tunnel-listen") }

func isReplicasArg(a string) bool { return strings.HasPrefix(a, "--tunnel-replicas") }

// checkTunnelReplicas: a gateway of several replicas with the tunnel on names every
// replica's tunnel port by a headless Service that selects the gateway's pods, and
// its NetworkPolicy lets the replicas reach each other's tunnel port.
func checkTunnelReplicas(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	c := findDeployment(t, objs, "macfleet-gateway").Spec.Template.Spec.Containers[0]
	if want := "--tunnel-replicas=macfleet-gateway-tunnel-replicas." + testNamespace + ".svc:9443"; !slices.Contains(c.Args, want) {
		t.Errorf("three replicas: the gateway's args %v lack %s", c.Args, want)
	}
	var svc corev1.Service
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(find(t, objs, "Service", "macfleet-gateway-tunnel-replicas").Object, &svc); err != nil {
		t.Fatal(err)
	}
	pods := findDeployment(t, objs, "macfleet-gateway").Spec.Template.Labels
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9443 ||
		!labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pods)) {
		t.Errorf("the replicas' Service: clusterIP %q, ports %+v, selector %v; want headless, 9443, selecting the gateway's pods %v",
			svc.Spec.ClusterIP, svc.Spec.Ports, svc.Spec.Selector, pods)
	}
	gw := networkPolicies(t, objs)["macfleet-gateway"]
	in, out := false, false
	for _, r := range ingressRules(gw) {
		for _, p := range r.peers {
			if p.PodSelector != nil && labels.SelectorFromSet(p.PodSelector.MatchLabels).Matches(labels.Set(pods)) &&
				len(r.ports) == 1 && r.ports[0].Port != nil && *r.ports[0].Port == intstr.FromString("tunnel") {
				in = true
			}
		}
	}
	for _, r := range egressRules(gw) {
		for _, p := range r.peers {
			if p.PodSelector != nil && labels.SelectorFromSet(p.PodSelector.MatchLabels).Matches(labels.Set(pods)) &&
				len(r.ports) == 1 && r.ports[0].Port != nil && *r.ports[0].Port == intstr.FromInt32(9443) {
				out = true
			}
		}
	}
	if !in || !out {
		t.Errorf("the gateway's NetworkPolicy: replicas admitted on the tunnel port %v, let out to it %v; want both (ingress %+v, egress %+v)",
			in, out, gw.Spec.Ingress, gw.Spec.Egress)
	}
}

// tunnelOn takes tunnels on a container port and a Service port that differ from each
// other and from the defaults, from one network of Macs.
var tunnelOn = []string{"gateway.tunnel.enabled=true", "gateway.tunnel.port=9443", "gateway.tunnel.service.port=443",
	"networkPolicy.gateway.tunnelPeers[0].ipBlock.cidr=203.0.113.0/24"}

// TestTunnelManagerFlag: the manager reads the agents of Macs that dial out through the
// gateway's tunnel Service (--gateway-tunnel, its DNS name in the release namespace and
// its port) exactly when the chart renders that Service.
func TestTunnelManagerFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  []string
		want []string
	}{
		{"tunnel off", nil, nil},
		{"tunnel on", tunnelOn, []string{"--gateway-tunnel=macfleet-gateway-tunnel." + testNamespace + ".svc:443"}},
		{"tunnel on, default ports", []string{"gateway.tunnel.enabled=true"},
			[]string{"--gateway-tunnel=macfleet-gateway-tunnel." + testNamespace + ".svc:8444"}},
		{"tunnel on, no gateway", append(slices.Clone(tunnelOn), "gateway.enabled=false"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, tc.set...)
			var got []string
			for _, a := range findDeployment(t, objs, "macfleet-manager").Spec.Template.Spec.Containers[0].Args {
				if strings.HasPrefix(a, "--gateway-tunnel") {
					got = append(got, a)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("the manager's --gateway-tunnel (-want +got):\n%s", diff)
			}
			if tc.want != nil {
				if blocked := tunnelPath(t, objs); len(blocked) > 0 {
					t.Errorf("the manager cannot reach the tunnel listener: %v", blocked)
				}
			}
		})
	}
}

// TestTunnelNetworkPolicy: with the NetworkPolicies on, taking tunnels adds exactly
// three rules: the gateway admits tunnelPeers and the manager's pods on its tunnel
// port, and the manager may reach the gateway's pods on that port (the container
// port, which policies see behind the Service). Other pods, other ports and other
// addresses stay where they were.
func TestTunnelNetworkPolicy(t *testing.T) {
	off := render(t, networkPolicyOn...)
	on := render(t, append(slices.Clone(networkPolicyOn), tunnelOn...)...)
	mgrSel := findDeployment(t, on, "macfleet-manager").Spec.Selector.MatchLabels
	gwSel := findDeployment(t, on, "macfleet-gateway").Spec.Selector.MatchLabels
	tunnelPort := []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("tunnel")), Protocol: ptr.To(corev1.ProtocolTCP)}}
	podPeer := func(sel map[string]string) []networkingv1.NetworkPolicyPeer {
		return []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: sel}}}
	}
	polsOff, polsOn := networkPolicies(t, off), networkPolicies(t, on)
	mgrOff, gwOff, mgr, gw := polsOff["macfleet-manager"], polsOff["macfleet-gateway"], polsOn["macfleet-manager"], polsOn["macfleet-gateway"]
	if mgrOff == nil || gwOff == nil || mgr == nil || gw == nil {
		t.Fatalf("NetworkPolicies off %v, on %v; want macfleet-manager and macfleet-gateway in both", polsOff, polsOn)
	}
	wantIngress := []networkingv1.NetworkPolicyIngressRule{{
		From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "203.0.113.0/24"}}}, Ports: tunnelPort,
	}, {From: podPeer(mgrSel), Ports: tunnelPort}}
	if diff := cmp.Diff(wantIngress, changed(gwOff.Spec.Ingress, gw.Spec.Ingress)); diff != "" {
		t.Errorf("the gateway's ingress rules the tunnel adds (-want +got):\n%s", diff)
	}
	wantEgress := []networkingv1.NetworkPolicyEgressRule{{
		To: podPeer(gwSel), Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromInt32(9443)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}}
	if diff := cmp.Diff(wantEgress, changed(mgrOff.Spec.Egress, mgr.Spec.Egress)); diff != "" {
		t.Errorf("the manager's egress rules the tunnel adds (-want +got):\n%s", diff)
	}
	for what, d := range map[string]int{
		"the gateway's ingress rules the tunnel removes": len(changed(gw.Spec.Ingress, gwOff.Spec.Ingress)),
		"the gateway's egress rules the tunnel changes":  len(changed(gwOff.Spec.Egress, gw.Spec.Egress)) + len(changed(gw.Spec.Egress, gwOff.Spec.Egress)),
		"the manager's ingress rules the tunnel changes": len(changed(mgrOff.Spec.Ingress, mgr.Spec.Ingress)) + len(changed(mgr.Spec.Ingress, mgrOff.Spec.Ingress)),
		"the manager's egress rules the tunnel removes":  len(changed(mgr.Spec.Egress, mgrOff.Spec.Egress)),
	} {
		if d != 0 {
			t.Errorf("%s: %d, want 0", what, d)
		}
	}

	other := map[string]string{"app": "other"}
	tunnel, api := intstr.FromString("tunnel"), intstr.FromString("http")
	for _, c := range []struct {
		what  string
		rules []rule
		pod   map[string]string
		port  intstr.IntOrString
		want  bool
	}{
		{"the manager dials the gateway's tunnel port", ingressRules(gw), mgrSel, tunnel, true},
		{"the manager dials the tunnel port, tunnel off", ingressRules(gwOff), mgrSel, tunnel, false},
		{"another pod dials the gateway's tunnel port", ingressRules(gw), other, tunnel, false},
		{"a gateway pod dials the tunnel port", ingressRules(gw), gwSel, tunnel, false},
		{"the manager leaves for the gateway's tunnel port", egressRules(mgr), gwSel, intstr.FromInt32(9443), true},
		{"the manager leaves for the tunnel port, tunnel off", egressRules(mgrOff), gwSel, intstr.FromInt32(9443), false},
		{"the manager leaves for the gateway's API port", egressRules(mgr), gwSel, intstr.FromInt32(8080), false},
		{"the manager leaves for another pod's 9443", egressRules(mgr), other, intstr.FromInt32(9443), false},
		{"another pod dials the gateway's API (apiPeers empty: anyone)", ingressRules(gw), other, api, true},
	} {
		if got := podAdmits(c.rules, c.pod, c.port); got != c.want {
			t.Errorf("%s (pod %v, port %s): admitted %v, want %v", c.what, c.pod, c.port.String(), got, c.want)
		}
	}
	for ip, want := range map[string]bool{"203.0.113.9": true, "198.51.100.1": false} {
		if got := admits(t, ingressRules(gw), ip, tunnel, corev1.ProtocolTCP); got != want {
			t.Errorf("%s dials the tunnel port: admitted %v, want %v", ip, got, want)
		}
	}
}

// TestTunnelManagerInstalled installs the chart with tunnels and the NetworkPolicies
// into a real API server and follows the manager's way to the tunnel listener
// through the objects as stored; an upgrade without tunnels closes it again.
func TestTunnelManagerInstalled(t *testing.T) {
	env := testenv.Start(t, testenv.WithCRDPaths())
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	var values []string
	for _, s := range networkPolicyOn {
		values = append(values, "--set", s)
	}
	withTunnel := slices.Clone(values)
	for _, s := range tunnelOn {
		withTunnel = append(withTunnel, "--set", s)
	}
	helmArgs := []string{"macfleet", chartDir(t), "--kubeconfig", kubeconfig, "--namespace", installNamespace}
	mustHelm(t, append(append([]string{"install", "--create-namespace"}, helmArgs...), withTunnel...)...)
	stored := storedTunnelPath(t, env.Client)
	if blocked := tunnelPath(t, stored); len(blocked) > 0 {
		t.Errorf("after install with tunnels, the manager cannot reach the tunnel listener: %v", blocked)
	}

	mustHelm(t, append(append([]string{"upgrade"}, helmArgs...), values...)...)
	stored = storedTunnelPath(t, env.Client)
	if slices.ContainsFunc(findDeployment(t, stored, "macfleet-manager").Spec.Template.Spec.Containers[0].Args,
		func(a string) bool { return strings.HasPrefix(a, "--gateway-tunnel") }) {
		t.Error("after the upgrade without tunnels, the manager still dials the tunnel listener")
	}
	pols := networkPolicies(t, stored)
	mgrSel := findDeployment(t, stored, "macfleet-manager").Spec.Selector.MatchLabels
	gwSel := findDeployment(t, stored, "macfleet-gateway").Spec.Selector.MatchLabels
	if podAdmits(ingressRules(pols["macfleet-gateway"]), mgrSel, intstr.FromString("tunnel")) ||
		podAdmits(egressRules(pols["macfleet-manager"]), gwSel, intstr.FromInt32(9443)) {
		t.Error("after the upgrade without tunnels, the NetworkPolicies still open the tunnel port to the manager")
	}
}

// storedTunnelPath reads the objects of tunnelPath from the API server, leaving out
// those that do not exist.
func storedTunnelPath(t *testing.T, c client.Client) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, o := range []struct{ apiVersion, kind, name string }{
		{"apps/v1", "Deployment", "macfleet-manager"}, {"apps/v1", "Deployment", "macfleet-gateway"},
		{"v1", "Service", "macfleet-gateway-tunnel"},
		{"networking.k8s.io/v1", "NetworkPolicy", "macfleet-manager"}, {"networking.k8s.io/v1", "NetworkPolicy", "macfleet-gateway"},
	} {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(o.apiVersion)
		u.SetKind(o.kind)
		err := c.Get(t.Context(), client.ObjectKey{Namespace: installNamespace, Name: o.name}, u)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			t.Fatalf("reading %s %s: %v", o.kind, o.name, err)
		default:
			out = append(out, u)
		}
	}
	return out
}

// tunnelPath follows the manager's way to the gateway's tunnel listener through objs
// (as rendered or as stored): its one --gateway-tunnel, the Service that names in the
// manager's namespace and its port, the gateway's container port behind it and, when
// objs hold them, the two NetworkPolicies. It returns what blocks the way.
func tunnelPath(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	mgr, gw := findDeployment(t, objs, "macfleet-manager"), findDeployment(t, objs, "macfleet-gateway")
	var addrs []string
	for _, a := range mgr.Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--gateway-tunnel="); ok {
			addrs = append(addrs, v)
		}
	}
	if len(addrs) != 1 {
		return []string{fmt.Sprintf("the manager's args %v hold %d --gateway-tunnel=", mgr.Spec.Template.Spec.Containers[0].Args, len(addrs))}
	}
	host, port, err := net.SplitHostPort(addrs[0])
	parts := strings.Split(host, ".")
	if err != nil || len(parts) != 3 || parts[1] != mgr.Namespace || parts[2] != "svc" {
		return []string{fmt.Sprintf("--gateway-tunnel=%s is not SERVICE.%s.svc:PORT (%v)", addrs[0], mgr.Namespace, err)}
	}
	var svc *corev1.Service
	for _, o := range objs {
		if o.GetKind() == "Service" && o.GetName() == parts[0] && o.GetNamespace() == mgr.Namespace {
			svc = &corev1.Service{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, svc); err != nil {
				t.Fatal(err)
			}
		}
	}
	if svc == nil {
		return []string{"no Service " + parts[0] + " in " + mgr.Namespace}
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return strconv.Itoa(int(p.Port)) == port })
	if i < 0 || !selects(svc.Spec.Selector, gw.Spec.Template.Labels) {
		return []string{fmt.Sprintf("Service %s (ports %+v, selector %v) does not take port %s to the gateway's pods", svc.Name, svc.Spec.Ports, svc.Spec.Selector, port)}
	}
	target := svc.Spec.Ports[i].TargetPort
	j := slices.IndexFunc(gw.Spec.Template.Spec.Containers[0].Ports, func(p corev1.ContainerPort) bool { return p.Name == target.StrVal })
	if target.Type != intstr.String || j < 0 {
		return []string{fmt.Sprintf("Service %s targets %s, which the gateway's container does not name", svc.Name, target.String())}
	}
	containerPort := gw.Spec.Template.Spec.Containers[0].Ports[j].ContainerPort
	var blocked []string
	pols := networkPolicies(t, objs)
	if p := pols["macfleet-gateway"]; p != nil && !podAdmits(ingressRules(p), mgr.Spec.Template.Labels, target) &&
		!podAdmits(ingressRules(p), mgr.Spec.Template.Labels, intstr.FromInt32(containerPort)) {
		blocked = append(blocked, fmt.Sprintf("NetworkPolicy macfleet-gateway does not admit the manager's pods on port %s", target.String()))
	}
	if p := pols["macfleet-manager"]; p != nil && !podAdmits(egressRules(p), gw.Spec.Template.Labels, intstr.FromInt32(containerPort)) {
		blocked = append(blocked, fmt.Sprintf("NetworkPolicy macfleet-manager does not let the manager reach the gateway's pods on port %d", containerPort))
	}
	return blocked
}

// podAdmits reports whether one of the rules lets traffic between the selected pods
// and a pod of the policy's own namespace labelled pod on port: a peer matches it by
// its pod selector, and a namespace selector must be empty (any namespace). port is
// a number or, for ingress, the name of a container port.
func podAdmits(rules []rule, pod map[string]string, port intstr.IntOrString) bool {
	peerOK := func(p networkingv1.NetworkPolicyPeer) bool {
		if p.IPBlock != nil || (p.PodSelector == nil && p.NamespaceSelector == nil) {
			return false
		}
		if p.NamespaceSelector != nil && (len(p.NamespaceSelector.MatchLabels) > 0 || len(p.NamespaceSelector.MatchExpressions) > 0) {
			return false
		}
		if p.PodSelector == nil {
			return true
		}
		sel, err := metav1.LabelSelectorAsSelector(p.PodSelector)
		return err == nil && sel.Matches(labels.Set(pod))
	}
	for _, r := range rules {
		portOK := len(r.ports) == 0 || slices.ContainsFunc(r.ports, func(p networkingv1.NetworkPolicyPort) bool {
			return ptr.Deref(p.Protocol, corev1.ProtocolTCP) == corev1.ProtocolTCP && (p.Port == nil || *p.Port == port)
		})
		if portOK && (len(r.peers) == 0 || slices.ContainsFunc(r.peers, peerOK)) {
			return true
		}
	}
	return false
}

// selects reports whether a Service's selector picks pods labelled pod.
func selects(selector, pod map[string]string) bool {
	return len(selector) > 0 && labels.SelectorFromSet(selector).Matches(labels.Set(pod))
}

// changed lists the rules of after that before lacks.
func changed[R any](before, after []R) []R {
	var out []R
	for _, r := range after {
		if !slices.ContainsFunc(before, func(b R) bool { return cmp.Equal(b, r) }) {
			out = append(out, r)
		}
	}
	return out
}
