package certsigner

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/certsigner/csrcleanup"
	"github.com/macfleet/macfleet/internal/credentials"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/pki/keypin"
)

// Condition reasons the signer writes on CertificateSigningRequests.
const (
	ReasonApproved = "MacfleetNodeIdentity"
	ReasonDenied   = "NotTheRequestersNode"
	// ReasonNotPinnedKey: the request's key is not the one pinned to its Mac, and no
	// proof by the pinned key vouches for it (package keypin).
	ReasonNotPinnedKey = "NotTheNodesPinnedKey"
)

// allowedUsages are the key usages a node's certificate may ask for (it gets exactly
// digital signature, server auth and client auth).
var allowedUsages = []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment,
	certv1.UsageServerAuth, certv1.UsageClientAuth}

// Decide says whether a CertificateSigningRequest for NodeSignerName may be signed:
// its requester must be a node identity (system:serviceaccount:macfleet-nodes:<node>)
// and the request must name exactly that node. It returns the node, or why not.
func Decide(csr *certv1.CertificateSigningRequest) (node string, why error) {
	if csr.Spec.SignerName != pki.NodeSignerName {
		return "", fmt.Errorf("the signer is %q, not %s", csr.Spec.SignerName, pki.NodeSignerName)
	}
	prefix := "system:serviceaccount:" + mfv1.NodeIdentityNamespace + ":"
	node, ok := strings.CutPrefix(csr.Spec.Username, prefix)
	if !ok || node == "" {
		return "", fmt.Errorf("the requester %q is not a node identity (%s<node>): only a Mac's own agent may ask for its certificate", csr.Spec.Username, prefix)
	}
	for _, u := range csr.Spec.Usages {
		if !slices.Contains(allowedUsages, u) {
			return "", fmt.Errorf("the usage %q is not one a node's certificate has (%v)", u, allowedUsages)
		}
	}
	if _, err := pki.CheckCSR(csr.Spec.Request, pki.Node(node)); err != nil {
		return "", err
	}
	return node, nil
}

// lifetime is the certificate lifetime for csr: its expirationSeconds, at most max.
func lifetime(csr *certv1.CertificateSigningRequest, most time.Duration) time.Duration {
	if s := csr.Spec.ExpirationSeconds; s != nil && time.Duration(*s)*time.Second < most {
		return max(time.Duration(*s)*time.Second, 10*time.Minute)
	}
	return most
}

// The signer reads the requests, records its decision and the certificate, and
// deletes them when done, for its signer name only; it keeps each Mac's key pin on
// the Mac's binding Secret in macfleet-nodes.
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval;certificatesigningrequests/status,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,resourceNames=macfleet.dev/node,verbs=approve;sign
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;update,namespace=macfleet-nodes

// Signer approves, denies and signs the CertificateSigningRequests of NodeSignerName,
// for the key pinned to the requester's Mac (package keypin), and deletes them once
// done (package csrcleanup).
type Signer struct {
	Client    client.Client
	Clientset kubernetes.Interface
	Authority *Authority
	// Retention is how long requests are kept; zero means csrcleanup.DefaultRetention.
	Retention csrcleanup.Retention
	// Clock tells the requests' age; nil means the real clock.
	Clock clock.PassiveClock
}

// SetupWithManager watches the requests of NodeSignerName.
func (s *Signer) SetupWithManager(mgr ctrl.Manager) error {
	if s.Client == nil {
		s.Client = mgr.GetClient()
	}
	if s.Clientset == nil {
		cs, err := kubernetes.NewForConfig(mgr.GetConfig())
		if err != nil {
			return err
		}
		s.Clientset = cs
	}
	if s.Retention == (csrcleanup.Retention{}) {
		s.Retention = csrcleanup.DefaultRetention
	}
	if s.Clock == nil {
		s.Clock = clock.RealClock{}
	}
	ours := predicate.NewPredicateFuncs(func(o client.Object) bool {
		csr, ok := o.(*certv1.CertificateSigningRequest)
		return ok && csr.Spec.SignerName == pki.NodeSignerName
	})
	return ctrl.NewControllerManagedBy(mgr).Named("certsigner").
		For(&certv1.CertificateSigningRequest{}, builder.WithPredicates(ours)).Complete(s)
}

