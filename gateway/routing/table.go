package routing

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/peerfetch"
	"github.com/macfleet/macfleet/gateway/tenancy"
)

// Backend is one routable replica.
type Backend struct {
	// Key is the replica's "<namespace>/<name>", sent as X-Macfleet-Replica and used as
	// its identity for balancing.
	Key string
	// Endpoint is the host:port of the agent serving it, and Node its Mac (the
	// replica's spec.nodeName, set by the scheduler): the agent's certificate must
	// name that Mac.
	Endpoint string
	Node     string
	// Slots is its engine's sequence slots (engine.parallel, at least 1): how many
	// requests it generates at once.
	Slots int
	// Context is its engine's contextLength, the tokens of one sequence (0: unknown):
	// what bounds the usage its Mac may report for one sequence (meter).
	Context int
	// Link is its Mac's link as the MacNode declares it (spec.link, else status.link;
	// zero when neither is set), the prior of a peer fetch's link before one is
	// measured (peerfetch.DeclaredLink).
	Link peerfetch.Link
}

// Route is one ModelDeployment as the gateway sees it.
type Route struct {
	Namespace  string
	Deployment string
	// ServedName is spec.model.servedName, or the deployment's name.
	ServedName string
	Aliases    []string
	Created    time.Time
	// Backends are the routable replicas, sorted by key.
	Backends []Backend
	// Replicas counts the deployment's replicas that exist, routable or not.
	Replicas int
	// Unavailable, when not empty, says why no replica is coming (scaled to zero, or
	// the deployment cannot be placed): a request that finds no backend fails at once
	// instead of being held for a cold start, unless the gateway can wake it.
	Unavailable string
	// Autoscaled: the deployment has spec.autoscaling, so a request held for it wakes
	// it (see waker); ScaledToZero: its spec.replicas is 0.
	Autoscaled, ScaledToZero bool
	// WakeRequested is the time in its AnnotationWakeRequested, zero when none.
	WakeRequested time.Time
	// MaxReplicas is spec.autoscaling.maxReplicas (0 when not autoscaled): requests
	// queued because every replica is busy wake the autoscaler only below it.
	MaxReplicas int
	// Access is spec.access.namespaces: the other namespaces whose keys may use it.
	Access []string
	// Context is its template's engine contextLength (0: unset), what a request's
	// TokenBudget reservation bounds its output by when it sets no max_tokens.
	Context int
	// PromptCache: its replicas' runners keep a prompt cache (spec.engine.promptCache,
	// on unless disabled), so RoutingPrefixCache routes it by the prefix index.
	PromptCache bool
	// PeerWarmup: spec.engine.promptCache.peerWarmup is true, so the gateway warms its
	// replicas that start cold from their peers (warmer.cold); off unless set.
	PeerWarmup bool

	// ring is built on the first prefix-affinity pick (most tables never need one).
	ringOnce sync.Once
	ring     ring
}

// hashRing is the route's consistent-hash ring of its backends.
func (r *Route) hashRing() ring {
	r.ringOnce.Do(func() { r.ring = newRing(r.Backends) })
	return r.ring
}

// ID is "<namespace>/<deployment>", the route's label in metrics and logs.
func (r *Route) ID() string { return r.Namespace + "/" + r.Deployment }

// Table is an immutable snapshot of every deployment's routable replicas, indexed by
// the names clients use. A new snapshot replaces it whenever an informer reports a
// change; Changed is closed then, waking requests held for a cold start.
type Table struct {
	routes    []*Route
	byID      map[string]*Route
	bare      map[string][]*Route
	qualified map[string][]*Route
	changed   chan struct{}
	// nodeReady: the Macs by name, whether their MacNode is Ready (see MacLost).
	nodeReady map[string]bool
	// starting marks the table a gateway serves before its first SetTable: it knows
	// no deployment yet, which does not mean that none exists.
	starting bool
}

func emptyTable() *Table {
	return &Table{byID: map[string]*Route{}, bare: map[string][]*Route{}, qualified: map[string][]*Route{},
		changed: make(chan struct{})}
}

// StartingTable is served before the informers have synced: every model is a
// retryable 503, not a 404 (a restarted gateway's listener accepts requests before
// its table is built, and a client told "no such model" would not retry).
func StartingTable() *Table {
	t := emptyTable()
	t.starting = true
	return t
}

// Changed is closed when a newer table replaces this one.
func (t *Table) Changed() <-chan struct{} { return t.changed }

// Replaced closes Changed: the gateway serves a newer table. It is called once.
func (t *Table) Replaced() { close(t.changed) }

