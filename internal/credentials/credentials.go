// Package credentials mints node identities: one ServiceAccount per Mac in the
// macfleet-nodes namespace, named like its MacNode, and a kubeconfig that authenticates
// as it with a short-lived token from the TokenRequest API, bound to a Secret that
// exists only while the Mac is enrolled (binding.go: Revoke ends every token of a Mac).
// The agent renews its token before it expires (rotate.go).
//
// What an identity may do comes from the manifests in config/agent (RBAC for the group
// of all node identities) and config/admission (a ValidatingAdmissionPolicy that ties
// each identity to its own MacNode, its own Lease and the status of the replicas bound
// to it). This package only creates the identity and its credential.
package credentials

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/nodeauthz"
)

// DefaultDuration is the lifetime asked of a node token. The agent replaces its token
// with a fresh one well before it expires (Rotator), so a running Mac keeps working; a
// Mac whose agent stays down longer needs a new credential. The API server may cap it
// (--service-account-max-token-expiration); Credential.Expires is what it granted.
const DefaultDuration = 24 * time.Hour

// MaxDuration is the longest lifetime a node token may be asked for, by Issue and by
// an agent rotating its own (config/admission/node-restriction.yaml holds the same
// bound): a stolen token is useful for at most this long.
const MaxDuration = 48 * time.Hour

// MinDuration is the shortest token lifetime the TokenRequest API accepts.
const MinDuration = 10 * time.Minute

// PolicyName is the ValidatingAdmissionPolicy (and its binding) in config/admission.
const PolicyName = "macfleet-node-restriction"

// labels mark the objects this package creates.
var labels = map[string]string{
	"app.kubernetes.io/part-of":   "macfleet",
	"app.kubernetes.io/component": "node-identity",
}

// Options tune Issue.
type Options struct {
	// Duration is the token lifetime to ask for; zero means DefaultDuration.
	Duration time.Duration
	// Server is the API server URL written into the kubeconfig; empty means the
	// caller's own (rest.Config.Host). Macs often reach the API server by another
	// address than the administrator does.
	Server string
	// MemoryCeiling, when set, is the operator's bound on the Mac's memory: Issue
	// writes it into the MacNode's spec.memoryCeiling (creating the MacNode if the
	// agent has not yet), and the scheduler never believes the Mac has more.
	MemoryCeiling *resource.Quantity
}

// Credential is a node identity's kubeconfig and what went into it.
type Credential struct {
	// Node is the MacNode (and ServiceAccount) name.
	Node string
	// Kubeconfig is a complete kubeconfig file authenticating as the node.
	Kubeconfig []byte
	// Expires is when the API server says the token expires.
	Expires time.Time
	// PinReset is the fingerprint of the key that was pinned to the Mac and that
	// issuing this credential cleared (package keypin): the next certificate request
	// of the Mac pins a key again. Empty when no key was pinned.
	PinReset string
	// Warnings are things the administrator should know but that do not stop the
	// credential from working: a capped lifetime, missing RBAC or admission policy.
	Warnings []string
	// NodeAuthorization is the mode in force: what the API server lets the Mac read of
	// the ModelReplicas (nodeauthz.Preflight); empty when it could not be asked.
	NodeAuthorization nodeauthz.Mode
}

// ValidateNodeName reports why name cannot name a Mac: it names a MacNode, the
// node's ServiceAccount and its Lease, so it must be a DNS-1123 subdomain, and it may
// not be "default", the ServiceAccount every pod in macfleet-nodes would run as.
func ValidateNodeName(name string) error {
	if name == "" {
		return errors.New("a node name is required")
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("invalid node name %q: it names a MacNode and a ServiceAccount, so %s", name, strings.Join(errs, "; "))
	}
	if name == "default" {
		return fmt.Errorf("invalid node name %q: the ServiceAccount %s/default is shared by every pod in that namespace", name, v1alpha1.NodeIdentityNamespace)
	}
	return nil
}

// EnsureNode creates the ServiceAccount of node name in macfleet-nodes (or adds its
// labels when it exists). There is no shared secret to create: an agent gets its own
// certificate with this identity (controllers/certsigner).
func EnsureNode(ctx context.Context, cs kubernetes.Interface, name string) error {
	if err := ValidateNodeName(name); err != nil {
		return err
	}
	return ensureServiceAccount(ctx, cs, name)
}

func ensureServiceAccount(ctx context.Context, cs kubernetes.Interface, name string) error {
	sas := cs.CoreV1().ServiceAccounts(v1alpha1.NodeIdentityNamespace)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: v1alpha1.NodeIdentityNamespace, Labels: labels,
	}}
	_, err := sas.Create(ctx, sa, metav1.CreateOptions{})
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("creating ServiceAccount %s/%s: namespace %s does not exist; install the macfleet chart or `kubectl apply -f config/agent` first",
			v1alpha1.NodeIdentityNamespace, name, v1alpha1.NodeIdentityNamespace)
	case !apierrors.IsAlreadyExists(err):
		return fmt.Errorf("creating ServiceAccount %s/%s: %w", v1alpha1.NodeIdentityNamespace, name, err)
	}
	existing, err := sas.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading ServiceAccount %s/%s: %w", v1alpha1.NodeIdentityNamespace, name, err)
	}
	missing := false
	for k, v := range labels {
		if existing.Labels[k] != v {
			missing = true
		}
	}
	if !missing {
		return nil
	}
	if existing.Labels == nil {
		existing.Labels = map[string]string{}
	}
	for k, v := range labels {
		existing.Labels[k] = v
	}
	if _, err := sas.Update(ctx, existing, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("labelling ServiceAccount %s/%s: %w", v1alpha1.NodeIdentityNamespace, name, err)
	}
	return nil
}

