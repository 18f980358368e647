package autoscaler

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/pki"
)

// Load is a deployment's load at one moment.
type Load struct {
	// InFlight is the requests on the deployment's replicas, summed.
	InFlight int32
	// Held is the requests waiting for a replica before reaching one.
	Held int32
}

// LoadSource measures a deployment's load now. The decision code only sees Samples:
// a source may read agents, gateways or anything else, but must not write to the API
// server per request.
type LoadSource interface {
	Measure(ctx context.Context, md *v1alpha1.ModelDeployment) (Load, error)
}

// Defaults of AgentSource.
const (
	DefaultAgentTimeout = 2 * time.Second
	// DefaultStatusMaxAge lets the deployments on one Mac share one status read.
	DefaultStatusMaxAge = 2 * time.Second
	// maxStatusBytes bounds an agent's /api/status body.
	maxStatusBytes = 8 << 20
)

// AgentSource measures in-flight requests where they are served: it reads the
// /api/status of the agent of each Ready replica (its status.endpoint), whose pool
// reports the leases each replica's engine holds — one per request being generated or
// waiting for a sequence slot. Every request reaches the agent whichever gateway replica
// (or the deployment's Service) sent it, so the sum over the replicas is the
// deployment's load across every gateway, with no write to the API server. Replicas
// that are not Ready, or whose Mac is not Ready (its Lease expired: the endpoints and
// the gateways no longer route to it), serve nothing new and are skipped, so that a
// lost Mac does not leave the deployment without a measurement when it needs
// replicas most. Requests held by a gateway before reaching a replica are not visible
// by the leases; the gateways report them on every request they forward (how many
// requests for the deployment wait in that gateway's queue), the agents relay the
// latest report of each gateway, and Held is the sum over the gateways of each one's
// newest report among the deployment's replicas.
//
// One status read per Mac serves every deployment measured within StatusMaxAge.
type AgentSource struct {
	// Client lists the deployment's replicas and reads their MacNodes (the manager's
	// cache).
	Client client.Reader
	// Certificates, when set, is the manager's client certificate and the fleet CA
	// bundle: agents are read over HTTPS, each handshake requiring the certificate of
	// the replica's Mac (spec.nodeName), so that a status.endpoint pointed elsewhere is
	// never read nor sent the certificate. Without it agents are read over plain HTTP.
	Certificates *pki.Source
	// HTTP reaches the agents. Default: a client with DefaultAgentTimeout (through
	// per-Mac transports with Certificates).
	HTTP *http.Client
	// Token is a token sent to agents ("" sends none): agents in cluster mode take
	// certificates instead; this reaches test agents that take a key.
	Token func() string
	// Clock times the status cache. Default: clock.RealClock{}.
	Clock clock.PassiveClock
	// StatusMaxAge is how long one agent's status is reused. Default: DefaultStatusMaxAge.
	StatusMaxAge time.Duration

	mu    sync.Mutex
	cache map[string]agentStatus
}

// agentStatus is what the source keeps of one agent's /api/status.
type agentStatus struct {
	at time.Time
	// models: pool entry name ("<namespace>/<replica>") → its leases now, the integral
	// of its leases, and their mean since the agent's previous read when known.
	models map[string]modelLoad
	// queues: pool entry name → what each gateway last said of its queue for the entry's
	// deployment, each with the queue it stands for since the agent's previous read.
	queues map[string][]gatewayQueue
	err    error
}

// modelLoad is one pool entry's load in an agent's status.
type modelLoad struct {
	leases  int32
	reading leaseReading
	// mean is the mean leases since the agent's previous read (hasMean: known).
	mean    float64
	hasMean bool
}

// inFlight is the entry's requests in flight: the mean since the previous read, or
// the leases now without one.
func (m modelLoad) inFlight() float64 {
	if m.hasMean {
		return m.mean
	}
	return float64(m.leases)
}

// gatewayQueue is one gateway's report of its queue, as an agent relays it.
type gatewayQueue struct {
	Gateway       string    `json:"gateway"`
	Queued        int32     `json:"queued"`
	QueuedSeconds *float64  `json:"queuedSeconds"`
	At            time.Time `json:"at"`
	// held is the queue the report stands for (see nextQueueReading).
	held float64
}

// Measure sums the requests in flight on md's Ready replicas, as their agents report
// them, and those held in the gateways' queues: each the mean since the previous read
// where the agents' and gateways' integrals give one (see meanLeases), the count at
// the instant otherwise.
func (s *AgentSource) Measure(ctx context.Context, md *v1alpha1.ModelDeployment) (Load, error) {
	var list v1alpha1.ModelReplicaList
	if err := s.Client.List(ctx, &list, client.InNamespace(md.Namespace),
		client.MatchingLabels{v1alpha1.LabelDeployment: md.Name}); err != nil {
		return Load{}, fmt.Errorf("listing the replicas of %s: %w", md.Name, err)
	}
	var inFlight float64
	newest := map[string]gatewayQueue{} // gateway → its newest report for md
	for i := range list.Items {
		r := &list.Items[i]
		// A draining replica takes no new requests: its load is leaving with it.
		if r.DeletionTimestamp != nil || r.Spec.Drain != nil || r.Status.Endpoint == "" ||
			!meta.IsStatusConditionTrue(r.Status.Conditions, v1alpha1.ReplicaReady) {
			continue
		}
		if up, err := s.macReady(ctx, r.Spec.NodeName); err != nil {
			return Load{}, err
		} else if !up {
			continue
		}
		st := s.status(ctx, r.Spec.NodeName, r.Status.Endpoint)
		if st.err != nil {
			return Load{}, fmt.Errorf("reading the load of replica %s from its agent at %s: %w", r.Name, r.Status.Endpoint, st.err)
		}
		key := r.Namespace + "/" + r.Name
		inFlight += st.models[key].inFlight()
		for _, q := range st.queues[key] {
			if old, ok := newest[q.Gateway]; !ok || q.At.After(old.At) {
				newest[q.Gateway] = q
			}
		}
	}
	held := 0.0
	for _, q := range newest {
		held += q.held
	}
	return loadOf(inFlight, held), nil
}

