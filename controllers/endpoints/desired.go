package endpoints

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

const (
	// ServicePort is the port of every deployment's Service.
	ServicePort = 8080
	// PortName names the Service port and the EndpointSlice ports.
	PortName = "http"
	// ManagedBy is the endpointslice.kubernetes.io/managed-by value of the
	// EndpointSlices this controller owns. It is a label value, so it has no "/"; it
	// follows the Kubernetes controller's "endpointslice-controller.k8s.io".
	ManagedBy = "endpoints-controller.macfleet.dev"
	// LabelManagedBy and ManagedByValue mark the Services this controller owns.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "macfleet"
	// MaxEndpointsPerSlice is how many endpoints one EndpointSlice holds (the
	// Kubernetes EndpointSlice controller's default).
	MaxEndpointsPerSlice = 100
	// placeholderSuffix names the one empty EndpointSlice of a deployment without
	// endpoints.
	placeholderSuffix = "empty"
)

var deploymentKind = v1alpha1.GroupVersion.WithKind("ModelDeployment")

// ServiceName is the name of the Service of the deployment named deployment: the
// deployment's own name when it is a valid Service name (a DNS-1035 label),
// otherwise a label derived from it — dots become dashes, a leading digit gets an
// "md-" prefix, the result is cut to fit 63 characters and ends with a hash of the
// deployment's name, so that two deployments never share a derived name.
func ServiceName(deployment string) string {
	if len(validation.IsDNS1035Label(deployment)) == 0 {
		return deployment
	}
	h := fnv.New32a()
	h.Write([]byte(deployment))
	suffix := fmt.Sprintf("-%08x", h.Sum32())
	s := strings.ReplaceAll(strings.ToLower(deployment), ".", "-")
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		s = "md-" + s
	}
	s = strings.TrimRight(s[:min(len(s), validation.DNS1035LabelMaxLength-len(suffix))], "-")
	return s + suffix
}

// desiredService is the selector-less ClusterIP Service of dep.
func desiredService(dep *v1alpha1.ModelDeployment) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       dep.Namespace,
			Name:            ServiceName(dep.Name),
			Labels:          ownLabels(dep, map[string]string{LabelManagedBy: ManagedByValue}),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(dep, deploymentKind)},
		},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{
				Name:        PortName,
				Protocol:    corev1.ProtocolTCP,
				AppProtocol: ptr.To("http"),
				Port:        ServicePort,
				TargetPort:  intstr.FromInt32(ServicePort),
			}},
		},
	}
}

// ownLabels adds the deployment label to labels when the deployment's name is a
// valid label value.
func ownLabels(dep *v1alpha1.ModelDeployment, labels map[string]string) map[string]string {
	if len(validation.IsValidLabelValue(dep.Name)) == 0 {
		labels[v1alpha1.LabelDeployment] = dep.Name
	}
	return labels
}

// sliceKey groups endpoints into EndpointSlices: a slice has one address type and
// one port.
type sliceKey struct {
	addressType discoveryv1.AddressType
	port        int32
}

// nodeEndpoint is the endpoint of one Mac and the name it is sorted by.
type nodeEndpoint struct {
	node     string
	endpoint discoveryv1.Endpoint
}

// desiredSlices builds the EndpointSlices of dep: one endpoint per Mac that holds a
// Ready replica of dep (replicas sharing a Mac share its agent's address, so they
// are one endpoint), at the address and port of the Mac's agent, ready and serving
// only while the Mac is Ready. Endpoints are grouped by address type and port into
// slices named <service>-<type>-<port>[-<n>], at most MaxEndpointsPerSlice each, in
// a deterministic order. A deployment without endpoints has one empty placeholder
// slice, <service>-empty, so that a reader can tell "no endpoints" from "not
// processed yet" (as Kubernetes does for Services).
//
// replicas not controlled by dep, unbound, not Ready, or on a Mac missing from
// nodes, without a usable agent address or whose address is excluded (node name →
// why, from addressExclusions) are left out; skipped says why for the last three.
func desiredSlices(dep *v1alpha1.ModelDeployment, replicas []v1alpha1.ModelReplica, nodes map[string]*v1alpha1.MacNode,
	excluded map[string]string) (out []discoveryv1.EndpointSlice, skipped []string) {
	groups, skipped := groupEndpoints(chooseReplicas(dep, replicas), nodes, excluded)
	slices.Sort(skipped)

	svc := ServiceName(dep.Name)
	if len(groups) == 0 {
		return []discoveryv1.EndpointSlice{newSlice(dep, svc+"-"+placeholderSuffix, discoveryv1.AddressTypeIPv4, nil, nil)}, skipped
	}
	keys := make([]sliceKey, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b sliceKey) int {
		return cmp.Or(cmp.Compare(a.addressType, b.addressType), cmp.Compare(a.port, b.port))
	})
	for _, k := range keys {
		out = appendGroupSlices(out, dep, svc, k, groups[k])
	}
	return out, skipped
}

