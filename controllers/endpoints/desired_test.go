package endpoints

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

var dep = &v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "qwen-7b", UID: "dep-uid"}}

var ownerRef = metav1.OwnerReference{APIVersion: "macfleet.dev/v1alpha1", Kind: "ModelDeployment", Name: "qwen-7b", UID: "dep-uid",
	Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}

func TestServiceName(t *testing.T) {
	long := strings.Repeat("a", 100)
	tests := []struct{ deployment, want string }{
		{"qwen-7b", "qwen-7b"},
		{"qwen2.5-7b", "qwen2-5-7b-0b1624b9"},
		{"7b", "md-7b-5de581fc"},
		{long, strings.Repeat("a", 54) + "-0a0bb1d9"},
		{strings.Repeat("a", 53) + "-.b", strings.Repeat("a", 53) + "-a8318563"},
	}
	for _, tt := range tests {
		got := ServiceName(tt.deployment)
		if got != tt.want {
			t.Errorf("ServiceName(%q) = %q, want %q", tt.deployment, got, tt.want)
		}
		if errs := validation.IsDNS1035Label(got); len(errs) > 0 {
			t.Errorf("ServiceName(%q) = %q is not a Service name: %v", tt.deployment, got, errs)
		}
	}
}

func TestDesiredService(t *testing.T) {
	want := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "qwen-7b", OwnerReferences: []metav1.OwnerReference{ownerRef},
			Labels: map[string]string{"app.kubernetes.io/managed-by": "macfleet", "macfleet.dev/deployment": "qwen-7b"}},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, AppProtocol: ptr.To("http"), Port: 8080,
				TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if diff := cmp.Diff(want, desiredService(dep)); diff != "" {
		t.Errorf("desiredService (-want +got):\n%s", diff)
	}
}

func readyCond(s metav1.ConditionStatus) []metav1.Condition {
	return []metav1.Condition{{Type: "Ready", Status: s, Reason: "R"}}
}

func replica(name, node string, ready metav1.ConditionStatus, mods ...func(*v1alpha1.ModelReplica)) v1alpha1.ModelReplica {
	mr := v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID(name + "-uid"), OwnerReferences: []metav1.OwnerReference{ownerRef}},
		Spec:       v1alpha1.ModelReplicaSpec{NodeName: node},
		Status:     v1alpha1.ModelReplicaStatus{Conditions: readyCond(ready)},
	}
	for _, m := range mods {
		m(&mr)
	}
	return mr
}

func terminating(mr *v1alpha1.ModelReplica) { mr.DeletionTimestamp = &metav1.Time{} }

// draining: the deployment controller is removing the replica (spec.drain).
func draining(mr *v1alpha1.ModelReplica) { mr.Spec.Drain = &metav1.Time{} }

func macNode(name, addr string, ready metav1.ConditionStatus) *v1alpha1.MacNode {
	return &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: v1alpha1.MacNodeStatus{Agent: v1alpha1.AgentStatus{Address: addr}, Conditions: readyCond(ready)}}
}

func nodeMap(nodes ...*v1alpha1.MacNode) map[string]*v1alpha1.MacNode {
	m := map[string]*v1alpha1.MacNode{}
	for _, n := range nodes {
		m[n.Name] = n
	}
	return m
}

// ep is an endpoint of replica on host (a MacNode name) at addr.
func ep(addr, host, replica string, ready, serving, term bool) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{
		Addresses:  []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(serving), Terminating: ptr.To(term)},
		TargetRef: &corev1.ObjectReference{APIVersion: "macfleet.dev/v1alpha1", Kind: "ModelReplica", Namespace: "team-a",
			Name: replica, UID: types.UID(replica + "-uid")},
	}
	if host != "" {
		e.Hostname = ptr.To(host)
	}
	return e
}

func slice(name string, t discoveryv1.AddressType, port int32, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
	s := discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, OwnerReferences: []metav1.OwnerReference{ownerRef},
			Labels: map[string]string{
				"kubernetes.io/service-name":             "qwen-7b",
				"endpointslice.kubernetes.io/managed-by": "endpoints-controller.macfleet.dev",
				"macfleet.dev/deployment":                "qwen-7b",
			}},
		AddressType: t,
		Endpoints:   eps,
	}
	if port != 0 {
		s.Ports = []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(port), AppProtocol: ptr.To("http")}}
	}
	return s
}

var placeholder = slice("qwen-7b-empty", discoveryv1.AddressTypeIPv4, 0)

