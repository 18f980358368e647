package clustermode

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// AmbiguousModelError: the requested name is served by replicas of more than one
// deployment on this node (400).
type AmbiguousModelError struct {
	Model       string
	Deployments []string
}

func (e *AmbiguousModelError) Error() string {
	return fmt.Sprintf("model %q is served by several deployments on this node (%s): name the replica with the %s header "+
		"or use a name only one of them serves", e.Model, strings.Join(e.Deployments, ", "), v1alpha1.HeaderReplica)
}
func (e *AmbiguousModelError) HTTPStatus() int           { return http.StatusBadRequest }
func (e *AmbiguousModelError) Code() string              { return "model_ambiguous" }
func (e *AmbiguousModelError) Type() string              { return "invalid_request_error" }
func (e *AmbiguousModelError) RetryAfter() time.Duration { return 0 }
func (e *AmbiguousModelError) Fields() map[string]any    { return nil }

// ThroughGatewayError: the caller's namespace has a TokenBudget, so it may use the
// deployment only through the gateway, which holds it to the budget and counts its
// usage (403).
type ThroughGatewayError struct {
	Namespace  string
	Deployment string // namespace/name
}

func (e *ThroughGatewayError) Error() string {
	return fmt.Sprintf("namespace %s has a TokenBudget: its callers use %s through the fleet's gateway, which holds them "+
		"to the budget and counts their usage, not on the deployment's own Service", e.Namespace, e.Deployment)
}
func (e *ThroughGatewayError) HTTPStatus() int           { return http.StatusForbidden }
func (e *ThroughGatewayError) Code() string              { return "budgeted_namespace" }
func (e *ThroughGatewayError) Type() string              { return "permission_error" }
func (e *ThroughGatewayError) RetryAfter() time.Duration { return 0 }
func (e *ThroughGatewayError) Fields() map[string]any    { return nil }

// candidate is one replica a request may go to.
type candidate struct {
	key        string
	deployment string // namespace/deployment
	ready      bool
	registered bool
	// gateway: the caller must go through the gateway (throughGateway).
	gateway bool
}

// Resolve picks the pool entry of a request: the replica named by the
// X-Macfleet-Replica header, else a replica whose served name or alias (optionally
// qualified "namespace/name") is model — preferring loaded replicas. Only replicas
// the request's caller may use are candidates (tenancy.MayUse: the fleet token's
// admin, a caller of the replica's namespace, or of a namespace its deployment's
// spec.access grants; a request without an identity none): any other is answered as
// a model that does not exist. It never calls the API server.
func (s *Syncer) Resolve(r *http.Request, model string) (string, error) {
	id, _ := tenancy.IdentityFrom(r.Context())
	snap := s.opts.Pool.Snapshot()
	if h := r.Header.Get(v1alpha1.HeaderReplica); h != "" {
		s.mu.Lock()
		rep := s.replicas[h]
		if rep != nil && !tenancy.MayUse(id, rep.namespace, rep.access) {
			rep = nil
		}
		var gateway error
		if rep != nil && throughGateway(id, rep) {
			gateway = &ThroughGatewayError{Namespace: id.Namespace, Deployment: rep.namespace + "/" + rep.deployment}
		}
		s.mu.Unlock()
		if rep == nil {
			return "", &enginepool.UnknownModelError{Model: h}
		}
		if gateway != nil {
			return "", gateway
		}
		if findModel(snap, h) == nil {
			return "", downloadingError(h)
		}
		return h, nil
	}
	var cands []candidate
	s.mu.Lock()
	for _, rep := range s.replicas {
		if rep.phase == phaseRemoving || !answersTo(rep, model) || !tenancy.MayUse(id, rep.namespace, rep.access) {
			continue
		}
		m := findModel(snap, rep.key)
		cands = append(cands, candidate{key: rep.key, deployment: rep.namespace + "/" + rep.deployment,
			registered: rep.phase == phaseRegistered && m != nil, ready: m != nil && m.State == enginepool.StateReady,
			gateway: throughGateway(id, rep)})
	}
	s.mu.Unlock()
	if len(cands) == 0 {
		return "", &enginepool.UnknownModelError{Model: model}
	}
	var deps []string
	for _, c := range cands {
		if !slices.Contains(deps, c.deployment) {
			deps = append(deps, c.deployment)
		}
	}
	if len(deps) > 1 {
		slices.Sort(deps)
		return "", &AmbiguousModelError{Model: model, Deployments: deps}
	}
	slices.SortFunc(cands, func(a, b candidate) int {
		return cmp.Or(-cmpBool(a.registered, b.registered), -cmpBool(a.ready, b.ready), cmp.Compare(a.key, b.key))
	})
	if cands[0].gateway {
		return "", &ThroughGatewayError{Namespace: id.Namespace, Deployment: cands[0].deployment}
	}
	if !cands[0].registered {
		return "", downloadingError(model)
	}
	return cands[0].key, nil
}

// ListModels is what GET /v1/models shows r's caller: the served names of the
// replicas on this node it may use.
func (s *Syncer) ListModels(r *http.Request) []string {
	id, _ := tenancy.IdentityFrom(r.Context())
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, rep := range s.replicas {
		if n := servedName(rep.template, rep.deployment); n != "" && !slices.Contains(out, n) && rep.phase != phaseRemoving && tenancy.MayUse(id, rep.namespace, rep.access) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// DeploymentOf is the deployment ("namespace/name") of the replica whose pool entry
// is key, or key itself for an entry that is no replica's (any more).
func (s *Syncer) DeploymentOf(key string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rep := s.replicas[key]; rep != nil {
		return rep.namespace + "/" + rep.deployment
	}
	return key
}

// throughGateway says whether id, who may use rep, must call it through the gateway:
// a caller of a namespace with a TokenBudget (the replica's spec.budgetedNamespaces).
// The fleet token's admin — the gateway's own requests — never.
func throughGateway(id tenancy.Identity, rep *replica) bool {
	return !id.Admin && slices.Contains(rep.budgeted, id.Namespace)
}

// accessOf is the namespaces mr's spec.access grants.
func accessOf(mr *v1alpha1.ModelReplica) []string {
	if mr.Spec.Access == nil {
		return nil
	}
	return slices.Clone(mr.Spec.Access.Namespaces)
}

func answersTo(rep *replica, model string) bool {
	names := append([]string{servedName(rep.template, rep.deployment)}, rep.template.Model.Aliases...)
	for _, n := range names {
		if n != "" && (model == n || model == rep.namespace+"/"+n) {
			return true
		}
	}
	return false
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

func downloadingError(model string) error {
	return &enginepool.UnavailableError{Model: model, State: enginepool.StateAbsent, ErrCode: enginepool.CodeModelLoading,
		Reason: "the model is still being downloaded to this node", Retry: 5 * time.Second}
}