// chooseReplicas picks the replica each Mac's endpoint refers to, among the bound,
// Ready replicas controlled by dep: a non-terminating one if any, then the first by
// name.
func chooseReplicas(dep *v1alpha1.ModelDeployment, replicas []v1alpha1.ModelReplica) map[string]*v1alpha1.ModelReplica {
	chosen := map[string]*v1alpha1.ModelReplica{}
	for i := range replicas {
		mr := &replicas[i]
		if !metav1.IsControlledBy(mr, dep) || mr.Spec.NodeName == "" || !meta.IsStatusConditionTrue(mr.Status.Conditions, v1alpha1.ReplicaReady) {
			continue
		}
		if cur, ok := chosen[mr.Spec.NodeName]; !ok || betterReplica(mr, cur) {
			chosen[mr.Spec.NodeName] = mr
		}
	}
	return chosen
}

// groupEndpoints makes the endpoint of each chosen replica's Mac and groups them by
// address type and port; skipped says why a Mac missing from nodes, excluded, or
// without a usable agent address was left out (unsorted).
func groupEndpoints(chosen map[string]*v1alpha1.ModelReplica, nodes map[string]*v1alpha1.MacNode,
	excluded map[string]string) (groups map[sliceKey][]nodeEndpoint, skipped []string) {
	groups = map[sliceKey][]nodeEndpoint{}
	for nodeName, mr := range chosen {
		node, ok := nodes[nodeName]
		if !ok {
			skipped = append(skipped, fmt.Sprintf("replica %s: MacNode %s not found", mr.Name, nodeName))
			continue
		}
		if why := excluded[nodeName]; why != "" {
			skipped = append(skipped, fmt.Sprintf("replica %s: MacNode %s: %s", mr.Name, nodeName, why))
			continue
		}
		addrType, addr, port, err := parseAgentAddress(node.Status.Agent.Address)
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("replica %s: MacNode %s: %v", mr.Name, nodeName, err))
			continue
		}
		key := sliceKey{addressType: addrType, port: port}
		groups[key] = append(groups[key], nodeEndpoint{node: nodeName, endpoint: replicaEndpoint(mr, node, addr)})
	}
	return groups, skipped
}

// replicaEndpoint is the endpoint of mr on node at addr: ready while the Mac is
// Ready and mr is not terminating, serving while the Mac is Ready.
func replicaEndpoint(mr *v1alpha1.ModelReplica, node *v1alpha1.MacNode, addr string) discoveryv1.Endpoint {
	nodeName := mr.Spec.NodeName
	nodeReady := meta.IsStatusConditionTrue(node.Status.Conditions, v1alpha1.MacNodeReady)
	// A draining replica finishes its requests and goes: like a deleted one.
	terminating := mr.DeletionTimestamp != nil || mr.Spec.Drain != nil
	ep := discoveryv1.Endpoint{
		Addresses: []string{addr},
		Conditions: discoveryv1.EndpointConditions{
			Ready:       ptr.To(nodeReady && !terminating),
			Serving:     ptr.To(nodeReady),
			Terminating: ptr.To(terminating),
		},
		TargetRef: &corev1.ObjectReference{
			APIVersion: v1alpha1.GroupVersion.String(),
			Kind:       "ModelReplica",
			Namespace:  mr.Namespace,
			Name:       mr.Name,
			UID:        mr.UID,
		},
	}
	// The Mac's name, where a DNS label can hold it (nodeName refers to core Nodes).
	if len(validation.IsDNS1123Label(nodeName)) == 0 {
		ep.Hostname = ptr.To(nodeName)
	}
	return ep
}

