package nodeauthz

import (
	"strings"
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

	// allow: the webhook allows; deny: it denies outright (a read of replicas by a node
	// identity that is not its own), which the API server does not take past it to RBAC
	// (config/authorization asks it first); none: no opinion, RBAC decides.
	const allow, deny, none = "allow", "deny", "none"
	for _, tc := range []struct {
		name string
		req  Request
		want string
	}{
		{"list own replicas in every namespace", replica("list", selector(mine...)), allow},
		{"watch own replicas", replica("watch", selector(mine...)), allow},
		{"list own replicas in one namespace", replica("list", named("team-a", ""), selector(mine...)), allow},
		{"a further term only narrows", replica("list", selector(append([]Requirement{{Key: "metadata.name", Operator: "In", Values: []string{"x"}}}, mine...)...)), allow},
		{"list every replica", replica("list"), deny},
		{"list another Mac's replicas", replica("list", selector(Requirement{Key: "spec.nodeName", Operator: "In", Values: []string{"mac-b"}})), deny},
		{"list every replica but another Mac's", replica("list", selector(Requirement{Key: "spec.nodeName", Operator: "NotIn", Values: []string{"mac-b"}})), deny},
		{"list own and another Mac's", replica("list", selector(Requirement{Key: "spec.nodeName", Operator: "In", Values: []string{"mac-a", "mac-b"}})), deny},
		{"list by another field", replica("list", selector(Requirement{Key: "metadata.namespace", Operator: "In", Values: []string{"mac-a"}})), deny},
		{"watch unbound replicas", replica("watch", selector(Requirement{Key: "spec.nodeName", Operator: "In", Values: []string{""}})), deny},
		{"get own replica", replica("get", named("team-a", "mine")), allow},
		{"get own replica's status", replica("get", named("team-a", "mine"), sub("status")), allow},
		{"get another Mac's replica", replica("get", named("team-b", "theirs")), deny},
		{"get another Mac's replica's status", replica("get", named("team-b", "theirs"), sub("status")), deny},
		{"get an unbound replica", replica("get", named("team-a", "pending")), deny},
		{"get an unknown replica", replica("get", named("team-a", "nope")), deny},
		{"get without a namespace", replica("get", named("", "mine")), deny},
		{"update own replica", replica("update", named("team-a", "mine")), none},
		{"patch own replica's status", replica("patch", named("team-a", "mine"), sub("status")), none},
		{"delete own replica", replica("delete", named("team-a", "mine")), none},
		{"deletecollection with own selector", replica("deletecollection", selector(mine...)), none},
		{"list with own selector on a subresource", replica("list", sub("status"), selector(mine...)), deny},
		{"another ServiceAccount", replica("list", user("system:serviceaccount:team-a:mac-a"), selector(mine...)), none},
		{"an administrator", replica("get", user("kubernetes-admin"), named("team-a", "mine")), none},
		{"the namespace's own prefix only", replica("get", user("system:serviceaccount:macfleet-nodes:"), named("team-a", "pending")), none},
		{"ModelDeployments", Request{User: mac, Verb: "list", Group: "macfleet.dev", Resource: "modeldeployments", FieldSelector: mine}, none},
		{"replicas of another group", replica("list", selector(mine...), func(r *Request) { r.Group = "example.com" }), none},
		{"non-resource request", Request{User: mac, Verb: "get"}, none},
		{"list the replicas with a worker shard on it", replica("list", shard("mac-a", "Exists")), allow},
		{"watch the replicas with a worker shard on it", replica("watch", shard("mac-a", "In", v1alpha1.ShardLabelWorker)), allow},
		{"watch them in one namespace", replica("watch", named("team-b", ""), shard("mac-a", "Exists")), allow},
		{"list another Mac's worker shards", replica("list", shard("mac-c", "Exists")), deny},
		{"list the replicas without its worker label", replica("list", shard("mac-a", "DoesNotExist")), deny},
		{"list the replicas but those with its worker label", replica("list", shard("mac-a", "NotIn", v1alpha1.ShardLabelWorker)), deny},
		{"list with its worker label in no values", replica("list", shard("mac-a", "In")), deny},
		{"list with the label key in the field selector", replica("list", selector(Requirement{Key: v1alpha1.ShardLabel("mac-a"), Operator: "Exists"})), deny},
		{"get a replica with a worker shard on it", replica("get", named("team-b", "split")), allow},
		{"get its status", replica("get", named("team-b", "split"), sub("status")), allow},
		{"get a split replica with no shard on it", replica("get", named("team-b", "split-elsewhere")), deny},
		{"update a replica with a worker shard on it", replica("update", named("team-b", "split")), none},
		{"deletecollection with its worker label", replica("deletecollection", shard("mac-a", "Exists")), none},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.req, lookup)
			got := none
			switch {
			case d.Allowed && d.Denied:
				t.Fatalf("Decide(%+v) = %+v: both allowed and denied", tc.req, d)
			case d.Allowed:
				got = allow
			case d.Denied:
				got = deny
			}
			if got != tc.want {
				t.Errorf("Decide(%+v) = %+v; want %s", tc.req, d, tc.want)
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

func TestInForce(t *testing.T) {
	for _, tc := range []struct {
		readsAll, readsOwn bool
		want               Mode
	}{
		{true, true, ModeRBAC},
		{true, false, ModeRBAC}, // cannot happen: reading all reads its own
		{false, true, ModeWebhook},
		{false, false, ModeNone},
	} {
		m := InForce(tc.readsAll, tc.readsOwn)
		if m != tc.want {
			t.Errorf("InForce(all %v, own %v) = %s, want %s", tc.readsAll, tc.readsOwn, m, tc.want)
		}
		if d := m.Describe(); !strings.Contains(d, "in force: "+string(tc.want)) {
			t.Errorf("%s.Describe() = %q does not name the mode", m, d)
		}
	}
}