// macReady says whether the Mac named node is Ready; a replica not bound to a Mac
// counts as on a Ready one, a Mac that no longer exists as not Ready.
func (s *AgentSource) macReady(ctx context.Context, node string) (bool, error) {
	if node == "" {
		return true, nil
	}
	mn := &v1alpha1.MacNode{}
	if err := s.Client.Get(ctx, client.ObjectKey{Name: node}, mn); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("reading MacNode %s: %w", node, err)
	}
	return meta.IsStatusConditionTrue(mn.Status.Conditions, v1alpha1.MacNodeReady), nil
}

// status returns the agent's status, read now unless a read of the last StatusMaxAge
// (successful or not) is at hand.
func (s *AgentSource) status(ctx context.Context, node, endpoint string) agentStatus {
	now := s.clock().Now()
	s.mu.Lock()
	if s.cache == nil {
		s.cache = map[string]agentStatus{}
	}
	key := node + "\x00" + endpoint // a status is the Mac's only if read from it
	st, ok := s.cache[key]
	maxAge := s.StatusMaxAge
	if maxAge <= 0 {
		maxAge = DefaultStatusMaxAge
	}
	s.mu.Unlock()
	if ok && now.Sub(st.at) < maxAge && !now.Before(st.at) {
		return st
	}
	prev := st
	st = agentStatus{at: now}
	st.models, st.queues, st.err = s.read(ctx, node, endpoint)
	// The means since the previous read: both the leases' and the queues' cover
	// about the same time.
	for name, m := range st.models {
		if p, ok := prev.models[name]; ok {
			m.mean, m.hasMean = meanLeases(p.reading, m.reading)
			st.models[name] = m
		}
	}
	for name, reports := range st.queues {
		for i, q := range reports {
			st.queues[name][i].held = queueHeld(prev.queues[name], q)
		}
	}
	s.mu.Lock()
	for k, v := range s.cache { // forget agents not read for a while
		if now.Sub(v.at) > 10*maxAge {
			delete(s.cache, k)
		}
	}
	s.cache[key] = st
	s.mu.Unlock()
	return st
}

func (s *AgentSource) clock() clock.PassiveClock {
	if s.Clock == nil {
		return clock.RealClock{}
	}
	return s.Clock
}

// read fetches GET https://<endpoint>/api/status from node's agent (http:// without
// Certificates).
func (s *AgentSource) read(ctx context.Context, node, endpoint string) (map[string]modelLoad, map[string][]gatewayQueue, error) {
	s.mu.Lock()
	if s.HTTP == nil {
		s.HTTP = &http.Client{Timeout: DefaultAgentTimeout}
		if s.Certificates != nil {
			s.HTTP.Transport = pki.NewTransports(s.Certificates, nil)
		}
	}
	hc := s.HTTP
	s.mu.Unlock()
	scheme := "http://"
	if s.Certificates != nil {
		scheme = "https://"
	}
	req, err := http.NewRequestWithContext(pki.WithNode(ctx, node), http.MethodGet, scheme+endpoint+"/api/status", nil)
	if err != nil {
		return nil, nil, err
	}
	if s.Token != nil {
		if tok := s.Token(); tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("GET /api/status answered %s", resp.Status)
	}
	var body struct {
		Time   time.Time `json:"time"`
		Models []struct {
			Name         string    `json:"name"`
			Leases       int32     `json:"leases"`
			LeaseSeconds *float64  `json:"leaseSeconds"`
			LoadedAt     time.Time `json:"loadedAt"`
		} `json:"models"`
		GatewayQueues map[string][]gatewayQueue `json:"gatewayQueues"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxStatusBytes)).Decode(&body); err != nil {
		return nil, nil, fmt.Errorf("decoding /api/status: %w", err)
	}
	out := make(map[string]modelLoad, len(body.Models))
	for _, m := range body.Models {
		ml := modelLoad{leases: max(m.Leases, 0)}
		// An agent without the integral, or an engine not loaded, reports no reading.
		if m.LeaseSeconds != nil && !m.LoadedAt.IsZero() && !body.Time.IsZero() {
			ml.reading = leaseReading{at: body.Time, loadedAt: m.LoadedAt, seconds: *m.LeaseSeconds}
		}
		out[m.Name] = ml
	}
	return out, body.GatewayQueues, nil
}
