package endpoints

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// A Mac's agent address is its own claim, and it lands in tenants' EndpointSlices:
// what can never be a Mac's own address is left out. parseAgentAddress refuses the
// addresses no host can be reached at (unspecified, loopback, link-local,
// multicast, broadcast); addressExclusions refuses the API server's addresses (its
// cluster IPs, and its endpoints' host:port) and an address two Macs claim.

// reservedTTL is how long the API server's addresses are reused before they are read
// again.
const reservedTTL = time.Minute

// apiServerAddresses are the addresses of the API server: the cluster IPs of the
// kubernetes Service (virtual: no host has them, whatever the port) and the
// host:port pairs of its endpoints (a fleet on one machine shares the API server's
// host, not its port).
type apiServerAddresses struct {
	clusterIPs []netip.Addr
	endpoints  []netip.AddrPort
}

// addressExclusions maps the name of each MacNode whose agent address is not its own
// to why: an address of the API server, or a host:port that another MacNode claims
// too (neither is published: which of them lies cannot be told here; the admission
// policy config/admission/node-claims.yaml refuses the second claim).
func addressExclusions(nodes []v1alpha1.MacNode, reserved apiServerAddresses) map[string]string {
	out := map[string]string{}
	owners := map[netip.AddrPort][]string{}
	for i := range nodes {
		n := &nodes[i]
		ap, err := netip.ParseAddrPort(n.Status.Agent.Address)
		if err != nil {
			continue // a host name or no address: parseAgentAddress decides
		}
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		if slices.Contains(reserved.clusterIPs, ap.Addr()) || slices.Contains(reserved.endpoints, ap) {
			out[n.Name] = fmt.Sprintf("agent address %s is an address of the API server, not a Mac's", ap)
			continue
		}
		owners[ap] = append(owners[ap], n.Name)
	}
	for ap, names := range owners {
		if len(names) < 2 {
			continue
		}
		slices.Sort(names)
		for _, name := range names {
			out[name] = fmt.Sprintf("agent address %s is claimed by several MacNodes (%v)", ap, names)
		}
	}
	return out
}

// reservedAddresses caches the API server's addresses for reservedTTL.
type reservedAddresses struct {
	mu    sync.Mutex
	at    time.Time
	addrs apiServerAddresses
}

// get returns the addresses of the API server: the cluster IPs of Service
// default/kubernetes and the addresses of its EndpointSlices, read with c (the API
// server, not the manager's cache, which holds only this controller's Services and
// slices). What does not exist is not an error: there is nothing to reserve.
func (r *reservedAddresses) get(ctx context.Context, c client.Reader, now time.Time) (apiServerAddresses, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.at.IsZero() && now.Sub(r.at) < reservedTTL {
		return r.addrs, nil
	}
	var addrs apiServerAddresses
	var svc corev1.Service
	switch err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "kubernetes"}, &svc); {
	case err == nil:
		for _, ip := range append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...) {
			if a, err := netip.ParseAddr(ip); err == nil {
				addrs.clusterIPs = append(addrs.clusterIPs, a.Unmap())
			}
		}
	case !apierrors.IsNotFound(err):
		return addrs, fmt.Errorf("reading Service default/kubernetes: %w", err)
	}
	var slices discoveryv1.EndpointSliceList
	if err := c.List(ctx, &slices, client.InNamespace("default"),
		client.MatchingLabels{discoveryv1.LabelServiceName: "kubernetes"}); err != nil {
		return addrs, fmt.Errorf("listing the EndpointSlices of Service default/kubernetes: %w", err)
	}
	for _, s := range slices.Items {
		for _, ep := range s.Endpoints {
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil {
					continue
				}
				for _, p := range s.Ports {
					if p.Port != nil {
						addrs.endpoints = append(addrs.endpoints, netip.AddrPortFrom(ip.Unmap(), uint16(*p.Port)))
					}
				}
			}
		}
	}
	r.at, r.addrs = now, addrs
	return addrs, nil
}
