package console

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy"
)

// HiddenMac stands for a Mac's name on the pages a team's key sees: which Mac runs
// what is the fleet's business, not a team's.
const HiddenMac = "a Mac"

// Scope is the part of a snapshot id may see; every page is built from it, so it is
// the one place that decides what reaches a team. An admin sees everything. A team's
// key sees:
//
//   - no Mac, Lease or other namespace's replica;
//   - its own namespace's deployments and replicas, with Mac names (spec.nodeName,
//     status.nodes, a split replica's shards, endpoints and Mac names inside
//     condition messages and unload reasons) replaced by HiddenMac;
//   - of another namespace's deployment that grants it access (tenancy.MayUse), only
//     its namespace, name, served name and replica counts: never its source, digest,
//     conditions or memory;
//   - the traffic and prompt cache counters of its own deployments and its own
//     namespace's TokenUsages.
//
// The objects of s are not modified: what changes is copied.
func Scope(s Snapshot, id tenancy.Identity) Snapshot {
	s.Viewer = id
	if id.Admin {
		return s
	}
	macs := map[string]bool{}
	for _, n := range s.Nodes {
		macs[n.Name] = true
	}
	for _, r := range s.Replicas {
		if r.Spec.NodeName != "" {
			macs[r.Spec.NodeName] = true
		}
		for _, sh := range r.Status.Shards {
			macs[sh.Node] = true
		}
		if r.Spec.Split != nil {
			for _, sh := range r.Spec.Split.Shards {
				macs[sh.Node] = true
			}
		}
	}
	hide := macRedactor(macs)
	out := Snapshot{Now: s.Now, Viewer: id, Traffic: map[string]Traffic{}, PromptCache: map[string]PromptCache{}}
	for _, d := range s.Deployments {
		var granted []string
		if d.Spec.Access != nil {
			granted = d.Spec.Access.Namespaces
		}
		switch {
		case d.Namespace == id.Namespace:
			d = *d.DeepCopy()
			d.Status.Nodes = nil
			d.Status.Conditions = hideInConditions(d.Status.Conditions, hide)
			out.Deployments = append(out.Deployments, d)
			if t, ok := s.Traffic[d.Namespace+"/"+d.Name]; ok {
				out.Traffic[d.Namespace+"/"+d.Name] = t
			}
			if pc, ok := s.PromptCache[d.Namespace+"/"+d.Name]; ok {
				out.PromptCache[d.Namespace+"/"+d.Name] = pc
			}
		case tenancy.MayUse(id, d.Namespace, granted):
			out.Deployments = append(out.Deployments, sharedDeployment(d))
		}
	}
	for _, r := range s.Replicas {
		if r.Namespace != id.Namespace {
			continue
		}
		r = *r.DeepCopy()
		if r.Spec.NodeName != "" {
			r.Spec.NodeName = HiddenMac
		}
		r.Status.Endpoint = ""
		r.Status.Conditions = hideInConditions(r.Status.Conditions, hide)
		if u := r.Status.LastUnload; u != nil {
			u.Reason = hide(u.Reason)
		}
		hideShards(&r, hide)
		out.Replicas = append(out.Replicas, r)
	}
	for _, u := range s.Usage {
		if u.Namespace == id.Namespace {
			out.Usage = append(out.Usage, u)
		}
	}
	return out
}

// sharedDeployment is what a team sees of another namespace's deployment granted to
// it: what a client needs to call it and whether it is ready.
func sharedDeployment(d mfv1.ModelDeployment) mfv1.ModelDeployment {
	out := mfv1.ModelDeployment{}
	out.Namespace, out.Name = d.Namespace, d.Name
	out.Spec.Model.ServedName = d.Spec.Model.ServedName
	out.Spec.Replicas = d.Spec.Replicas
	out.Status.Replicas, out.Status.ReadyReplicas = d.Status.Replicas, d.Status.ReadyReplicas
	return out
}

// hideShards replaces the Macs' names of a split replica's shards (a copy) with
// HiddenMac, first putting the shards' status entries in shard order so that each
// still pairs with its shard (BuildUnloads pairs them by index then).
func hideShards(r *mfv1.ModelReplica, hide func(string) string) {
	if sp := r.Spec.Split; sp != nil {
		order := map[string]int{}
		for i, sh := range sp.Shards {
			order[sh.Node] = i
		}
		slices.SortStableFunc(r.Status.Shards, func(a, b mfv1.ShardStatus) int {
			ia, oka := order[a.Node]
			ib, okb := order[b.Node]
			return cmp.Or(cmp.Compare(boolRank(!oka), boolRank(!okb)), cmp.Compare(ia, ib))
		})
		for i := range sp.Shards {
			sp.Shards[i].Node = HiddenMac
		}
		sp.Macs = hide(sp.Macs)
	}
	for i := range r.Status.Shards {
		r.Status.Shards[i].Node = HiddenMac
		if u := r.Status.Shards[i].LastUnload; u != nil {
			u.Reason = hide(u.Reason)
		}
	}
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// macRedactor replaces the names of macs in a text with HiddenMac.
func macRedactor(macs map[string]bool) func(string) string {
	names := slices.Collect(maps.Keys(macs))
	// Longest first: mac-a must not cut mac-ab in two.
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(len(b), len(a)), cmp.Compare(a, b)) })
	var pairs []string
	for _, m := range names {
		pairs = append(pairs, m, HiddenMac)
	}
	if len(pairs) == 0 {
		return func(s string) string { return s }
	}
	r := strings.NewReplacer(pairs...)
	return r.Replace
}

func hideInConditions(conds []metav1.Condition, hide func(string) string) []metav1.Condition {
	for i := range conds {
		conds[i].Message = hide(conds[i].Message)
	}
	return conds
}