// appendGroupSlices appends to out the slices of one group k of endpoints, sorted by
// Mac name and cut into slices of at most MaxEndpointsPerSlice, named
// <svc>-<type>-<port>[-<n>].
func appendGroupSlices(out []discoveryv1.EndpointSlice, dep *v1alpha1.ModelDeployment, svc string, k sliceKey,
	eps []nodeEndpoint) []discoveryv1.EndpointSlice {
	slices.SortFunc(eps, func(a, b nodeEndpoint) int { return cmp.Compare(a.node, b.node) })
	ports := []discoveryv1.EndpointPort{{
		Name:        ptr.To(PortName),
		Protocol:    ptr.To(corev1.ProtocolTCP),
		Port:        ptr.To(k.port),
		AppProtocol: ptr.To("http"),
	}}
	base := fmt.Sprintf("%s-%s-%d", svc, strings.ToLower(string(k.addressType)), k.port)
	for i := 0; i*MaxEndpointsPerSlice < len(eps); i++ {
		name := base
		if i > 0 {
			name = fmt.Sprintf("%s-%d", base, i)
		}
		var chunk []discoveryv1.Endpoint
		for _, ne := range eps[i*MaxEndpointsPerSlice : min(len(eps), (i+1)*MaxEndpointsPerSlice)] {
			chunk = append(chunk, ne.endpoint)
		}
		out = append(out, newSlice(dep, name, k.addressType, ports, chunk))
	}
	return out
}

// betterReplica says whether a should stand for its Mac rather than b.
func betterReplica(a, b *v1alpha1.ModelReplica) bool {
	if (a.DeletionTimestamp == nil) != (b.DeletionTimestamp == nil) {
		return a.DeletionTimestamp == nil
	}
	if (a.Spec.Drain == nil) != (b.Spec.Drain == nil) {
		return a.Spec.Drain == nil
	}
	return a.Name < b.Name
}

func newSlice(dep *v1alpha1.ModelDeployment, name string, t discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps []discoveryv1.Endpoint) discoveryv1.EndpointSlice {
	return discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: dep.Namespace,
			Name:      name,
			Labels: ownLabels(dep, map[string]string{
				discoveryv1.LabelServiceName: ServiceName(dep.Name),
				discoveryv1.LabelManagedBy:   ManagedBy,
			}),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(dep, deploymentKind)},
		},
		AddressType: t,
		Endpoints:   eps,
		Ports:       ports,
	}
}

// parseAgentAddress splits an agent's host:port into what an EndpointSlice holds.
// IP addresses the API server refuses in EndpointSlices (unspecified, loopback,
// link-local), addresses no single host answers at (multicast, IPv4 broadcast) and
// hosts that are not fully qualified domain names are errors.
func parseAgentAddress(hostport string) (discoveryv1.AddressType, string, int32, error) {
	if hostport == "" {
		return "", "", 0, fmt.Errorf("no agent address in its status")
	}
	host, portStr, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", "", 0, fmt.Errorf("agent address %q: %w", hostport, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return "", "", 0, fmt.Errorf("agent address %q: invalid port", hostport)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		ip = ip.Unmap()
		switch {
		case ip.Zone() != "":
			return "", "", 0, fmt.Errorf("agent address %q: an IPv6 zone cannot be published", hostport)
		case ip.IsUnspecified(), ip.IsLoopback(), ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
			return "", "", 0, fmt.Errorf("agent address %q: unspecified, loopback and link-local addresses cannot be published in an EndpointSlice", hostport)
		case ip.IsMulticast(), ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
			return "", "", 0, fmt.Errorf("agent address %q: a multicast or broadcast address is no Mac's own", hostport)
		case ip.Is4():
			return discoveryv1.AddressTypeIPv4, ip.String(), int32(port), nil
		default:
			return discoveryv1.AddressTypeIPv6, ip.String(), int32(port), nil
		}
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if errs := validation.IsFullyQualifiedDomainName(field.NewPath("address"), host); len(errs) > 0 {
		return "", "", 0, fmt.Errorf("agent address %q: %s", hostport, errs.ToAggregate())
	}
	return discoveryv1.AddressTypeFQDN, host, int32(port), nil
}
