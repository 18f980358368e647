package chart

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// networkPolicyOn turns the NetworkPolicies on with the two values they require.
var networkPolicyOn = []string{"networkPolicy.enabled=true",
	"networkPolicy.apiServer.cidrs={10.0.0.10/32}", "networkPolicy.agents.cidrs={192.168.10.0/24}"}

func networkPolicies(t *testing.T, objs []*unstructured.Unstructured) map[string]*networkingv1.NetworkPolicy {
	t.Helper()
	out := map[string]*networkingv1.NetworkPolicy{}
	for _, o := range objs {
		if o.GetKind() != "NetworkPolicy" {
			continue
		}
		var p networkingv1.NetworkPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &p); err != nil {
			t.Fatalf("converting NetworkPolicy %s: %v", o.GetName(), err)
		}
		out[p.Name] = &p
	}
	return out
}

// rule is an ingress or egress rule: its peers (from or to) and ports.
type rule struct {
	peers []networkingv1.NetworkPolicyPeer
	ports []networkingv1.NetworkPolicyPort
}

func ingressRules(p *networkingv1.NetworkPolicy) []rule {
	var out []rule
	for _, r := range p.Spec.Ingress {
		out = append(out, rule{r.From, r.Ports})
	}
	return out
}

func egressRules(p *networkingv1.NetworkPolicy) []rule {
	var out []rule
	for _, r := range p.Spec.Egress {
		out = append(out, rule{r.To, r.Ports})
	}
	return out
}

// admits reports whether one of the rules lets traffic between the selected pods and
// the address ip (outside the cluster: selector peers never match it) on port, as a
// plugin enforcing NetworkPolicies decides. port is a number or, for ingress, the
// name of a container port.
func admits(t *testing.T, rules []rule, ip string, port intstr.IntOrString, proto corev1.Protocol) bool {
	t.Helper()
	addr := netip.MustParseAddr(ip)
	inBlock := func(b *networkingv1.IPBlock) bool {
		if !netip.MustParsePrefix(b.CIDR).Contains(addr) {
			return false
		}
		return !slices.ContainsFunc(b.Except, func(e string) bool { return netip.MustParsePrefix(e).Contains(addr) })
	}
	for _, r := range rules {
		peerOK := len(r.peers) == 0 || slices.ContainsFunc(r.peers, func(p networkingv1.NetworkPolicyPeer) bool {
			return p.IPBlock != nil && inBlock(p.IPBlock)
		})
		portOK := len(r.ports) == 0 || slices.ContainsFunc(r.ports, func(p networkingv1.NetworkPolicyPort) bool {
			return ptr.Deref(p.Protocol, corev1.ProtocolTCP) == proto && (p.Port == nil || *p.Port == port)
		})
		if peerOK && portOK {
			return true
		}
	}
	return false
}

func TestNetworkPolicyOffByDefault(t *testing.T) {
	if got := networkPolicies(t, render(t)); len(got) > 0 {
		t.Errorf("rendered NetworkPolicies %v by default, want none", slices.Collect(maps.Keys(got)))
	}
}

