package clustermode

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/splitlink"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/tunnel"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// The head of a replica split across Macs (issue 27, docs/split-model.md): its Mac is
// the replica's spec.nodeName, and its runner keeps the first layers and computes the
// others on the worker shards' Macs, each through a loopback address of the agent's
// split link (splitlink.Forward).

// splitWaitingFor is the pure rule of a split head's gate: the first worker shard, in
// layer order, whose Mac has not reported it Ready (Running) in status.shards; nil when
// every worker shard is Ready, and for a replica that is not split. The head's runner
// starts only once it is nil: a partial gang never serves.
func splitWaitingFor(mr *v1alpha1.ModelReplica) *v1alpha1.ReplicaShard {
	if mr.Spec.Split == nil {
		return nil
	}
	shards := mr.Spec.Split.Shards
	for i := 1; i < len(shards); i++ {
		ready := false
		for _, st := range mr.Status.Shards {
			if st.Node == shards[i].Node {
				ready = st.Phase == v1alpha1.ReplicaRunning
			}
		}
		if !ready {
			return &shards[i]
		}
	}
	return nil
}

// splitGate holds a split head's action while a worker shard is not Ready: nothing is
// registered or loaded (a registered OnDemand entry would load at the first request).
// Any other action (fetch, update, remove, retire) goes ahead.
func splitGate(a Action, mr *v1alpha1.ModelReplica) Action {
	if mr == nil || splitWaitingFor(mr) == nil {
		return a
	}
	switch a {
	case ActionRegisterLoad, ActionRegister, ActionLoad, ActionRetryLoad:
		return ActionNone
	}
	return a
}

// waitingMessage says which shard a split head waits for.
func waitingMessage(s *v1alpha1.ReplicaShard) string {
	return fmt.Sprintf("waiting for the worker shard on %s (layers %d-%d) to report Ready: a partial gang never serves",
		s.Node, s.FirstLayer, s.LastLayer)
}

// splitHeadSpec is the pure rule of a split head's pool spec: spec (BuildSpec's, for
// the whole model) reserving the head shard's memory only, with one worker per worker
// shard in layer order, at its split link's address and with its token (links, by the
// shard's Mac), computing its shard's layers. spec is returned unchanged for a replica
// not split.
func splitHeadSpec(spec enginepool.ModelSpec, mr *v1alpha1.ModelReplica, links map[string]enginepool.SplitWorker) enginepool.ModelSpec {
	if mr.Spec.Split == nil || len(mr.Spec.Split.Shards) == 0 {
		return spec
	}
	shards := mr.Spec.Split.Shards
	spec.EstimatedBytes = shards[0].Memory.Value()
	spec.SplitWorkers = nil
	for _, s := range shards[1:] {
		spec.SplitWorkers = append(spec.SplitWorkers, enginepool.SplitWorker{Addr: links[s.Node].Addr, Token: links[s.Node].Token,
			Layers: int(s.LastLayer-s.FirstLayer) + 1})
	}
	return spec
}

// SplitLinks are a Mac's split links: on the head's Mac one splitlink.Forwarder per
// worker shard of each split replica whose head is this Mac (newSplitLinks), on a
// worker shard's Mac one to the next worker shard (newPeerLinks); each kept for the
// replica's life so that its process's addresses (and so its pool spec) do not change.
type SplitLinks struct {
	// Dial opens the link to the worker shard of replica namespace/name on Mac node.
	Dial func(ctx context.Context, node, namespace, name string) (net.Conn, error)
	Log  logr.Logger
	// Tokens makes each link require its token (splitlink.ForwardWithToken): the
	// head's links, whose runner reads the tokens on its standard input. A worker's
	// peer link has none: the worker reaching it is started with --next only.
	Tokens bool

	mu  sync.Mutex
	fwd map[string]map[string]*splitlink.Forwarder // by replica key, then worker Mac
}

// newSplitLinks dials a worker shard's Mac at the agent address its MacNode reports,
// with this Mac's fleet certificate, checking that the agent is that Mac's.
// With a tunnel (out), a link goes through it while it is up and the worker's Mac
// holds one too (the gateway joins the two for the split replica's links).
func newSplitLinks(c client.Reader, tlsSrc *pki.Source, out *tunnel.Agent, log logr.Logger) *SplitLinks {
	return &SplitLinks{Log: log, Dial: dialAgent(c, tlsSrc, out, splitlink.Path), Tokens: true}
}

