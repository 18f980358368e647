package endpoints

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

func TestAddressExclusions(t *testing.T) {
	node := func(name, addr string) v1alpha1.MacNode { return *macNode(name, addr, metav1.ConditionTrue) }
	apiServer := apiServerAddresses{clusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		endpoints: []netip.AddrPort{netip.MustParseAddrPort("192.168.1.2:6443")}}
	tests := []struct {
		name  string
		nodes []v1alpha1.MacNode
		want  map[string]string
	}{
		{name: "distinct addresses", nodes: []v1alpha1.MacNode{node("a", "192.168.1.20:8080"), node("b", "192.168.1.21:8080")},
			want: map[string]string{}},
		{name: "one host, two ports (a fleet on one machine)",
			nodes: []v1alpha1.MacNode{node("a", "192.168.1.20:8080"), node("b", "192.168.1.20:8081")}, want: map[string]string{}},
		{name: "the kubernetes Service's cluster IP", nodes: []v1alpha1.MacNode{node("a", "10.96.0.1:443")},
			want: map[string]string{"a": "agent address 10.96.0.1:443 is an address of the API server, not a Mac's"}},
		{name: "the API server's endpoint, IPv4-mapped", nodes: []v1alpha1.MacNode{node("a", "[::ffff:192.168.1.2]:6443")},
			want: map[string]string{"a": "agent address 192.168.1.2:6443 is an address of the API server, not a Mac's"}},
		{name: "the API server's host, another port (a fleet on one machine)", nodes: []v1alpha1.MacNode{node("a", "192.168.1.2:8080")},
			want: map[string]string{}},
		{name: "a duplicate claim excludes both",
			nodes: []v1alpha1.MacNode{node("b", "192.168.1.20:8080"), node("a", "192.168.1.20:8080"), node("c", "192.168.1.30:8080")},
			want: map[string]string{
				"a": "agent address 192.168.1.20:8080 is claimed by several MacNodes ([a b])",
				"b": "agent address 192.168.1.20:8080 is claimed by several MacNodes ([a b])",
			}},
		{name: "host names and no address are parseAgentAddress's", nodes: []v1alpha1.MacNode{node("a", "studio.local:8080"), node("b", "")},
			want: map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, addressExclusions(tt.nodes, apiServer)); diff != "" {
				t.Errorf("addressExclusions (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDesiredSlicesLeaveOutExcluded: a Mac whose address is excluded contributes no
// endpoint, and the reason is said.
func TestDesiredSlicesLeaveOutExcluded(t *testing.T) {
	replicas := []v1alpha1.ModelReplica{replica("r1", "a", metav1.ConditionTrue), replica("r2", "b", metav1.ConditionTrue)}
	nodes := nodeMap(macNode("a", "192.168.1.20:8080", metav1.ConditionTrue), macNode("b", "10.96.0.1:443", metav1.ConditionTrue))
	got, skipped := desiredSlices(dep, replicas, nodes, map[string]string{"b": "agent address 10.96.0.1:443 is an address of the API server, not a Mac's"})
	var addrs []string
	for _, s := range got {
		for _, e := range s.Endpoints {
			addrs = append(addrs, e.Addresses...)
		}
	}
	if diff := cmp.Diff([]string{"192.168.1.20"}, addrs); diff != "" {
		t.Errorf("published addresses (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"replica r2: MacNode b: agent address 10.96.0.1:443 is an address of the API server, not a Mac's"}, skipped); diff != "" {
		t.Errorf("skipped (-want +got):\n%s", diff)
	}
}