// TestNetworkPolicyDefaults pins the whole policy the required values give, and what
// it means for addresses outside the cluster.
func TestNetworkPolicyDefaults(t *testing.T) {
	objs := render(t, networkPolicyOn...)
	pols := networkPolicies(t, objs)
	tcp := func(ports ...intstr.IntOrString) []networkingv1.NetworkPolicyPort {
		var out []networkingv1.NetworkPolicyPort
		for _, p := range ports {
			out = append(out, networkingv1.NetworkPolicyPort{Port: &p, Protocol: ptr.To(corev1.ProtocolTCP)})
		}
		return out
	}
	num, name := intstr.FromInt32, intstr.FromString
	block := func(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
		return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
	}
	monitoring := networkingv1.NetworkPolicyIngressRule{
		From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}},
		Ports: tcp(name("metrics"), name("probes")),
	}
	common := []networkingv1.NetworkPolicyEgressRule{{
		To: []networkingv1.NetworkPolicyPeer{block("10.0.0.10/32")}, Ports: tcp(num(443), num(6443)),
	}, {
		To: []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
		}},
		Ports: []networkingv1.NetworkPolicyPort{
			{Port: ptr.To(num(53)), Protocol: ptr.To(corev1.ProtocolUDP)},
			{Port: ptr.To(num(53)), Protocol: ptr.To(corev1.ProtocolTCP)},
		},
	}, {
		To: []networkingv1.NetworkPolicyPeer{block("192.168.10.0/24")}, Ports: tcp(num(8080)),
	}}
	want := map[string]networkingv1.NetworkPolicySpec{
		"macfleet-manager": {
			PodSelector: metav1.LabelSelector{MatchLabels: findDeployment(t, objs, "macfleet-manager").Spec.Selector.MatchLabels},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{monitoring, {
				From: []networkingv1.NetworkPolicyPeer{block("10.0.0.10/32")}, Ports: tcp(name("node-authz")),
			}},
			Egress: append(slices.Clone(common), networkingv1.NetworkPolicyEgressRule{
				To:    []networkingv1.NetworkPolicyPeer{block("0.0.0.0/0", "169.254.0.0/16"), block("::/0", "fe80::/10")},
				Ports: tcp(num(443)),
			}),
		},
		"macfleet-gateway": {
			PodSelector: metav1.LabelSelector{MatchLabels: findDeployment(t, objs, "macfleet-gateway").Spec.Selector.MatchLabels},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: tcp(name("http"))}, monitoring},
			Egress:      common,
		},
	}
	for n, w := range want {
		p, ok := pols[n]
		if !ok {
			t.Errorf("no NetworkPolicy %s", n)
			continue
		}
		if p.Namespace != testNamespace || p.Labels["app.kubernetes.io/managed-by"] != "Helm" {
			t.Errorf("NetworkPolicy %s in %q with labels %v, want the release namespace and the chart's labels", n, p.Namespace, p.Labels)
		}
		if diff := cmp.Diff(w, p.Spec); diff != "" {
			t.Errorf("NetworkPolicy %s (-want +got):\n%s", n, diff)
		}
	}
	if len(pols) != len(want) {
		t.Errorf("rendered %d NetworkPolicies, want %d", len(pols), len(want))
	}

	// What that means for addresses outside the cluster.
	mgr, gw := pols["macfleet-manager"], pols["macfleet-gateway"]
	if mgr == nil || gw == nil {
		t.FailNow()
	}
	for _, c := range []struct {
		what  string
		rules []rule
		ip    string
		port  intstr.IntOrString
		want  bool
	}{
		{"a client calls the gateway's API", ingressRules(gw), "203.0.113.9", name("http"), true},
		{"a client scrapes the gateway's metrics", ingressRules(gw), "203.0.113.9", name("metrics"), false},
		{"a client calls the manager's metrics", ingressRules(mgr), "203.0.113.9", name("metrics"), false},
		{"the gateway calls an agent", egressRules(gw), "192.168.10.7", num(8080), true},
		{"the gateway calls an agent's SSH", egressRules(gw), "192.168.10.7", num(22), false},
		{"the gateway calls the API server", egressRules(gw), "10.0.0.10", num(6443), true},
		{"the gateway calls a model hub", egressRules(gw), "198.51.100.1", num(443), false},
		{"the manager calls a model hub", egressRules(mgr), "198.51.100.1", num(443), true},
		{"the manager calls a model hub over IPv6", egressRules(mgr), "2001:db8::1", num(443), true},
		{"the manager calls cloud metadata", egressRules(mgr), "169.254.169.254", num(443), false},
		{"the manager calls a host over plain HTTP", egressRules(mgr), "198.51.100.1", num(80), false},
		{"the manager reads an agent's load", egressRules(mgr), "192.168.10.7", num(8080), true},
	} {
		if got := admits(t, c.rules, c.ip, c.port, corev1.ProtocolTCP); got != c.want {
			t.Errorf("%s (%s port %s): admitted %v, want %v", c.what, c.ip, c.port.String(), got, c.want)
		}
	}
}

