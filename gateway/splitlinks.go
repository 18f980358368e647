package gateway

import (
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/tunnel"
)

// splitLinks are the relays between Macs that the split replicas call for while they
// exist: each head's Mac to each of its worker shards' Macs (the head's runner
// drives every worker), and each worker's Mac to the next worker's (the peer link
// that carries its output on, docs/split-model.md). The gateway joins two Macs' tunnels
// for these links only; a link goes one way, from the Mac that dials.
func splitLinks(replicas []mfv1.ModelReplica) map[tunnel.Link]bool {
	links := map[tunnel.Link]bool{}
	for i := range replicas {
		s, head := replicas[i].Spec.Split, replicas[i].Spec.NodeName
		if s == nil || head == "" {
			continue
		}
		for _, w := range s.WorkerNodes() {
			if w != head {
				links[tunnel.Link{From: head, To: w}] = true
			}
			if next := s.NextWorker(w); next != "" && next != w {
				links[tunnel.Link{From: w, To: next}] = true
			}
		}
	}
	return links
}