// newPeerLinks are a worker shard's Mac's links to the next worker shard's Mac
// (splitlink.PeerPath), dialed as newSplitLinks does.
func newPeerLinks(c client.Reader, tlsSrc *pki.Source, out *tunnel.Agent, log logr.Logger) *SplitLinks {
	return &SplitLinks{Log: log, Dial: dialAgent(c, tlsSrc, out, splitlink.PeerPath)}
}

// dialAgent opens the link at path to Mac node's agent, at the address its MacNode
// reports, with this Mac's fleet certificate, checking that the agent is that Mac's:
// through out, this Mac's tunnel, while it is up and node holds one too.
func dialAgent(c client.Reader, tlsSrc *pki.Source, out *tunnel.Agent,
	path func(namespace, name string) string) func(context.Context, string, string, string) (net.Conn, error) {
	var raw splitlink.DialFunc
	if out != nil {
		raw = splitlink.DialFunc(out.DialContext(pki.NodeFrom, (&net.Dialer{}).DialContext))
	}
	return func(ctx context.Context, node, namespace, name string) (net.Conn, error) {
		var mn v1alpha1.MacNode
		if err := c.Get(ctx, client.ObjectKey{Name: node}, &mn); err != nil {
			return nil, fmt.Errorf("reading MacNode %s: %w", node, err)
		}
		if mn.Status.Agent.Address == "" {
			return nil, fmt.Errorf("MacNode %s reports no agent address", node)
		}
		return splitlink.Open(pki.WithNode(ctx, node), raw, mn.Status.Agent.Address, tlsSrc.ClientConfig(pki.Node(node)), path(namespace, name))
	}
}

// Addrs are the loopback addresses of mr's worker shards and the tokens their links
// require (Layers unset), by Mac, made on first use.
func (l *SplitLinks) Addrs(mr *v1alpha1.ModelReplica) (map[string]enginepool.SplitWorker, error) {
	links := map[string]enginepool.SplitWorker{}
	for _, node := range mr.Spec.Split.WorkerNodes() {
		f, err := l.forwarder(mr, node)
		if err != nil {
			return nil, err
		}
		links[node] = enginepool.SplitWorker{Addr: f.Addr(), Token: f.Token()}
	}
	return links, nil
}

// Addr is the loopback address of the link to mr's worker shard on Mac node, made on
// first use.
func (l *SplitLinks) Addr(mr *v1alpha1.ModelReplica, node string) (string, error) {
	f, err := l.forwarder(mr, node)
	if err != nil {
		return "", err
	}
	return f.Addr(), nil
}

// forwarder is the link to mr's worker shard on Mac node, made on first use (with a
// token when l.Tokens).
func (l *SplitLinks) forwarder(mr *v1alpha1.ModelReplica, node string) (*splitlink.Forwarder, error) {
	key := mr.Namespace + "/" + mr.Name
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fwd == nil {
		l.fwd = map[string]map[string]*splitlink.Forwarder{}
	}
	if l.fwd[key] == nil {
		l.fwd[key] = map[string]*splitlink.Forwarder{}
	}
	f := l.fwd[key][node]
	if f == nil {
		ns, name := mr.Namespace, mr.Name
		var err error
		forward := splitlink.Forward
		if l.Tokens {
			forward = splitlink.ForwardWithToken
		}
		f, err = forward(func(ctx context.Context) (net.Conn, error) { return l.Dial(ctx, node, ns, name) },
			l.Log.WithValues("replica", key, "worker", node))
		if err != nil {
			return nil, fmt.Errorf("forwarding to the worker shard on %s: %w", node, err)
		}
		l.fwd[key][node] = f
	}
	return f, nil
}

// Close ends the links of replica key.
func (l *SplitLinks) Close(key string) {
	l.mu.Lock()
	fwd := l.fwd[key]
	delete(l.fwd, key)
	l.mu.Unlock()
	for _, f := range fwd {
		_ = f.Close()
	}
}