// TestNetworkPolicyValues checks that each value reaches the policies.
func TestNetworkPolicyValues(t *testing.T) {
	tcp := corev1.ProtocolTCP
	tests := []struct {
		name  string
		set   []string
		check func(t *testing.T, mgr, gw *networkingv1.NetworkPolicy)
	}{{
		name: "API peers, ports, addresses",
		set: []string{"networkPolicy.gateway.apiPeers[0].ipBlock.cidr=10.1.0.0/16",
			"networkPolicy.apiServer.cidrs={10.0.0.10/32,10.0.0.11/32}", "networkPolicy.apiServer.ports={6443}",
			"networkPolicy.agents.cidrs={192.168.10.0/24,fd12::/64}", "networkPolicy.agents.ports={8081}",
			"networkPolicy.manager.modelSources.ports={443,80}"},
		check: func(t *testing.T, mgr, gw *networkingv1.NetworkPolicy) {
			for _, c := range []struct {
				rules []rule
				ip    string
				port  intstr.IntOrString
				want  bool
			}{
				{ingressRules(gw), "10.1.2.3", intstr.FromString("http"), true},
				{ingressRules(gw), "203.0.113.9", intstr.FromString("http"), false},
				{egressRules(gw), "10.0.0.11", intstr.FromInt32(6443), true},
				{egressRules(gw), "10.0.0.11", intstr.FromInt32(443), false},
				{egressRules(gw), "fd12::7", intstr.FromInt32(8081), true},
				{egressRules(gw), "192.168.10.7", intstr.FromInt32(8080), false},
				{egressRules(mgr), "fd12::7", intstr.FromInt32(8081), true},
				{egressRules(mgr), "198.51.100.1", intstr.FromInt32(80), true},
			} {
				if got := admits(t, c.rules, c.ip, c.port, tcp); got != c.want {
					t.Errorf("%s port %s: admitted %v, want %v", c.ip, c.port.String(), got, c.want)
				}
			}
		},
	}, {
		name: "the source policy's denied networks are excepted from model sources",
		set:  []string{"sourcePolicy.deniedNetworks={10.96.0.0/12,10.244.0.0/16,fd00::/8}"},
		check: func(t *testing.T, mgr, _ *networkingv1.NetworkPolicy) {
			for ip, want := range map[string]bool{"10.96.0.1": false, "10.244.3.4": false, "fd00::1": false,
				"169.254.169.254": false, "10.1.0.1": true, "198.51.100.1": true} {
				if got := admits(t, egressRules(mgr), ip, intstr.FromInt32(443), tcp); got != want {
					t.Errorf("manager to %s:443: admitted %v, want %v", ip, got, want)
				}
			}
		},
	}, {
		name: "monitoring peers, DNS anywhere, extra egress",
		set: []string{"networkPolicy.monitoringPeers[0].ipBlock.cidr=10.2.0.0/16", "networkPolicy.dns.peers=null",
			"networkPolicy.dns.ports={5353}",
			"networkPolicy.manager.extraEgress[0].to[0].ipBlock.cidr=10.3.0.0/16",
			"networkPolicy.manager.extraEgress[0].ports[0].port=4317",
			"networkPolicy.gateway.extraEgress[0].to[0].ipBlock.cidr=10.4.0.0/16"},
		check: func(t *testing.T, mgr, gw *networkingv1.NetworkPolicy) {
			for _, p := range []*networkingv1.NetworkPolicy{mgr, gw} {
				for port, want := range map[string]bool{"metrics": true, "probes": true} {
					if got := admits(t, ingressRules(p), "10.2.0.5", intstr.FromString(port), tcp); got != want {
						t.Errorf("%s: 10.2.0.5 to %s admitted %v, want %v", p.Name, port, got, want)
					}
				}
				if admits(t, ingressRules(p), "10.5.0.5", intstr.FromString("metrics"), tcp) {
					t.Errorf("%s: a peer outside monitoringPeers may scrape", p.Name)
				}
				if !admits(t, egressRules(p), "10.9.9.9", intstr.FromInt32(5353), corev1.ProtocolUDP) ||
					admits(t, egressRules(p), "10.9.9.9", intstr.FromInt32(53), corev1.ProtocolUDP) {
					t.Errorf("%s: DNS without peers must go to any address on port 5353 only", p.Name)
				}
			}
			if !admits(t, egressRules(mgr), "10.3.0.1", intstr.FromInt32(4317), tcp) || admits(t, egressRules(mgr), "10.3.0.1", intstr.FromInt32(4318), tcp) {
				t.Error("manager: the extra egress rule is not applied as given")
			}
			if !admits(t, egressRules(gw), "10.4.0.1", intstr.FromInt32(1), tcp) || admits(t, egressRules(mgr), "10.4.0.1", intstr.FromInt32(1), tcp) {
				t.Error("gateway: the extra egress rule is not the gateway's alone")
			}
		},
	}, {
		name: "no monitoring peers: the API server reaches the node authorizer, no one else the manager",
		set:  []string{"networkPolicy.monitoringPeers=null"},
		check: func(t *testing.T, mgr, gw *networkingv1.NetworkPolicy) {
			authz := intstr.FromString("node-authz")
			if !admits(t, ingressRules(mgr), "10.0.0.10", authz, tcp) {
				t.Error("the API server cannot reach the node authorizer")
			}
			for _, p := range []intstr.IntOrString{authz, intstr.FromString("metrics"), intstr.FromString("probes")} {
				if admits(t, ingressRules(mgr), "10.1.2.3", p, tcp) {
					t.Errorf("a pod reaches the manager's port %s", p.String())
				}
			}
		},
	}, {
		name: "no monitoring peers, no node authorizer: the manager accepts nothing",
		set:  []string{"networkPolicy.monitoringPeers=null", "nodeAuthorization.mode=rbac"},
		check: func(t *testing.T, mgr, gw *networkingv1.NetworkPolicy) {
			if mgr.Spec.Ingress == nil || len(mgr.Spec.Ingress) != 0 || !slices.Contains(mgr.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
				t.Errorf("manager ingress = %+v with policy types %v, want none, enforced", mgr.Spec.Ingress, mgr.Spec.PolicyTypes)
			}
			if len(gw.Spec.Ingress) != 1 || len(gw.Spec.Ingress[0].Ports) != 1 || gw.Spec.Ingress[0].Ports[0].Port.String() != "http" {
				t.Errorf("gateway ingress = %+v, want only the API port", gw.Spec.Ingress)
			}
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pols := networkPolicies(t, render(t, append(slices.Clone(networkPolicyOn), tc.set...)...))
			mgr, gw := pols["macfleet-manager"], pols["macfleet-gateway"]
			if mgr == nil || gw == nil {
				t.Fatalf("NetworkPolicies %v, want macfleet-manager and macfleet-gateway", slices.Collect(maps.Keys(pols)))
			}
			tc.check(t, mgr, gw)
		})
	}

	t.Run("no gateway, no gateway policy", func(t *testing.T) {
		pols := networkPolicies(t, render(t, append(slices.Clone(networkPolicyOn), "gateway.enabled=false")...))
		if _, ok := pols["macfleet-gateway"]; ok || pols["macfleet-manager"] == nil {
			t.Errorf("NetworkPolicies %v, want only macfleet-manager", slices.Collect(maps.Keys(pols)))
		}
	})
}

