package gateway

import (
	"maps"
	"testing"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/tunnel"
)

func TestSplitLinks(t *testing.T) {
	replica := func(head string, shards ...string) mfv1.ModelReplica {
		var r mfv1.ModelReplica
		r.Spec.NodeName = head
		if len(shards) > 0 {
			r.Spec.Split = &mfv1.ReplicaSplit{}
			for _, n := range shards {
				r.Spec.Split.Shards = append(r.Spec.Split.Shards, mfv1.ReplicaShard{Node: n})
			}
		}
		return r
	}
	for _, tc := range []struct {
		name     string
		replicas []mfv1.ModelReplica
		want     map[tunnel.Link]bool
	}{
		{name: "none", want: map[tunnel.Link]bool{}},
		{name: "whole replicas", replicas: []mfv1.ModelReplica{replica("a"), replica("b")}, want: map[tunnel.Link]bool{}},
		{name: "two Macs", replicas: []mfv1.ModelReplica{replica("a", "a", "b")}, want: map[tunnel.Link]bool{{From: "a", To: "b"}: true}},
		{name: "three Macs: the head to each worker, a worker to the next",
			replicas: []mfv1.ModelReplica{replica("a", "a", "b", "c")},
			want:     map[tunnel.Link]bool{{From: "a", To: "b"}: true, {From: "a", To: "c"}: true, {From: "b", To: "c"}: true}},
		{name: "not yet placed", replicas: []mfv1.ModelReplica{replica("", "a", "b")}, want: map[tunnel.Link]bool{}},
		{name: "two gangs",
			replicas: []mfv1.ModelReplica{replica("a", "a", "b"), replica("c", "c", "d"), replica("e")},
			want:     map[tunnel.Link]bool{{From: "a", To: "b"}: true, {From: "c", To: "d"}: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := splitLinks(tc.replicas); !maps.Equal(got, tc.want) {
				t.Errorf("splitLinks = %v, want %v", got, tc.want)
			}
		})
	}
}
