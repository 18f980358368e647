package credentials

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/pki/keypin"
)

// Every token of a node is bound (TokenRequest boundObjectRef) to one Secret in
// macfleet-nodes that exists only while the Mac is enrolled: the API server accepts a
// bound token only while that Secret exists with the UID it was bound to, so deleting
// the Secret (Revoke) revokes every token the Mac holds, and the agent's own renewals
// (Rotator) must bind to it too (config/admission/node-restriction.yaml).

// BindingSecretName is the Secret in macfleet-nodes that node's tokens are bound to.
func BindingSecretName(node string) string { return node + "-credential" }

// bindingAnnotation says what the binding Secret is for, to whoever finds it.
const bindingAnnotation = "macfleet.dev/description"

// ensureBinding returns node's binding Secret, creating it (owned by the node's
// ServiceAccount, so that deleting the identity deletes it) if it does not exist.
func ensureBinding(ctx context.Context, cs kubernetes.Interface, node string) (*corev1.Secret, error) {
	secrets := cs.CoreV1().Secrets(v1alpha1.NodeIdentityNamespace)
	ref := v1alpha1.NodeIdentityNamespace + "/" + BindingSecretName(node)
	s, err := secrets.Get(ctx, BindingSecretName(node), metav1.GetOptions{})
	if err == nil {
		return s, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading the binding Secret %s: %w", ref, err)
	}
	sa, err := cs.CoreV1().ServiceAccounts(v1alpha1.NodeIdentityNamespace).Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading ServiceAccount %s/%s: %w", v1alpha1.NodeIdentityNamespace, node, err)
	}
	s = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: BindingSecretName(node), Namespace: v1alpha1.NodeIdentityNamespace, Labels: labels,
			Annotations: map[string]string{bindingAnnotation: "The tokens of node " + node + " are bound to this Secret: " +
				"deleting it (macfleet nodes revoke " + node + ") revokes them all."},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ServiceAccount", Name: sa.Name, UID: sa.UID}},
		},
		Type: corev1.SecretTypeOpaque,
	}
	created, err := secrets.Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return secrets.Get(ctx, BindingSecretName(node), metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("creating the binding Secret %s: %w", ref, err)
	}
	return created, nil
}

// clearPin removes the key pin (keypin.PinAnnotation) from a binding Secret and
// returns the pin it removed, empty when there was none.
func clearPin(ctx context.Context, cs kubernetes.Interface, bound *corev1.Secret) (string, error) {
	pin, ok := bound.Annotations[keypin.PinAnnotation]
	if !ok {
		return "", nil
	}
	b := bound.DeepCopy()
	delete(b.Annotations, keypin.PinAnnotation)
	if _, err := cs.CoreV1().Secrets(b.Namespace).Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		return "", fmt.Errorf("clearing the key pin on the binding Secret %s/%s: %w", b.Namespace, b.Name, err)
	}
	return pin, nil
}

// tokenRequest asks for a token of the node's ServiceAccount, for the API server's
// own audience, bound to the Secret named bound (with its UID) and lasting d.
func tokenRequest(bound string, boundUID string, d time.Duration) *authenticationv1.TokenRequest {
	return &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: new(int64(d / time.Second)),
		BoundObjectRef: &authenticationv1.BoundObjectReference{
			Kind: "Secret", APIVersion: "v1", Name: bound, UID: types.UID(boundUID),
		},
	}}
}

// requestToken mints a token for node bound to its binding Secret.
func requestToken(ctx context.Context, cs kubernetes.Interface, node string, bound *corev1.Secret,
	d time.Duration) (*authenticationv1.TokenRequest, error) {
	tr, err := cs.CoreV1().ServiceAccounts(v1alpha1.NodeIdentityNamespace).CreateToken(ctx, node,
		tokenRequest(bound.Name, string(bound.UID), d), metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", v1alpha1.NodeIdentityNamespace, node, err)
	}
	return tr, nil
}

// Revoke makes every token issued to node stop working, those its agent renewed
// included: it replaces the node's binding Secret with a new one (new UID), which
// holds no key pin (keypin): the Mac's next certificate request pins a key again. The
// identity, its MacNode and its replicas stay; `macfleet nodes credentials` issues
// a new credential bound to the new Secret.
func Revoke(ctx context.Context, cs kubernetes.Interface, node string) error {
	if err := ValidateNodeName(node); err != nil {
		return err
	}
	ref := v1alpha1.NodeIdentityNamespace + "/" + BindingSecretName(node)
	err := cs.CoreV1().Secrets(v1alpha1.NodeIdentityNamespace).Delete(ctx, BindingSecretName(node), metav1.DeleteOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("node %s has no binding Secret %s: it holds no revocable credential (credentials issued before "+
			"tokens were bound last until they expire or its ServiceAccount is deleted)", node, ref)
	case err != nil:
		return fmt.Errorf("deleting the binding Secret %s: %w", ref, err)
	}
	if _, err := ensureBinding(ctx, cs, node); err != nil {
		return err
	}
	return nil
}

// boundCeiling writes the operator's bound into MacNode node's spec.memoryCeiling,
// creating the MacNode when its agent has not registered yet.
func boundCeiling(ctx context.Context, base *rest.Config, node string, q resource.Quantity) error {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(base, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("building a client: %w", err)
	}
	var mn v1alpha1.MacNode
	switch err := c.Get(ctx, client.ObjectKey{Name: node}, &mn); {
	case apierrors.IsNotFound(err):
		mn = v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: node}, Spec: v1alpha1.MacNodeSpec{MemoryCeiling: &q}}
		if err := c.Create(ctx, &mn); err != nil {
			return fmt.Errorf("creating MacNode %s with spec.memoryCeiling %s: %w", node, q.String(), err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading MacNode %s: %w", node, err)
	}
	before := mn.DeepCopy()
	mn.Spec.MemoryCeiling = &q
	if err := c.Patch(ctx, &mn, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("setting spec.memoryCeiling of MacNode %s to %s: %w", node, q.String(), err)
	}
	return nil
}
