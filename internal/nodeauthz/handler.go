package nodeauthz

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	authzv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// maxReviewBytes bounds a SubjectAccessReview's body; real ones are a few hundred bytes.
const maxReviewBytes = 64 << 10

// lookupTimeout bounds a read of the manager's cache (it waits while the cache syncs).
const lookupTimeout = 2 * time.Second

// Handler serves the webhook: it reads a SubjectAccessReview (authorization.k8s.io/v1)
// from the API server and answers with Decide's decision.
type Handler struct {
	// Lookup finds a replica's binding; CacheLookup builds one on the manager's cache.
	Lookup func(ctx context.Context, namespace, name string) (b Binding, found bool)
	Log    logr.Logger
	// Decisions, when set, counts the answers by decision ("allowed", "denied",
	// "no-opinion").
	Decisions *prometheus.CounterVec
}

// ServeHTTP answers one review. A malformed one gets a 400, which the API server treats
// as the webhook's failure (its failurePolicy).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST a SubjectAccessReview", http.StatusMethodNotAllowed)
		return
	}
	var sar authzv1.SubjectAccessReview
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxReviewBytes)).Decode(&sar); err != nil {
		http.Error(w, "decoding the SubjectAccessReview: "+err.Error(), http.StatusBadRequest)
		return
	}
	if sar.APIVersion != authzv1.SchemeGroupVersion.String() || sar.Kind != "SubjectAccessReview" {
		http.Error(w, fmt.Sprintf("want an %s SubjectAccessReview, got %s %s", authzv1.SchemeGroupVersion, sar.APIVersion, sar.Kind),
			http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	d := Decide(RequestOf(&sar.Spec), func(ns, name string) (Binding, bool) { return h.Lookup(ctx, ns, name) })
	h.Log.V(4).Info("Decided", "user", sar.Spec.User, "attributes", sar.Spec.ResourceAttributes, "allowed", d.Allowed,
		"denied", d.Denied, "reason", d.Reason)
	if h.Decisions != nil {
		label := "no-opinion"
		switch {
		case d.Allowed:
			label = "allowed"
		case d.Denied:
			label = "denied"
		}
		h.Decisions.WithLabelValues(label).Inc()
	}
	resp := authzv1.SubjectAccessReview{TypeMeta: sar.TypeMeta,
		Status: authzv1.SubjectAccessReviewStatus{Allowed: d.Allowed, Denied: d.Denied, Reason: d.Reason}}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(&resp); err != nil {
		h.Log.V(2).Info("Writing a SubjectAccessReview answer failed", "err", err)
	}
}

// RequestOf reads Decide's input from a SubjectAccessReview's spec.
func RequestOf(spec *authzv1.SubjectAccessReviewSpec) Request {
	r := Request{User: spec.User}
	a := spec.ResourceAttributes
	if a == nil {
		return r
	}
	r.Verb, r.Group, r.Resource, r.Subresource, r.Namespace, r.Name = a.Verb, a.Group, a.Resource, a.Subresource, a.Namespace, a.Name
	if a.FieldSelector != nil {
		for _, req := range a.FieldSelector.Requirements {
			r.FieldSelector = append(r.FieldSelector, Requirement{Key: req.Key, Operator: string(req.Operator), Values: req.Values})
		}
	}
	if a.LabelSelector != nil {
		for _, req := range a.LabelSelector.Requirements {
			r.LabelSelector = append(r.LabelSelector, Requirement{Key: req.Key, Operator: string(req.Operator), Values: req.Values})
		}
	}
	return r
}

// CacheLookup finds bindings in a reader of ModelReplicas — the manager's cache, so that
// answering costs no API request. A read error other than NotFound counts as not found
// (no opinion, so the request is refused) and is logged.
func CacheLookup(c client.Reader, log logr.Logger) func(ctx context.Context, namespace, name string) (Binding, bool) {
	return func(ctx context.Context, namespace, name string) (Binding, bool) {
		ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		defer cancel()
		var r v1alpha1.ModelReplica
		if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &r); err != nil {
			if !apierrors.IsNotFound(err) {
				log.Error(err, "Reading a replica's binding; answering no opinion", "ModelReplica", types.NamespacedName{Namespace: namespace, Name: name})
			}
			return Binding{}, false
		}
		return Binding{Node: r.Spec.NodeName, Workers: r.Spec.Split.WorkerNodes()}, true
	}
}