// TableOf is a table of routes alone, indexed by their names, with no Mac known to
// be ready (tests' tables).
func TableOf(routes ...*Route) *Table {
	t := emptyTable()
	t.routes = routes
	t.index()
	return t
}

// MacLost reports whether the table knows Mac name to be lost: its MacNode is not
// Ready (its lease expired, or it reports itself not ready) or is gone. The table a
// gateway serves before its first snapshot loses none.
func (t *Table) MacLost(name string) bool { return !t.starting && !t.nodeReady[name] }

// Routes lists the deployments sorted by namespace and name.
func (t *Table) Routes() []*Route { return t.routes }

// BackendOf is the routable replica key and its deployment's route; ok false when
// no route has it.
func (t *Table) BackendOf(key string) (*Route, Backend, bool) {
	for _, rt := range t.routes {
		for _, be := range rt.Backends {
			if be.Key == key {
				return rt, be, true
			}
		}
	}
	return nil, Backend{}, false
}

// BuildTable computes the routing table from the deployments, replicas and Macs. A
// replica is routable when its Ready condition is True, its status.endpoint is set,
// it is not being deleted and its MacNode's Ready condition is True. Replicas belong
// to the deployment named by their macfleet.dev/deployment label in their namespace
// and are routed under the deployment's current names (like a Service's endpoints,
// replicas of the previous template keep serving during a rollout).
func BuildTable(deployments []mfv1.ModelDeployment, replicas []mfv1.ModelReplica, nodes []mfv1.MacNode) *Table {
	t := emptyTable()
	nodeReady := make(map[string]bool, len(nodes))
	t.nodeReady = nodeReady
	nodeLink := make(map[string]peerfetch.Link, len(nodes))
	for i := range nodes {
		nodeReady[nodes[i].Name] = meta.IsStatusConditionTrue(nodes[i].Status.Conditions, mfv1.MacNodeReady)
		nodeLink[nodes[i].Name] = declaredLink(&nodes[i])
	}
	byID := t.byID
	for i := range deployments {
		d := &deployments[i]
		if d.DeletionTimestamp != nil {
			continue
		}
		rt := &Route{Namespace: d.Namespace, Deployment: d.Name, ServedName: d.Spec.Model.ServedName,
			Created: d.CreationTimestamp.Time, Context: int(d.Spec.Engine.ContextLength)}
		if rt.ServedName == "" {
			rt.ServedName = d.Name
		}
		for _, a := range d.Spec.Model.Aliases {
			if a != "" && a != rt.ServedName && !slices.Contains(rt.Aliases, a) {
				rt.Aliases = append(rt.Aliases, a)
			}
		}
		rt.Unavailable = unavailable(d)
		if as := d.Spec.Autoscaling; as != nil {
			rt.Autoscaled, rt.MaxReplicas = true, int(as.MaxReplicas)
		}
		rt.ScaledToZero = d.Spec.Replicas != nil && *d.Spec.Replicas == 0
		if d.Spec.Access != nil {
			rt.Access = d.Spec.Access.Namespaces
		}
		pc := d.Spec.Engine.PromptCache
		rt.PromptCache = pc == nil || pc.Enabled == nil || *pc.Enabled
		rt.PeerWarmup = rt.PromptCache && pc != nil && pc.PeerWarmup != nil && *pc.PeerWarmup
		if v, ok := d.Annotations[mfv1.AnnotationWakeRequested]; ok {
			rt.WakeRequested, _ = time.Parse(time.RFC3339Nano, v)
		}
		byID[rt.ID()] = rt
		t.routes = append(t.routes, rt)
	}
	for i := range replicas {
		r := &replicas[i]
		rt := byID[r.Namespace+"/"+r.Labels[mfv1.LabelDeployment]]
		if rt == nil || r.DeletionTimestamp != nil || r.Spec.Drain != nil {
			continue // leaving: a draining replica serves only the requests it has
		}
		rt.Replicas++
		if meta.IsStatusConditionTrue(r.Status.Conditions, mfv1.ReplicaReady) && r.Status.Endpoint != "" &&
			r.Spec.NodeName != "" && nodeReady[r.Spec.NodeName] {
			rt.Backends = append(rt.Backends, Backend{Key: r.Namespace + "/" + r.Name, Endpoint: r.Status.Endpoint, Node: r.Spec.NodeName,
				Slots: max(int(r.Spec.Template.Engine.Parallel), 1), Context: int(r.Spec.Template.Engine.ContextLength),
				Link: nodeLink[r.Spec.NodeName]})
		}
	}
	slices.SortFunc(t.routes, func(a, b *Route) int { return strings.Compare(a.ID(), b.ID()) })
	for _, rt := range t.routes {
		slices.SortFunc(rt.Backends, func(a, b Backend) int { return strings.Compare(a.Key, b.Key) })
	}
	t.index()
	return t
}