func TestDesiredSlices(t *testing.T) {
	const (
		T = metav1.ConditionTrue
		F = metav1.ConditionFalse
		U = metav1.ConditionUnknown
	)
	tests := []struct {
		name        string
		replicas    []v1alpha1.ModelReplica
		nodes       map[string]*v1alpha1.MacNode
		want        []discoveryv1.EndpointSlice
		wantSkipped []string
	}{{
		name: "no replicas: one empty placeholder",
		want: []discoveryv1.EndpointSlice{placeholder},
	}, {
		name: "no ready replica: placeholder",
		replicas: []v1alpha1.ModelReplica{
			replica("r1", "mac-1", F), replica("r2", "mac-2", U), replica("r3", "", T),
			{ObjectMeta: metav1.ObjectMeta{Name: "no-conditions"}, Spec: v1alpha1.ModelReplicaSpec{NodeName: "mac-1"}},
		},
		nodes: nodeMap(macNode("mac-1", "10.0.0.1:8080", T), macNode("mac-2", "10.0.0.2:8080", T)),
		want:  []discoveryv1.EndpointSlice{placeholder},
	}, {
		name: "ready replicas on several nodes and ports, sorted by address type, port and node",
		replicas: []v1alpha1.ModelReplica{
			replica("r-c", "mac-3", T), replica("r-a", "mac-2", T), replica("r-b", "mac-1", T),
			replica("r-d", "mac-4", T), replica("r-e", "mac-5", T), replica("r-f", "mac-6", T),
		},
		nodes: nodeMap(
			macNode("mac-1", "10.0.0.1:8080", T), macNode("mac-2", "10.0.0.2:8080", T), macNode("mac-3", "10.0.0.3:9090", T),
			macNode("mac-4", "[2001:db8::4]:8080", T), macNode("mac-5", "Mac-5.Fleet.Example.:8080", T),
			macNode("mac-6", "[::ffff:10.0.0.6]:8080", T),
		),
		want: []discoveryv1.EndpointSlice{
			slice("qwen-7b-fqdn-8080", discoveryv1.AddressTypeFQDN, 8080, ep("mac-5.fleet.example", "mac-5", "r-e", true, true, false)),
			slice("qwen-7b-ipv4-8080", discoveryv1.AddressTypeIPv4, 8080,
				ep("10.0.0.1", "mac-1", "r-b", true, true, false),
				ep("10.0.0.2", "mac-2", "r-a", true, true, false),
				ep("10.0.0.6", "mac-6", "r-f", true, true, false)),
			slice("qwen-7b-ipv4-9090", discoveryv1.AddressTypeIPv4, 9090, ep("10.0.0.3", "mac-3", "r-c", true, true, false)),
			slice("qwen-7b-ipv6-8080", discoveryv1.AddressTypeIPv6, 8080, ep("2001:db8::4", "mac-4", "r-d", true, true, false)),
		},
	}, {
		name:     "node not Ready: endpoint neither ready nor serving",
		replicas: []v1alpha1.ModelReplica{replica("r1", "mac-1", T), replica("r2", "mac-2", T), replica("r3", "mac-3", T)},
		nodes:    nodeMap(macNode("mac-1", "10.0.0.1:8080", U), macNode("mac-2", "10.0.0.2:8080", F), macNode("mac-3", "10.0.0.3:8080", T)),
		want: []discoveryv1.EndpointSlice{slice("qwen-7b-ipv4-8080", discoveryv1.AddressTypeIPv4, 8080,
			ep("10.0.0.1", "mac-1", "r1", false, false, false),
			ep("10.0.0.2", "mac-2", "r2", false, false, false),
			ep("10.0.0.3", "mac-3", "r3", true, true, false))},
	}, {
		name: "replicas sharing a node are one endpoint; a terminating one only when alone",
		replicas: []v1alpha1.ModelReplica{
			replica("r2", "mac-1", T), replica("r1", "mac-1", T, terminating), replica("r3", "mac-1", T),
			replica("r4", "mac-2", T, terminating),
		},
		nodes: nodeMap(macNode("mac-1", "10.0.0.1:8080", T), macNode("mac-2", "10.0.0.2:8080", T)),
		want: []discoveryv1.EndpointSlice{slice("qwen-7b-ipv4-8080", discoveryv1.AddressTypeIPv4, 8080,
			ep("10.0.0.1", "mac-1", "r2", true, true, false),
			ep("10.0.0.2", "mac-2", "r4", false, true, true))},
	}, {
		name: "a draining replica is terminating, and stands for its Mac only when alone",
		replicas: []v1alpha1.ModelReplica{
			replica("r1", "mac-1", T, draining), replica("r2", "mac-1", T), replica("r3", "mac-2", T, draining),
		},
		nodes: nodeMap(macNode("mac-1", "10.0.0.1:8080", T), macNode("mac-2", "10.0.0.2:8080", T)),
		want: []discoveryv1.EndpointSlice{slice("qwen-7b-ipv4-8080", discoveryv1.AddressTypeIPv4, 8080,
			ep("10.0.0.1", "mac-1", "r2", true, true, false),
			ep("10.0.0.2", "mac-2", "r3", false, true, true))},
	}, {
		name: "replicas of other deployments are ignored",
		replicas: []v1alpha1.ModelReplica{
			replica("other", "mac-1", T, func(mr *v1alpha1.ModelReplica) { mr.OwnerReferences[0].UID = "other-uid" }),
			replica("orphan", "mac-1", T, func(mr *v1alpha1.ModelReplica) { mr.OwnerReferences = nil }),
		},
		nodes: nodeMap(macNode("mac-1", "10.0.0.1:8080", T)),
		want:  []discoveryv1.EndpointSlice{placeholder},
	}, {
		name:     "a node name that is not a DNS label is not a hostname",
		replicas: []v1alpha1.ModelReplica{replica("r1", "mac.1", T)},
		nodes:    nodeMap(macNode("mac.1", "10.0.0.1:8080", T)),
		want: []discoveryv1.EndpointSlice{slice("qwen-7b-ipv4-8080", discoveryv1.AddressTypeIPv4, 8080,
			ep("10.0.0.1", "", "r1", true, true, false))},
	}, {
		name: "unusable nodes are skipped with a reason",
		replicas: []v1alpha1.ModelReplica{
			replica("r1", "gone", T), replica("r2", "no-addr", T), replica("r3", "loop", T), replica("r4", "short", T),
			replica("r5", "badport", T), replica("r6", "ok", T),
		},
		nodes: nodeMap(macNode("no-addr", "", T), macNode("loop", "127.0.0.1:8080", T), macNode("short", "localhost:8080", T),
			macNode("badport", "10.0.0.5:0", T), macNode("ok", "10.0.0.6:8080", T)),
		want: []discoveryv1.EndpointSlice{slice("qwen-7b-ipv4-8080", discoveryv1.AddressTypeIPv4, 8080,
			ep("10.0.0.6", "ok", "r6", true, true, false))},
		wantSkipped: []string{
			`replica r1: MacNode gone not found`,
			`replica r2: MacNode no-addr: no agent address in its status`,
			`replica r3: MacNode loop: agent address "127.0.0.1:8080": unspecified, loopback and link-local addresses cannot be published in an EndpointSlice`,
			`replica r4: MacNode short: agent address "localhost:8080": address: Invalid value: "localhost": should be a domain with at least two segments separated by dots`,
			`replica r5: MacNode badport: agent address "10.0.0.5:0": invalid port`,
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, skipped := desiredSlices(dep, tt.replicas, tt.nodes, nil)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("desiredSlices (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantSkipped, skipped); diff != "" {
				t.Errorf("skipped (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDesiredSlicesChunks: more endpoints than a slice holds spill into numbered
// slices, in node order.
func TestDesiredSlicesChunks(t *testing.T) {
	var replicas []v1alpha1.ModelReplica
	var nodes []*v1alpha1.MacNode
	for i := range 2*MaxEndpointsPerSlice + 1 {
		n := fmt.Sprintf("mac-%03d", i)
		replicas = append(replicas, replica("r-"+n, n, metav1.ConditionTrue))
		nodes = append(nodes, macNode(n, fmt.Sprintf("10.0.%d.%d:8080", i/200, i%200+1), metav1.ConditionTrue))
	}
	got, _ := desiredSlices(dep, replicas, nodeMap(nodes...), nil)
	var summary []string
	for _, s := range got {
		summary = append(summary, fmt.Sprintf("%s:%d:%s..%s", s.Name, len(s.Endpoints), *s.Endpoints[0].Hostname, *s.Endpoints[len(s.Endpoints)-1].Hostname))
	}
	want := []string{
		"qwen-7b-ipv4-8080:100:mac-000..mac-099",
		"qwen-7b-ipv4-8080-1:100:mac-100..mac-199",
		"qwen-7b-ipv4-8080-2:1:mac-200..mac-200",
	}
	if diff := cmp.Diff(want, summary); diff != "" {
		t.Errorf("slices (-want +got):\n%s", diff)
	}
}

func TestParseAgentAddress(t *testing.T) {
	tests := []struct {
		in       string
		wantType discoveryv1.AddressType
		wantAddr string
		wantPort int32
		wantErr  bool
	}{
		{in: "192.168.1.20:8080", wantType: discoveryv1.AddressTypeIPv4, wantAddr: "192.168.1.20", wantPort: 8080},
		{in: "[fd00::1]:443", wantType: discoveryv1.AddressTypeIPv6, wantAddr: "fd00::1", wantPort: 443},
		{in: "[::ffff:192.168.1.20]:80", wantType: discoveryv1.AddressTypeIPv4, wantAddr: "192.168.1.20", wantPort: 80},
		{in: "studio-1.local:8080", wantType: discoveryv1.AddressTypeFQDN, wantAddr: "studio-1.local", wantPort: 8080},
		{in: "192.168.1.20", wantErr: true},
		{in: "192.168.1.20:65536", wantErr: true},
		{in: "192.168.1.20:http", wantErr: true},
		{in: "0.0.0.0:8080", wantErr: true},
		{in: "[::1]:8080", wantErr: true},
		{in: "169.254.1.1:8080", wantErr: true},
		{in: "[fe80::1%en0]:8080", wantErr: true},
		{in: "under_score.local:8080", wantErr: true},
		{in: "224.0.0.251:8080", wantErr: true},
		{in: "[ff02::1]:8080", wantErr: true},
		{in: "255.255.255.255:8080", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		typ, addr, port, err := parseAgentAddress(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("parseAgentAddress(%q) error = %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if typ != tt.wantType || addr != tt.wantAddr || port != tt.wantPort {
			t.Errorf("parseAgentAddress(%q) = %s %q %d, want %s %q %d", tt.in, typ, addr, port, tt.wantType, tt.wantAddr, tt.wantPort)
		}
	}
}
