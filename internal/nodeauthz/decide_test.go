package nodeauthz

import (
	"testing"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

func TestDecide(t *testing.T) {
	const mac = "system:serviceaccount:macfleet-nodes:mac-a"
	mine := []Requirement{{Key: "spec.nodeName", Operator: "In", Values: []string{"mac-a"}}}
	bindings := map[string]Binding{"team-a/mine": {Node: "mac-a"}, "team-b/theirs": {Node: "mac-b"}, "team-a/pending": {},
		"team-b/split": {Node: "mac-b", Workers: []string{"mac-c", "mac-a"}}, "team-b/split-elsewhere": {Node: "mac-b", Workers: []string{"mac-c"}}}
	lookup := func(ns, name string) (Binding, bool) {
		b, ok := bindings[ns+"/"+name]
		return b, ok
	}
	shard := func(node string, op string, values ...string) func(*Request) {
		return func(r *Request) {
			r.LabelSelector = []Requirement{{Key: v1alpha1.ShardLabel(node), Operator: op, Values: values}}
		}
	}
	replica := func(verb string, mod ...func(*Request)) Request {
		r := Request{User: mac, Verb: verb, Group: "macfleet.dev", Resource: "modelreplicas"}
		for _, m := range mod {
			m(&r)
		}
		return r
	}
	named := func(ns, name string) func(*Request) {
		return func(r *Request) { r.Namespace, r.Name = ns, name }
	}
	selector := func(s ...Requirement) func(*Request) { return func(r *Request) { r.FieldSelector = s } }
	sub := func(s string) func(*Request) { return func(r *Request) { r.Subresource = s } }
	user := func(u string) func(*Request) { return func(r *Request) { r.User = u } }

	for _, tc := range []struct {
		name string
		req  Request
		want bool
	}{
		{"list own replicas in every namespace", replica("list", selector(mine...)), true},
		{"watch own replicas", replica("watch", selector(mine...)), true},
		{"list own replicas in one namespace", replica("list", named("team-a", ""), selector(mine...)), true},
		{"a further term only narrows", replica("list", selector(append([]Requirement{{Key: "metadata.name", Operator: "In", Values: []string{"x"}}}, mine...)...)), true},
		{"list every replica", replica("list"), false},
		{"list another Mac's replicas", replica("list", selector(Requirement{Key: "spec.nodeName", Operator: "In", Values: []string{"mac-b"}})), false},
		{"list every replica but another Mac's", replica("list", selector(Requirement{Key: "spec.nodeName", Operator: "NotIn", Values: []string{"mac-b"}})), false},
		{"list own and another Mac's", replica("list", selector(Requirement{Key: "spec.nodeName", Operator: "In", Values: []string{"mac-a", "mac-b"}})), false},
		{"list by another field", replica("list", selector(Requirement{Key: "metadata.namespace", Operator: "In", Values: []string{"mac-a"}})), false},
		{"watch unbound replicas", replica("watch", selector(Requirement{Key: "spec.nodeName", Operator: "In", Values: []string{""}})), false},
		{"get own replica", replica("get", named("team-a", "mine")), true},
		{"get own replica's status", replica("get", named("team-a", "mine"), sub("status")), true},
		{"get another Mac's replica", replica("get", named("team-b", "theirs")), false},
		{"get another Mac's replica's status", replica("get", named("team-b", "theirs"), sub("status")), false},
		{"get an unbound replica", replica("get", named("team-a", "pending")), false},
		{"get an unknown replica", replica("get", named("team-a", "nope")), false},
		{"get without a namespace", replica("get", named("", "mine")), false},
		{"update own replica", replica("update", named("team-a", "mine")), false},
		{"patch own replica's status", replica("patch", named("team-a", "mine"), sub("status")), false},
		{"delete own replica", replica("delete", named("team-a", "mine")), false},
		{"deletecollection with own selector", replica("deletecollection", selector(mine...)), false},
		{"list with own selector on a subresource", replica("list", sub("status"), selector(mine...)), false},
		{"another ServiceAccount", replica("list", user("system:serviceaccount:team-a:mac-a"), selector(mine...)), false},
		{"an administrator", replica("get", user("kubernetes-admin"), named("team-a", "mine")), false},
		{"the namespace's own prefix only", replica("get", user("system:serviceaccount:macfleet-nodes:"), named("team-a", "pending")), false},
		{"ModelDeployments", Request{User: mac, Verb: "list", Group: "macfleet.dev", Resource: "modeldeployments", FieldSelector: mine}, false},
		{"replicas of another group", replica("list", selector(mine...), func(r *Request) { r.Group = "example.com" }), false},
		{"non-resource request", Request{User: mac, Verb: "get"}, false},
		{"list the replicas with a worker shard on it", replica("list", shard("mac-a", "Exists")), true},
		{"watch the replicas with a worker shard on it", replica("watch", shard("mac-a", "In", v1alpha1.ShardLabelWorker)), true},
		{"watch them in one namespace", replica("watch", named("team-b", ""), shard("mac-a", "Exists")), true},
		{"list another Mac's worker shards", replica("list", shard("mac-c", "Exists")), false},
		{"list the replicas without its worker label", replica("list", shard("mac-a", "DoesNotExist")), false},
		{"list the replicas but those with its worker label", replica("list", shard("mac-a", "NotIn", v1alpha1.ShardLabelWorker)), false},
		{"list with its worker label in no values", replica("list", shard("mac-a", "In")), false},
		{"list with the label key in the field selector", replica("list", selector(Requirement{Key: v1alpha1.ShardLabel("mac-a"), Operator: "Exists"})), false},
		{"get a replica with a worker shard on it", replica("get", named("team-b", "split")), true},
		{"get its status", replica("get", named("team-b", "split"), sub("status")), true},
		{"get a split replica with no shard on it", replica("get", named("team-b", "split-elsewhere")), false},
		{"update a replica with a worker shard on it", replica("update", named("team-b", "split")), false},
		{"deletecollection with its worker label", replica("deletecollection", shard("mac-a", "Exists")), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.req, lookup)
			if d.Allowed != tc.want {
				t.Errorf("Decide(%+v) = %+v; want allowed %v", tc.req, d, tc.want)
			}
			if d.Reason == "" {
				t.Error("the decision has no reason")
			}
		})
	}
}

func TestDecideLooksUpOnlyGets(t *testing.T) {
	calls := 0
	lookup := func(string, string) (Binding, bool) { calls++; return Binding{Node: "mac-a"}, true }
	mac := "system:serviceaccount:macfleet-nodes:mac-a"
	for _, r := range []Request{
		{User: mac, Verb: "list", Group: "macfleet.dev", Resource: "modelreplicas"},
		{User: "alice", Verb: "get", Group: "macfleet.dev", Resource: "modelreplicas", Namespace: "a", Name: "b"},
		{User: mac, Verb: "get", Group: "macfleet.dev", Resource: "modeldeployments", Namespace: "a", Name: "b"},
	} {
		Decide(r, lookup)
	}
	if calls != 0 {
		t.Errorf("Decide looked up %d bindings for requests that need none", calls)
	}
}
