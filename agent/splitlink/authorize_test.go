package splitlink

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

func TestAuthorize(t *testing.T) {
	deleting := split("h", "w")
	deleting.DeletionTimestamp = &metav1.Time{}
	for _, tc := range []struct {
		name         string
		mr           *v1alpha1.ModelReplica
		self, caller string
		want         string // "" allowed
	}{
		{"the head to its worker", split("h", "w"), "w", "h", ""},
		{"the head to its second worker", split("h", "w1", "w2"), "w2", "h", ""},
		{"another Mac", split("h", "w"), "w", "x", "only the Mac of replica ns/r's head, h, may open its split link, not x"},
		{"another worker of the gang", split("h", "w1", "w2"), "w2", "w1", "not w1"},
		{"the worker itself", split("h", "w"), "w", "w", "not w"},
		{"no caller", split("h", "w"), "w", "", "not "},
		{"unknown replica", nil, "w", "h", "no replica of that name holds a worker shard on w"},
		{"not split", split("h"), "w", "h", "holds no worker shard on w"},
		{"split elsewhere", split("h", "z"), "w", "h", "holds no worker shard on w"},
		{"to the head's own Mac", split("h", "w"), "h", "h", "holds no worker shard on h"},
		{"being deleted", deleting, "w", "h", "being deleted"},
	} {
		checkRule(t, tc.name, Authorize(tc.mr, tc.self, tc.caller), tc.want)
	}
}

func TestPath(t *testing.T) {
	for _, tc := range []struct{ ns, name string }{{"team-a", "big-0"}, {"a", "b"}} {
		ns, name, peer, ok := parsePath(Path(tc.ns, tc.name))
		if !ok || peer || ns != tc.ns || name != tc.name {
			t.Errorf("parsePath(Path(%q, %q)) = %q, %q, peer %v, %v", tc.ns, tc.name, ns, name, peer, ok)
		}
		ns, name, peer, ok = parsePath(PeerPath(tc.ns, tc.name))
		if !ok || !peer || ns != tc.ns || name != tc.name {
			t.Errorf("parsePath(PeerPath(%q, %q)) = %q, %q, peer %v, %v", tc.ns, tc.name, ns, name, peer, ok)
		}
	}
	for _, p := range []string{"/api/split/", "/api/split/a", "/api/split/a/", "/api/split//b", "/api/split/a/b/c", "/api/splits/a/b", "/api/split/a/%zz",
		"/api/split/a/peer", "/api/split/a/b/peer/peer", "/api/split/a/b/c/peer"} {
		if _, _, _, ok := parsePath(p); ok {
			t.Errorf("parsePath(%q) accepted it", p)
		}
	}
}

func TestAuthorizePeer(t *testing.T) {
	deleting := split("h", "w1", "w2")
	deleting.DeletionTimestamp = &metav1.Time{}
	for _, tc := range []struct {
		name         string
		mr           *v1alpha1.ModelReplica
		self, caller string
		want         string // "" allowed
	}{
		{"the first worker to the second", split("h", "w1", "w2"), "w2", "w1", ""},
		{"the second worker to the third", split("h", "w1", "w2", "w3"), "w3", "w2", ""},
		{"two shards back", split("h", "w1", "w2", "w3"), "w3", "w1", "only the Mac of the worker shard before w3's in replica ns/r, w2, may open its peer link, not w1"},
		{"the head", split("h", "w1", "w2"), "w2", "h", "not h"},
		{"the next worker, backwards", split("h", "w1", "w2"), "w1", "w2", "takes its input from the head's runner"},
		{"a worker fed by the head", split("h", "w"), "w", "h", "takes its input from the head's runner: it has no peer link"},
		{"no caller", split("h", "w1", "w2"), "w2", "", "not "},
		{"unknown replica", nil, "w2", "w1", "no replica of that name holds a worker shard on w2"},
		{"to the head's Mac", split("h", "w1", "w2"), "h", "w1", "holds no worker shard on h"},
		{"being deleted", deleting, "w2", "w1", "being deleted"},
	} {
		checkRule(t, tc.name, AuthorizePeer(tc.mr, tc.self, tc.caller), tc.want)
	}
}

// split is replica ns/r with its head on head and a worker shard on each of workers, in
// order; not split without workers.
func split(head string, workers ...string) *v1alpha1.ModelReplica {
	mr := &v1alpha1.ModelReplica{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r"}}
	mr.Spec.NodeName = head
	if len(workers) > 0 {
		mr.Spec.Split = &v1alpha1.ReplicaSplit{Shards: []v1alpha1.ReplicaShard{{Node: head}}}
		for _, w := range workers {
			mr.Spec.Split.Shards = append(mr.Spec.Split.Shards, v1alpha1.ReplicaShard{Node: w})
		}
	}
	return mr
}

// checkRule checks a rule's answer: allowed when want is "", else refused saying want.
func checkRule(t *testing.T, name string, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("%s: %v, want allowed", name, err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Errorf("%s: %v, want refused with %q", name, err, want)
	}
}
