package chart

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestGatewayTunnel: with gateway.tunnel.enabled the gateway takes agents' outbound
// connections (--tunnel-listen on container port "tunnel"), a TCP Service of its own
// exposes that port outside the cluster, and the gateway's NetworkPolicy admits it;
// off (the default) none of it is rendered; with more than one replica the chart
// refuses, naming why.
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

	_, err := helm(t, "template", "macfleet", chartDir(t), "--set", "gateway.tunnel.enabled=true", "--set", "gateway.replicas=2")
	if err == nil || !strings.Contains(err.Error(), "gateway.tunnel.enabled needs gateway.replicas 1") {
		t.Errorf("tunnel with two replicas: %v, want the chart's refusal", err)
	}
	_, err = helm(t, "template", "macfleet", chartDir(t), "--set", "gateway.tunnel.service.type=ClusterIP")
	if err == nil || !strings.Contains(err.Error(), "gateway/tunnel/service/type") {
		t.Errorf("a ClusterIP tunnel Service: %v, want a schema error", err)
	}
}

func isTunnelArg(a string) bool { return strings.HasPrefix(a, "--tunnel-listen") }
