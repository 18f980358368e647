// Package splitlink is the authenticated link between the runner of a split replica's
// head and the workers of its other shards, and between each worker and the next
// (issue 27, docs/split-model.md).
//
// The runner's worker protocol is plain TCP without authentication, so no worker
// listens beyond its own Mac's loopback. The head's agent gives its runner, for each
// worker, a loopback address of its own (Forwarder); every connection the runner opens
// there is carried to the worker Mac's agent over mutual TLS, with the head Mac's
// certificate, as an HTTP Upgrade on Path (Dial). The worker Mac's agent (Handler)
// accepts it only from the Mac that is the replica's head, by its certificate's node
// identity and the replica's spec (Authorize), and then pipes the bytes to its local
// worker.
//
// A worker shard followed by another pushes its layers' output to the next worker
// directly: its Mac's agent gives it a loopback address of its own (--next) whose
// connections are carried the same way on PeerPath, which the next worker Mac's agent
// accepts only from the Mac of the worker shard right before its own (AuthorizePeer)
// and only for the worker protocol's peer greeting (Handler).
package splitlink

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// Protocol is the Upgrade header's value of a link.
const Protocol = "macfleet-split/1"

// pathPrefix starts Path.
const pathPrefix = "/api/split/"

// Path is the agent endpoint on which the head opens the link to the worker shard of
// replica namespace/name.
func Path(namespace, name string) string {
	return pathPrefix + url.PathEscape(namespace) + "/" + url.PathEscape(name)
}

// peerSuffix ends PeerPath.
const peerSuffix = "/peer"

// PeerPath is the agent endpoint on which the previous worker shard's Mac opens the
// peer link to the worker shard of replica namespace/name.
func PeerPath(namespace, name string) string {
	return Path(namespace, name) + peerSuffix
}

// parsePath reads the namespace and name of an escaped Path or PeerPath (peer); ok
// false for any other.
func parsePath(escaped string) (namespace, name string, peer, ok bool) {
	if trimmed, found := strings.CutSuffix(escaped, peerSuffix); found {
		escaped, peer = trimmed, true
	}
	namespace, name, ok = parseReplicaPath(escaped)
	return namespace, name, peer, ok
}

// parseReplicaPath reads the namespace and name of an escaped Path.
func parseReplicaPath(escaped string) (namespace, name string, ok bool) {
	rest, found := strings.CutPrefix(escaped, pathPrefix)
	if !found {
		return "", "", false
	}
	ns, n, found := strings.Cut(rest, "/")
	if !found || ns == "" || n == "" || strings.Contains(n, "/") {
		return "", "", false
	}
	ns, err1 := url.PathUnescape(ns)
	n, err2 := url.PathUnescape(n)
	if err1 != nil || err2 != nil {
		return "", "", false
	}
	return ns, n, true
}

// Authorize is the rule of the worker Mac's agent: caller (the node a fleet
// certificate names) may open the link to self's worker shard of mr only if mr is a
// split replica with a worker shard on self (not its head) and caller is its head's
// Mac (spec.nodeName). mr nil: the replica is unknown to self (no such replica, or none
// with a worker shard on self). A nil error allows.
func Authorize(mr *v1alpha1.ModelReplica, self, caller string) error {
	if err := workerShardOn(mr, self); err != nil {
		return err
	}
	if caller == "" || caller != mr.Spec.NodeName {
		return fmt.Errorf("only the Mac of replica %s/%s's head, %s, may open its split link, not %s",
			mr.Namespace, mr.Name, mr.Spec.NodeName, caller)
	}
	return nil
}

// workerShardOn is nil when mr is a live split replica with a worker shard on self,
// else why not.
func workerShardOn(mr *v1alpha1.ModelReplica, self string) error {
	switch {
	case mr == nil:
		return fmt.Errorf("no replica of that name holds a worker shard on %s", self)
	case mr.Spec.Split == nil || !slices.Contains(mr.Spec.Split.WorkerNodes(), self):
		return fmt.Errorf("replica %s/%s holds no worker shard on %s", mr.Namespace, mr.Name, self)
	case mr.DeletionTimestamp != nil:
		return fmt.Errorf("replica %s/%s is being deleted", mr.Namespace, mr.Name)
	}
	return nil
}

// AuthorizePeer is the rule of the worker Mac's agent for a peer link: caller may open
// it to self's worker shard of mr only if mr is a split replica with a worker shard on
// self that follows another worker shard (not the head), and caller is that shard's
// Mac (v1alpha1.ReplicaSplit.PreviousWorker). A nil error allows.
func AuthorizePeer(mr *v1alpha1.ModelReplica, self, caller string) error {
	if err := workerShardOn(mr, self); err != nil {
		return err
	}
	prev := mr.Spec.Split.PreviousWorker(self)
	switch {
	case prev == "":
		return fmt.Errorf("the worker shard of replica %s/%s on %s takes its input from the head's runner: it has no peer link",
			mr.Namespace, mr.Name, self)
	case caller == "" || caller != prev:
		return fmt.Errorf("only the Mac of the worker shard before %s's in replica %s/%s, %s, may open its peer link, not %s",
			self, mr.Namespace, mr.Name, prev, caller)
	}
	return nil
}