// Reconcile deletes a request that is due (csrcleanup), approves (or denies) a
// pending one, then pins the key and signs an approved one.
func (s *Signer) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	csr := &certv1.CertificateSigningRequest{}
	if err := s.Client.Get(ctx, req.NamespacedName, csr); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if csr.Spec.SignerName != pki.NodeSignerName {
		return ctrl.Result{}, nil
	}
	remove, after := csrcleanup.Decide(csr, s.Clock.Now(), s.Retention)
	if remove {
		return ctrl.Result{}, s.delete(ctx, csr)
	}
	if len(csr.Status.Certificate) > 0 || hasCondition(csr, certv1.CertificateDenied) || hasCondition(csr, certv1.CertificateFailed) {
		return ctrl.Result{RequeueAfter: after}, nil
	}
	v, err := s.judge(ctx, csr)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !hasCondition(csr, certv1.CertificateApproved) {
		cond := certv1.CertificateSigningRequestCondition{Type: certv1.CertificateApproved, Status: corev1.ConditionTrue,
			Reason: ReasonApproved, Message: "the requester is the node identity of " + v.node + " and asks for that node's certificate, for " + v.pin.Why}
		if v.why != nil {
			cond = certv1.CertificateSigningRequestCondition{Type: certv1.CertificateDenied, Status: corev1.ConditionTrue,
				Reason: v.reason, Message: v.why.Error()}
		}
		cond.LastUpdateTime = metav1.Now()
		csr.Status.Conditions = append(csr.Status.Conditions, cond)
		if _, err := s.Clientset.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
			return ctrl.Result{}, fmt.Errorf("recording the decision on %s: %w", csr.Name, err)
		}
		log.Info("Decided on a certificate request", "csr", csr.Name, "requester", csr.Spec.Username, "approved", v.why == nil, "why", cond.Message)
		return ctrl.Result{}, nil // the update triggers the signing pass
	}
	if v.why != nil {
		// Approved by someone else, or another request moved the pin since.
		return ctrl.Result{}, s.fail(ctx, csr, v.reason, v.why.Error())
	}
	select {
	case <-s.Authority.Loaded():
	default:
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	// The pin first: a request that lost a race for it is refused on its next pass.
	if err := s.pin(ctx, v.binding, v.pin.Pin); apierrors.IsConflict(err) {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	a := s.Authority
	a.mu.RLock()
	ca := a.rotation.Current
	a.mu.RUnlock()
	cert, err := ca.Issue(v.csr.PublicKey, pki.Node(v.node), a.Clock.Now(), lifetime(csr, a.LeafLifetime))
	if err != nil {
		return ctrl.Result{}, err
	}
	csr.Status.Certificate = pki.EncodeCerts(cert)
	if _, err := s.Clientset.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, csr, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		return ctrl.Result{}, fmt.Errorf("writing the certificate of %s: %w", csr.Name, err)
	}
	log.Info("Signed a node's certificate", "csr", csr.Name, "node", v.node, "key", v.pin.Pin, "notAfter", cert.NotAfter)
	return ctrl.Result{}, nil
}

// verdict is the signer's decision on one request.
type verdict struct {
	node string
	csr  *x509.CertificateRequest
	// binding is the Mac's binding Secret, nil when it has none.
	binding *corev1.Secret
	pin     keypin.Decision
	// why and reason: why it may not be signed, nil when it may.
	why    error
	reason string
}

// judge decides on csr: its requester and names (Decide), then its key against the
// Mac's pin, read from the Mac's binding Secret (an error only when that read fails).
func (s *Signer) judge(ctx context.Context, csr *certv1.CertificateSigningRequest) (verdict, error) {
	node, why := Decide(csr)
	if why != nil {
		return verdict{why: why, reason: ReasonDenied}, nil
	}
	v := verdict{node: node, reason: ReasonNotPinnedKey}
	parsed, err := pki.CheckCSR(csr.Spec.Request, pki.Node(node))
	if err != nil {
		return verdict{why: err, reason: ReasonDenied}, nil
	}
	v.csr = parsed
	sec, err := s.Clientset.CoreV1().Secrets(mfv1.NodeIdentityNamespace).Get(ctx, credentials.BindingSecretName(node), metav1.GetOptions{})
	pinned := ""
	switch {
	case err == nil:
		v.binding, pinned = sec, sec.Annotations[keypin.PinAnnotation]
	case !apierrors.IsNotFound(err):
		return v, fmt.Errorf("reading the binding Secret of node %s: %w", node, err)
	}
	v.pin = keypin.Decide(keypin.Request{Node: node, Key: parsed.PublicKey, Proof: csr.Annotations[keypin.ProofAnnotation],
		Enrolled: v.binding != nil, Pin: pinned})
	if !v.pin.Sign {
		v.why = errors.New(v.pin.Why)
	}
	return v, nil
}

// pin records fingerprint as the key of binding's Mac, if it is not already; the
// update carries the resourceVersion read, so that of two requests racing for a
// first pin or a rotation only one wins.
func (s *Signer) pin(ctx context.Context, binding *corev1.Secret, fingerprint string) error {
	if binding.Annotations[keypin.PinAnnotation] == fingerprint {
		return nil
	}
	b := binding.DeepCopy()
	if b.Annotations == nil {
		b.Annotations = map[string]string{}
	}
	b.Annotations[keypin.PinAnnotation] = fingerprint
	if _, err := s.Clientset.CoreV1().Secrets(b.Namespace).Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("pinning the key %s on the binding Secret %s/%s: %w", fingerprint, b.Namespace, b.Name, err)
	}
	return nil
}

// delete removes a request that is no longer needed (the UID guards against a new
// request of the same name).
func (s *Signer) delete(ctx context.Context, csr *certv1.CertificateSigningRequest) error {
	err := s.Clientset.CertificatesV1().CertificateSigningRequests().Delete(ctx, csr.Name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &csr.UID}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting the certificate request %s: %w", csr.Name, err)
	}
	ctrl.LoggerFrom(ctx).V(1).Info("Deleted a certificate request that is no longer needed", "csr", csr.Name)
	return nil
}

func (s *Signer) fail(ctx context.Context, csr *certv1.CertificateSigningRequest, reason, msg string) error {
	csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{Type: certv1.CertificateFailed,
		Status: corev1.ConditionTrue, Reason: reason, Message: msg, LastUpdateTime: metav1.Now()})
	_, err := s.Clientset.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, csr, metav1.UpdateOptions{})
	return err
}

func hasCondition(csr *certv1.CertificateSigningRequest, t certv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