// index files t's routes under the names clients use: each served name and alias,
// bare and qualified by the namespace.
func (t *Table) index() {
	for _, rt := range t.routes {
		t.byID[rt.ID()] = rt
		for _, name := range append([]string{rt.ServedName}, rt.Aliases...) {
			t.bare[name] = append(t.bare[name], rt)
			q := rt.Namespace + "/" + name
			t.qualified[q] = append(t.qualified[q], rt)
		}
	}
}

// declaredLink is the link n declares: spec.link where set, else status.link (the
// agent's measure), as a peer fetch's prior (peerfetch.DeclaredLink).
func declaredLink(n *mfv1.MacNode) peerfetch.Link {
	l := n.Spec.Link
	if l == nil {
		l = n.Status.Link
	}
	if l == nil {
		return peerfetch.Link{}
	}
	var bps float64
	if l.Bandwidth != nil {
		bps = l.Bandwidth.AsApproximateFloat64()
	}
	var rtt time.Duration
	if l.RTT != nil {
		rtt = l.RTT.Duration
	}
	return peerfetch.DeclaredLink(bps, rtt)
}

// unavailable says why a deployment will have no routable replica however long a
// request waits, or "" when replicas are (or may soon be) coming.
func unavailable(d *mfv1.ModelDeployment) string {
	if d.Spec.Replicas != nil && *d.Spec.Replicas == 0 {
		return fmt.Sprintf("deployment %s/%s is scaled to zero replicas", d.Namespace, d.Name)
	}
	c := meta.FindStatusCondition(d.Status.Conditions, mfv1.DeploymentScheduled)
	if c != nil && c.Status == metav1.ConditionFalse &&
		(c.Reason == mfv1.ReasonUnschedulable || c.Reason == mfv1.ReasonEstimateFailed) {
		return fmt.Sprintf("deployment %s/%s cannot be placed: %s", d.Namespace, d.Name, c.Message)
	}
	return ""
}

// Why a model resolves to no route (Refusal.Reason).
const (
	// RefusedStarting: the table is the one served before the first snapshot.
	RefusedStarting = "starting"
	// RefusedNotFound: no deployment the caller may use serves the name.
	RefusedNotFound = "model_not_found"
	// RefusedAmbiguous: a bare name served by several deployments the caller may use.
	RefusedAmbiguous = "ambiguous_model"
)

// Refusal is why a model resolves to no route: Reason is one of the Refused…
// constants; Message says how to qualify an ambiguous name.
type Refusal struct {
	Reason  string
	Model   string
	Message string
}

func (r *Refusal) Error() string {
	if r.Message != "" {
		return r.Message
	}
	return r.Reason + ": " + r.Model
}

// RoutesFor lists the deployments id may use (tenancy.MayUse), sorted by namespace
// and name.
func (t *Table) RoutesFor(id tenancy.Identity) []*Route { return visible(t.routes, id) }

// ClientName is the name a client should send for rt: its served name when that
// names only rt among the deployments id may use, else "<namespace>/<servedName>".
// Aliases are not names of their own (one entry per deployment in GET /v1/models).
func (t *Table) ClientName(rt *Route, id tenancy.Identity) string {
	if rs := visible(t.bare[rt.ServedName], id); len(rs) == 1 {
		return rt.ServedName
	}
	return rt.Namespace + "/" + rt.ServedName
}

// Route is the deployment "<namespace>/<name>" (a Route's ID), or nil.
func (t *Table) Route(id string) *Route { return t.byID[id] }

// Resolve finds the deployment a request's model names: "<namespace>/<name>" first
// (it always works), then the bare served name or alias. A bare name served in
// several namespaces is a 400 asking the client to qualify it.
func (t *Table) Resolve(model string) (*Route, *Refusal) {
	if t.starting {
		return nil, &Refusal{Reason: RefusedStarting, Model: model}
	}
	if rs := t.qualified[model]; len(rs) > 0 {
		return one(model, rs)
	}
	rs := t.bare[model]
	if len(rs) == 0 {
		return nil, &Refusal{Reason: RefusedNotFound, Model: model}
	}
	return one(model, rs)
}

