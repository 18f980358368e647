package nodeauthz

import (
	"context"
	"fmt"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// Mode is the node authorization in force: what the API server lets a Mac's
// credential read of the ModelReplicas, whatever the chart or the flags meant.
type Mode string

// The modes Preflight tells apart.
const (
	// ModeWebhook: each Mac reads only the replicas bound to it (the API server asks
	// the node authorizer before RBAC).
	ModeWebhook Mode = "webhook"
	// ModeRBAC: every Mac may read every replica (RBAC's fallback grant, the node
	// authorizer not asked, or asked after RBAC).
	ModeRBAC Mode = "rbac"
	// ModeNone: a Mac cannot read even its own replicas; agents register and show
	// Ready while their replicas never load.
	ModeNone Mode = "none"
)

// ProbeNode names the node identity the preflight asks about. No ServiceAccount needs
// to exist: a SubjectAccessReview only asks.
const ProbeNode = "macfleet-preflight"

// InForce is the mode the API server's two answers show: may a node identity list
// every replica (readsAll), and the replicas bound to it (readsOwn)?
func InForce(readsAll, readsOwn bool) Mode {
	switch {
	case readsAll:
		return ModeRBAC
	case readsOwn:
		return ModeWebhook
	}
	return ModeNone
}

// Describe says what m means for the fleet and, where it is not the isolated mode,
// what to do about it.
func (m Mode) Describe() string {
	switch m {
	case ModeWebhook:
		return "node authorization in force: webhook — each Mac reads only the ModelReplicas bound to it"
	case ModeRBAC:
		return "node authorization in force: rbac — every Mac may read every tenant's ModelReplicas " +
			"(namespaces, deployment names, model sources, placements); to confine each Mac to its own, have the " +
			"API server ask the node authorizer before RBAC (config/authorization/authorization-config.yaml, docs/fleet.md)"
	}
	return "node authorization in force: none — a Mac cannot read the ModelReplicas bound to it, so its " +
		"replicas never load: have the API server ask the node authorizer (config/authorization/authorization-config.yaml) " +
		"or install the chart with nodeAuthorization.mode=auto (or config/agent-replica-reads)"
}

// Preflight asks the API server, with SubjectAccessReviews for the identity of
// ProbeNode, which mode is in force. It needs the right to create
// SubjectAccessReviews (authorization.k8s.io), which the manager and an administrator
// have.
func Preflight(ctx context.Context, cs kubernetes.Interface) (Mode, error) {
	readsAll, err := canList(ctx, cs, nil)
	if err != nil {
		return "", err
	}
	own := &authzv1.FieldSelectorAttributes{Requirements: []metav1.FieldSelectorRequirement{
		{Key: v1alpha1.ReplicaNodeNameField, Operator: metav1.FieldSelectorOpIn, Values: []string{ProbeNode}}}}
	readsOwn, err := canList(ctx, cs, own)
	if err != nil {
		return "", err
	}
	return InForce(readsAll, readsOwn), nil
}

func canList(ctx context.Context, cs kubernetes.Interface, fields *authzv1.FieldSelectorAttributes) (bool, error) {
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User:   nodeUserPrefix + ProbeNode,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + v1alpha1.NodeIdentityNamespace, "system:authenticated"},
		ResourceAttributes: &authzv1.ResourceAttributes{Verb: "list", Group: v1alpha1.GroupVersion.Group,
			Version: v1alpha1.GroupVersion.Version, Resource: "modelreplicas", FieldSelector: fields},
	}}
	got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("asking the API server what a Mac may read (SubjectAccessReview): %w", err)
	}
	return got.Status.Allowed, nil
}
