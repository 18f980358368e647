package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestShardLabel(t *testing.T) {
	long := strings.Repeat("mac-", 63) + "x" // 253 characters, the longest MacNode name
	seen := map[string]string{}
	for _, node := range []string{"mac-a", "mac-b", "m", long} {
		key := ShardLabel(node)
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			t.Errorf("ShardLabel(%q) = %q, not a label key: %v", node, key, errs)
		}
		if !strings.HasPrefix(key, ShardLabelPrefix) {
			t.Errorf("ShardLabel(%q) = %q, want the prefix %s", node, key, ShardLabelPrefix)
		}
		if other, ok := seen[key]; ok {
			t.Errorf("ShardLabel(%q) = ShardLabel(%q) = %q", node, other, key)
		}
		seen[key] = node
		if again := ShardLabel(node); again != key {
			t.Errorf("ShardLabel(%q) is %q, then %q", node, key, again)
		}
	}
	if errs := validation.IsValidLabelValue(ShardLabelWorker); len(errs) > 0 {
		t.Errorf("ShardLabelWorker %q: %v", ShardLabelWorker, errs)
	}
}

func TestWorkerNodes(t *testing.T) {
	split := &ReplicaSplit{Shards: []ReplicaShard{{Node: "a"}, {Node: "b"}, {Node: "c"}}}
	if got := strings.Join(split.WorkerNodes(), ","); got != "b,c" {
		t.Errorf("WorkerNodes = %q, want b,c (every shard but the head)", got)
	}
	if got := (*ReplicaSplit)(nil).WorkerNodes(); got != nil {
		t.Errorf("WorkerNodes of no split = %v, want none", got)
	}
}

func TestNextAndPreviousWorker(t *testing.T) {
	split := &ReplicaSplit{Shards: []ReplicaShard{{Node: "a"}, {Node: "b"}, {Node: "c"}, {Node: "d"}}}
	for _, tc := range []struct{ node, next, prev string }{
		{"a", "", ""},  // the head: not a worker shard
		{"b", "c", ""}, // the first worker: its input comes from the head
		{"c", "d", "b"},
		{"d", "", "c"}, // the last worker: its output goes back to the head
		{"x", "", ""},
	} {
		if got := split.NextWorker(tc.node); got != tc.next {
			t.Errorf("NextWorker(%s) = %q, want %q", tc.node, got, tc.next)
		}
		if got := split.PreviousWorker(tc.node); got != tc.prev {
			t.Errorf("PreviousWorker(%s) = %q, want %q", tc.node, got, tc.prev)
		}
	}
	var none *ReplicaSplit
	if none.NextWorker("a") != "" || none.PreviousWorker("a") != "" {
		t.Error("a nil split has next or previous workers")
	}
}