// ResolveAs is Resolve for the caller id: a deployment it may not use
// (tenancy.MayUse) is answered exactly as one that does not exist, and a bare name is
// ambiguous only among the deployments it may use.
func (t *Table) ResolveAs(model string, id tenancy.Identity) (*Route, *Refusal) {
	if id.Admin {
		return t.Resolve(model)
	}
	if t.starting {
		return nil, &Refusal{Reason: RefusedStarting, Model: model}
	}
	rs := visible(t.qualified[model], id)
	if len(rs) == 0 {
		rs = visible(t.bare[model], id)
	}
	if len(rs) == 0 {
		return nil, &Refusal{Reason: RefusedNotFound, Model: model}
	}
	return one(model, rs)
}

// visible is the routes of rs that id may use; rs itself when it may use them all
// (no copy).
func visible(rs []*Route, id tenancy.Identity) []*Route {
	for i, rt := range rs {
		if !tenancy.MayUse(id, rt.Namespace, rt.Access) {
			out := slices.Clone(rs[:i])
			for _, rt := range rs[i+1:] {
				if tenancy.MayUse(id, rt.Namespace, rt.Access) {
					out = append(out, rt)
				}
			}
			return out
		}
	}
	return rs
}

func one(model string, rs []*Route) (*Route, *Refusal) {
	if len(rs) == 1 {
		return rs[0], nil
	}
	var namespaces, ids []string
	for _, rt := range rs {
		if !slices.Contains(namespaces, rt.Namespace) {
			namespaces = append(namespaces, rt.Namespace)
		}
		ids = append(ids, rt.ID())
	}
	if len(namespaces) > 1 {
		return nil, &Refusal{Reason: RefusedAmbiguous, Model: model,
			Message: fmt.Sprintf("model %q is served in namespaces %s: qualify it as \"<namespace>/%s\", e.g. %q",
				model, strings.Join(namespaces, ", "), model, namespaces[0]+"/"+model)}
	}
	return nil, &Refusal{Reason: RefusedAmbiguous, Model: model,
		Message: fmt.Sprintf("model %q names several deployments (%s): give each a distinct servedName or alias",
			model, strings.Join(ids, ", "))}
}

// Key is what of an object the table depends on: an informer update that leaves
// it unchanged (download progress, memory figures, heartbeats) does not rebuild the
// table.
func Key(obj any) string {
	var b strings.Builder
	cond := func(conds []metav1.Condition, typ string) {
		if c := meta.FindStatusCondition(conds, typ); c != nil {
			b.WriteString(string(c.Status) + "|" + c.Reason + "|" + c.Message)
		}
		b.WriteByte(0)
	}
	switch o := obj.(type) {
	case *mfv1.MacNode:
		b.WriteString(o.Name + "\x00")
		cond(o.Status.Conditions, mfv1.MacNodeReady)
	case *mfv1.ModelReplica:
		fmt.Fprintf(&b, "%s\x00%s\x00%s\x00%s\x00%v\x00%v\x00%d\x00", o.Namespace, o.Name, o.Labels[mfv1.LabelDeployment],
			o.Spec.NodeName, o.DeletionTimestamp != nil, o.Spec.Drain != nil, o.Spec.Template.Engine.Parallel)
		b.WriteString(o.Status.Endpoint + "\x00")
		cond(o.Status.Conditions, mfv1.ReplicaReady)
	case *mfv1.ModelDeployment:
		fmt.Fprintf(&b, "%s\x00%s\x00%s\x00%q\x00%v\x00%d\x00%v\x00%v\x00%s\x00", o.Namespace, o.Name, o.Spec.Model.ServedName,
			o.Spec.Model.Aliases, o.Spec.Replicas == nil, ptrValue(o.Spec.Replicas), o.DeletionTimestamp != nil,
			o.Spec.Autoscaling != nil, o.Annotations[mfv1.AnnotationWakeRequested])
		if o.Spec.Access != nil {
			fmt.Fprintf(&b, "%q\x00", o.Spec.Access.Namespaces)
		}
		if o.Spec.Autoscaling != nil {
			fmt.Fprintf(&b, "%d\x00", o.Spec.Autoscaling.MaxReplicas)
		}
		pc := o.Spec.Engine.PromptCache
		fmt.Fprintf(&b, "cache=%v,%v\x00", pc == nil || pc.Enabled == nil || *pc.Enabled, pc != nil && pc.PeerWarmup != nil && *pc.PeerWarmup)
		cond(o.Status.Conditions, mfv1.DeploymentScheduled)
	default:
		return fmt.Sprintf("%T %p", obj, obj) // unknown: always rebuild
	}
	return b.String()
}

func ptrValue(p *int32) int32 {
	if p == nil {
		return 0
	}
	return *p
}
