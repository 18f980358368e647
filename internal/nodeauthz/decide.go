// Package nodeauthz is the node authorizer: an authorization webhook, served by the
// manager, that lets each Mac's credential read the ModelReplicas bound to that Mac and
// no others — the read side of config/admission/node-restriction.yaml, in the way the
// kubelet's Node authorizer ties a kubelet to the pods of its node.
//
// RBAC cannot tell one node identity from another (they share one group), so it no
// longer grants node identities any read of modelreplicas. The API server asks this
// webhook, after RBAC, about the requests of node identities only (the matchConditions
// of the AuthorizationConfiguration in config/authorization). Decide allows
//   - list and watch of modelreplicas whose field selector requires
//     spec.nodeName=<node> (the agent's cache), in any namespace or all of them;
//   - list and watch of modelreplicas whose label selector requires the label
//     v1alpha1.ShardLabel(<node>) (the replicas split across Macs in which <node> holds a
//     worker shard; the scheduler sets the label when it binds the gang);
//   - get of a modelreplica, or of its status, that the manager's cache shows bound to
//     <node> or holding a worker shard on <node>;
//
// and denies every other read (get, list, watch) of modelreplicas by a node identity.
// It has no opinion on anything else — the writes RBAC grants and the admission policy
// narrows, other users, other resources.
//
// The API server asks it before RBAC (config/authorization), so its denial stands even
// where RBAC grants node identities every replica read: the chart's default mode "auto"
// installs that grant as the fallback for API servers that cannot be wired to the
// webhook (managed control planes), and the webhook, once wired, takes the reads back
// to each Mac's own. Preflight tells which is in force.
package nodeauthz

import (
	"slices"
	"strings"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// nodeUserPrefix starts the username of every node identity: the ServiceAccounts of
// v1alpha1.NodeIdentityNamespace.
const nodeUserPrefix = "system:serviceaccount:" + v1alpha1.NodeIdentityNamespace + ":"

// Request is what Decide reads of a SubjectAccessReview.
type Request struct {
	User string
	// Verb, Group, Resource, Subresource, Namespace and Name are the resource
	// attributes; a non-resource request has an empty Resource.
	Verb, Group, Resource, Subresource, Namespace, Name string
	// FieldSelector holds the requirements of a list's or a watch's field selector, as
	// the API server parsed them.
	FieldSelector []Requirement
	// LabelSelector holds those of its label selector.
	LabelSelector []Requirement
}

// Requirement is one term of a field selector: Key Operator Values, Operator being
// one of In, NotIn, Exists, DoesNotExist (spec.nodeName=x arrives as In [x]).
type Requirement struct {
	Key      string
	Operator string
	Values   []string
}

// Binding is where a ModelReplica runs: the node it is bound to ("" while unbound) and,
// for a replica split across Macs, the nodes of its worker shards.
type Binding struct {
	Node    string
	Workers []string
}

// BindingLookup returns a ModelReplica's binding and whether the replica exists.
type BindingLookup func(namespace, name string) (b Binding, found bool)

// Decision is the answer: Allowed, Denied (no authorizer after it is asked), or
// neither: no opinion (the next authorizer, RBAC, decides).
type Decision struct {
	Allowed bool
	Denied  bool
	// Reason says why, for the API server's audit log and the webhook's own.
	Reason string
}

// Decide answers a request. It consults lookup only for a get of a replica by a node
// identity.
func Decide(r Request, lookup BindingLookup) Decision {
	node, ok := NodeOf(r.User)
	if !ok {
		return Decision{Reason: "not a node identity"}
	}
	if r.Group != v1alpha1.GroupVersion.Group || r.Resource != "modelreplicas" {
		return Decision{Reason: "not a ModelReplica"}
	}
	d := decideReplica(r, node, lookup)
	// A read this authorizer does not allow is denied, so that RBAC's fallback grant
	// (mode auto) cannot allow it; writes are RBAC's and the admission policy's.
	if !d.Allowed && (r.Verb == "get" || r.Verb == "list" || r.Verb == "watch") {
		d.Denied = true
	}
	return d
}

// decideReplica decides a node identity's request about modelreplicas: Allowed or not.
func decideReplica(r Request, node string, lookup BindingLookup) Decision {
	switch {
	case r.Subresource != "" && !(r.Subresource == "status" && r.Verb == "get"):
		return Decision{Reason: "node " + node + " may not " + r.Verb + " modelreplicas/" + r.Subresource + " by this authorizer"}
	case r.Verb == "list" || r.Verb == "watch":
		if requiresNode(r.FieldSelector, node) {
			return Decision{Allowed: true, Reason: "node " + node + " may " + r.Verb + " the replicas bound to it"}
		}
		if requiresLabel(r.LabelSelector, v1alpha1.ShardLabel(node)) {
			return Decision{Allowed: true, Reason: "node " + node + " may " + r.Verb + " the replicas holding a worker shard on it"}
		}
		return Decision{Reason: "node " + node + " may " + r.Verb + " replicas only with the field selector " +
			v1alpha1.ReplicaNodeNameField + "=" + node + " or the label selector " + v1alpha1.ShardLabel(node)}
	case r.Verb == "get" && r.Name != "" && r.Namespace != "":
		b, found := lookup(r.Namespace, r.Name)
		switch {
		case !found:
			return Decision{Reason: "replica " + r.Namespace + "/" + r.Name + " is unknown to the manager"}
		case b.Node == node:
			return Decision{Allowed: true, Reason: "replica " + r.Namespace + "/" + r.Name + " is bound to node " + node}
		case slices.Contains(b.Workers, node):
			return Decision{Allowed: true, Reason: "replica " + r.Namespace + "/" + r.Name + " holds a worker shard on node " + node}
		}
		return Decision{Reason: "replica " + r.Namespace + "/" + r.Name + " is not bound to node " + node}
	}
	return Decision{Reason: "node " + node + " may not " + r.Verb + " modelreplicas by this authorizer"}
}

// NodeOf returns the node a username is the identity of: <node> for
// system:serviceaccount:macfleet-nodes:<node>.
func NodeOf(user string) (string, bool) {
	node, ok := strings.CutPrefix(user, nodeUserPrefix)
	if !ok || node == "" || strings.Contains(node, ":") {
		return "", false
	}
	return node, true
}

// requiresNode reports whether a field selector matches only objects whose
// spec.nodeName is node. Further terms only narrow it.
func requiresNode(sel []Requirement, node string) bool {
	for _, req := range sel {
		if req.Key == v1alpha1.ReplicaNodeNameField && req.Operator == "In" && len(req.Values) == 1 && req.Values[0] == node {
			return true
		}
	}
	return false
}

// requiresLabel reports whether a label selector matches only objects that carry the
// label key: a term Exists, or In some values. Further terms only narrow it.
func requiresLabel(sel []Requirement, key string) bool {
	for _, req := range sel {
		if req.Key == key && (req.Operator == "Exists" || (req.Operator == "In" && len(req.Values) > 0)) {
			return true
		}
	}
	return false
}