// Issue ensures node name's identity (EnsureNode) and binding Secret, clears the key
// pinned to the Mac (a re-enrolled Mac may have lost its key), sets the
// operator's memory bound when opts asks for one, mints a token for it with the
// TokenRequest API, bound to the Secret, and renders a kubeconfig that reaches the API
// server of base (or opts.Server) with base's certificate authority.
func Issue(ctx context.Context, cs kubernetes.Interface, base *rest.Config, name string, opts Options) (*Credential, error) {
	duration := opts.Duration
	if duration == 0 {
		duration = DefaultDuration
	}
	if duration < MinDuration {
		return nil, fmt.Errorf("token duration %v is too short: the API server issues tokens for at least %v", duration, MinDuration)
	}
	if duration > MaxDuration {
		return nil, fmt.Errorf("token duration %v is too long: a node token lasts at most %v (the agent renews its own before it expires)",
			duration, MaxDuration)
	}
	server := opts.Server
	if server == "" {
		server = base.Host
	}
	server, err := normalizeServer(server)
	if err != nil {
		return nil, err
	}
	if err := EnsureNode(ctx, cs, name); err != nil {
		return nil, err
	}
	bound, err := ensureBinding(ctx, cs, name)
	if err != nil {
		return nil, err
	}
	pinReset, err := clearPin(ctx, cs, bound)
	if err != nil {
		return nil, err
	}
	if opts.MemoryCeiling != nil {
		if err := boundCeiling(ctx, base, name, *opts.MemoryCeiling); err != nil {
			return nil, err
		}
	}

	tr, err := requestToken(ctx, cs, name, bound, duration)
	if err != nil {
		return nil, err
	}
	cred := &Credential{Node: name, Expires: tr.Status.ExpirationTimestamp.Time, PinReset: pinReset}
	if granted := time.Until(cred.Expires); granted < duration-time.Minute {
		cred.Warnings = append(cred.Warnings, fmt.Sprintf(
			"the API server capped the token's lifetime: it expires at %s (asked for %v); issue a new credential before then",
			cred.Expires.UTC().Format(time.RFC3339), duration))
	}

	ca, err := caData(base)
	if err != nil {
		return nil, err
	}
	cred.Kubeconfig, err = render(name, server, ca, base, tr.Status.Token)
	if err != nil {
		return nil, err
	}
	cred.Warnings = append(cred.Warnings, preflight(ctx, cs)...)
	if cred.NodeAuthorization, err = nodeauthz.Preflight(ctx, cs); err != nil {
		cred.Warnings = append(cred.Warnings, err.Error())
	}
	return cred, nil
}

// normalizeServer accepts what rest.Config.Host may hold (host:port or a URL) and
// returns an https URL.
func normalizeServer(s string) (string, error) {
	if s == "" {
		return "", errors.New("no API server URL: pass --server")
	}
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return "", fmt.Errorf("invalid API server URL %q: want https://host:port", s)
	}
	return strings.TrimSuffix(u.String(), "/"), nil
}

func caData(c *rest.Config) ([]byte, error) {
	if len(c.CAData) > 0 || c.CAFile == "" {
		return c.CAData, nil
	}
	b, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("reading the certificate authority of your kubeconfig: %w", err)
	}
	return b, nil
}

// render builds the node's kubeconfig: one cluster, one user (the token), one
// context whose namespace holds the node's Lease.
func render(node, server string, ca []byte, base *rest.Config, token string) ([]byte, error) {
	const cluster = "macfleet"
	user := "macfleet-node-" + node
	ctxName := node + "@" + cluster
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[cluster] = &clientcmdapi.Cluster{
		Server:                   server,
		CertificateAuthorityData: ca,
		TLSServerName:            base.ServerName,
		InsecureSkipTLSVerify:    base.Insecure && len(ca) == 0,
	}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[ctxName] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: user, Namespace: v1alpha1.NodeLeaseNamespace}
	cfg.CurrentContext = ctxName
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("rendering the kubeconfig: %w", err)
	}
	return out, nil
}

// preflight reports what would leave the identity powerless or unrestricted. It reads
// with the administrator's credential; what it may not read it does not report.
func preflight(ctx context.Context, cs kubernetes.Interface) []string {
	var warnings []string
	_, err := cs.RbacV1().ClusterRoleBindings().Get(ctx, v1alpha1.AgentClusterRole, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		warnings = append(warnings, fmt.Sprintf(
			"ClusterRoleBinding %s does not exist: the node cannot register until the chart (or config/agent) is installed",
			v1alpha1.AgentClusterRole))
	}
	_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, PolicyName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		warnings = append(warnings, fmt.Sprintf(
			"ValidatingAdmissionPolicyBinding %s does not exist: nothing stops this node from writing other nodes' objects; install the chart (or config/admission)",
			PolicyName))
	}
	return warnings
}

// WriteFile writes a kubeconfig readable by its owner only (0600), replacing path
// atomically so that a token is never left in a file with wider permissions.
func WriteFile(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename there is nothing to remove
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