// TestNetworkPolicyPortNames checks that every port the policies admit by name is a
// container port of the pods they select, so that a renamed port cannot silently
// close the gateway's API or the probes.
func TestNetworkPolicyPortNames(t *testing.T) {
	objs := render(t, networkPolicyOn...)
	for name, p := range networkPolicies(t, objs) {
		d := findDeployment(t, objs, name)
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("NetworkPolicy %s does not select the pods of Deployment %s", name, name)
		}
		for _, r := range p.Spec.Ingress {
			for _, port := range r.Ports {
				if port.Port.Type != intstr.String {
					continue
				}
				if !slices.ContainsFunc(d.Spec.Template.Spec.Containers[0].Ports, func(c corev1.ContainerPort) bool { return c.Name == port.Port.StrVal }) {
					t.Errorf("NetworkPolicy %s admits port %q, which %s's container does not name", name, port.Port.StrVal, name)
				}
			}
		}
	}
}

// TestNetworkPolicyRequiresAddresses: the two values without a safe default must be
// given, with a message that says how to find them.
func TestNetworkPolicyRequiresAddresses(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"networkPolicy.enabled=true", "networkPolicy.agents.cidrs={192.168.10.0/24}"}, "networkPolicy.apiServer.cidrs is empty"},
		{[]string{"networkPolicy.enabled=true", "networkPolicy.apiServer.cidrs={10.0.0.10/32}"}, "networkPolicy.agents.cidrs is empty"},
	} {
		args := []string{"template", "macfleet", chartDir(t)}
		for _, s := range tc.set {
			args = append(args, "--set", s)
		}
		_, err := helm(t, args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "docs/fleet.md") {
			t.Errorf("helm template --set %v: %v, want an error saying %q and pointing at docs/fleet.md", tc.set, err, tc.want)
		}
	}
}
