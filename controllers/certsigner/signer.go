package certsigner

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/pki"
)

// Condition reasons the signer writes on CertificateSigningRequests.
const (
	ReasonApproved = "MacfleetNodeIdentity"
	ReasonDenied   = "NotTheRequestersNode"
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

// The signer reads the requests, records its decision and the certificate, for its
// signer name only.
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval;certificatesigningrequests/status,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,resourceNames=macfleet.dev/node,verbs=approve;sign

// Signer approves, denies and signs the CertificateSigningRequests of NodeSignerName.
type Signer struct {
	Client    client.Client
	Clientset kubernetes.Interface
	Authority *Authority
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
	ours := predicate.NewPredicateFuncs(func(o client.Object) bool {
		csr, ok := o.(*certv1.CertificateSigningRequest)
		return ok && csr.Spec.SignerName == pki.NodeSignerName
	})
	return ctrl.NewControllerManagedBy(mgr).Named("certsigner").
		For(&certv1.CertificateSigningRequest{}, builder.WithPredicates(ours)).Complete(s)
}

// Reconcile approves (or denies) a pending request, then signs an approved one.
func (s *Signer) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	csr := &certv1.CertificateSigningRequest{}
	if err := s.Client.Get(ctx, req.NamespacedName, csr); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if csr.Spec.SignerName != pki.NodeSignerName || len(csr.Status.Certificate) > 0 || hasCondition(csr, certv1.CertificateDenied) || hasCondition(csr, certv1.CertificateFailed) {
		return ctrl.Result{}, nil
	}
	node, why := Decide(csr)
	if !hasCondition(csr, certv1.CertificateApproved) {
		cond := certv1.CertificateSigningRequestCondition{Type: certv1.CertificateApproved, Status: corev1.ConditionTrue,
			Reason: ReasonApproved, Message: "the requester is the node identity of " + node + " and asks for that node's certificate"}
		if why != nil {
			cond = certv1.CertificateSigningRequestCondition{Type: certv1.CertificateDenied, Status: corev1.ConditionTrue,
				Reason: ReasonDenied, Message: why.Error()}
		}
		cond.LastUpdateTime = metav1.Now()
		csr.Status.Conditions = append(csr.Status.Conditions, cond)
		if _, err := s.Clientset.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
			return ctrl.Result{}, fmt.Errorf("recording the decision on %s: %w", csr.Name, err)
		}
		log.Info("Decided on a certificate request", "csr", csr.Name, "requester", csr.Spec.Username, "approved", why == nil)
		return ctrl.Result{}, nil // the update triggers the signing pass
	}
	if why != nil {
		// Approved by someone else, yet not a request this signer signs.
		return ctrl.Result{}, s.fail(ctx, csr, why.Error())
	}
	select {
	case <-s.Authority.Loaded():
	default:
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	parsed, err := pki.CheckCSR(csr.Spec.Request, pki.Node(node))
	if err != nil {
		return ctrl.Result{}, s.fail(ctx, csr, err.Error())
	}
	a := s.Authority
	a.mu.RLock()
	ca := a.rotation.Current
	a.mu.RUnlock()
	cert, err := ca.Issue(parsed.PublicKey, pki.Node(node), a.Clock.Now(), lifetime(csr, a.LeafLifetime))
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
	log.Info("Signed a node's certificate", "csr", csr.Name, "node", node, "notAfter", cert.NotAfter)
	return ctrl.Result{}, nil
}

func (s *Signer) fail(ctx context.Context, csr *certv1.CertificateSigningRequest, msg string) error {
	csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{Type: certv1.CertificateFailed,
		Status: corev1.ConditionTrue, Reason: ReasonDenied, Message: msg, LastUpdateTime: metav1.Now()})
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
