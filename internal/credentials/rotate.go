package credentials

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"
)

// ErrNotRenewable: the credential is not a token bound to a node's binding Secret
// (a client certificate, a token file, or a token issued before tokens were bound),
// so the agent cannot renew it; it works until it expires.
var ErrNotRenewable = errors.New("the credential is not a bound node token")

// renewRetry is the longest wait between two failed renewals.
const renewRetry = time.Minute

// Claims are what the API server put into a node token, as far as renewing it needs.
type Claims struct {
	// ID is the token's unique id (jti), which the API server's audit log records as
	// its credential id.
	ID                string
	IssuedAt, Expires time.Time
	// Namespace and ServiceAccount name the identity.
	Namespace, ServiceAccount string
	// Secret and SecretUID name the object the token is bound to; empty when unbound.
	Secret, SecretUID string
}

// ParseClaims reads the claims of a service account token without verifying it: the
// token is the holder's own, and the API server verifies it on every request.
func ParseClaims(token string) (Claims, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return Claims{}, errors.New("not a JSON web token")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return Claims{}, fmt.Errorf("decoding the token's claims: %w", err)
	}
	var raw struct {
		Jti      string
		Iat, Exp int64
		K8s      struct {
			Namespace      string
			ServiceAccount struct{ Name string } `json:"serviceaccount"`
			Secret         *struct{ Name, UID string }
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(payload, &raw); err != nil {
		return Claims{}, fmt.Errorf("decoding the token's claims: %w", err)
	}
	c := Claims{ID: raw.Jti, IssuedAt: time.Unix(raw.Iat, 0), Expires: time.Unix(raw.Exp, 0), Namespace: raw.K8s.Namespace,
		ServiceAccount: raw.K8s.ServiceAccount.Name}
	if raw.K8s.Secret != nil {
		c.Secret, c.SecretUID = raw.K8s.Secret.Name, raw.K8s.Secret.UID
	}
	return c, nil
}

// RenewAt is when a token is renewed: once 80% of its lifetime has passed, which
// leaves a fifth of it (about 5h of a 24h token) to retry through an API server
// outage.
func RenewAt(c Claims) time.Time { return c.IssuedAt.Add(c.Expires.Sub(c.IssuedAt) * 4 / 5) }

// KubeconfigFile is the kubeconfig file a renewed token is written to: the one given
// (flag, the agent's --kubeconfig), else $KUBECONFIG (env) when it names one file,
// else none ("": the credential came from a merged list or from inside a cluster).
func KubeconfigFile(flag, env string) string {
	if flag == "" && !strings.ContainsRune(env, filepath.ListSeparator) {
		return env
	}
	return flag
}

// RetryIn is how long after a failed renewal at now the next attempt waits: a tenth of
// the token's remaining lifetime, at least a second and at most renewRetry (a minute).
func RetryIn(c Claims, now time.Time) time.Duration {
	return min(renewRetry, max(c.Expires.Sub(now)/10, time.Second))
}

// Rotator holds a node agent's token and renews it before it expires, with a
// TokenRequest for its own ServiceAccount bound to the same Secret, for the same
// lifetime. Every client built from the rest.Config it took over authenticates with
// the current token; the kubeconfig file, when known, is rewritten with it so that a
// restarted agent starts with a token that still works.
type Rotator struct {
	// Clock times the renewals; NewRotator sets the real one (tests replace it
	// before Run).
	Clock clock.WithTicker

	kubeconfig string
	cs         kubernetes.Interface
	log        logr.Logger

	mu     sync.RWMutex
	token  string
	claims Claims
}

// NewRotator takes over rc's bearer token: from then on rc (and every client made
// from it) sends the rotator's current token. kubeconfig is the file to rewrite on
// each renewal ("" for none). It returns ErrNotRenewable, leaving rc alone, when rc
// does not hold a bound node token.
func NewRotator(rc *rest.Config, kubeconfig string, log logr.Logger) (*Rotator, error) {
	if rc.BearerToken == "" || rc.BearerTokenFile != "" {
		return nil, ErrNotRenewable
	}
	c, err := ParseClaims(rc.BearerToken)
	if err != nil || c.Secret == "" || c.ServiceAccount == "" {
		return nil, ErrNotRenewable
	}
	if err := checkNotExpired(c, kubeconfig, time.Now()); err != nil {
		return nil, err
	}
	r := &Rotator{kubeconfig: kubeconfig, Clock: clock.RealClock{}, log: log, token: rc.BearerToken, claims: c}
	rc.BearerToken = ""
	prev := rc.WrapTransport
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return &bearer{r: r, next: rt}
	}
	if r.cs, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, fmt.Errorf("building the token renewal client: %w", err)
	}
	return r, nil
}

// ErrExpired: the node token expired before the agent started (a Mac offline for
// longer than its token's lifetime); no renewal can replace it.
var ErrExpired = errors.New("the node token expired")

// checkNotExpired returns ErrExpired, naming the step that brings the Mac back, when
// the token expired at or before now.
func checkNotExpired(c Claims, kubeconfig string, now time.Time) error {
	if c.Expires.After(now) {
		return nil
	}
	where := "the agent's --kubeconfig"
	if kubeconfig != "" {
		where = kubeconfig
	}
	return fmt.Errorf("%w at %s (%s ago): give this Mac a new credential: on the admin machine "+
		"`macfleet nodes credentials %s -o %s.kubeconfig`, copy that file to %s on this Mac and start the agent again",
		ErrExpired, c.Expires.UTC().Format(time.RFC3339), now.Sub(c.Expires).Round(time.Minute), c.ServiceAccount, c.ServiceAccount, where)
}

// Claims are the claims of the current token.
func (r *Rotator) Claims() Claims {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.claims
}

func (r *Rotator) current() string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.token
}

// Run renews the token each time RenewAt comes, retrying a failed renewal every
// minute at most, until ctx ends.
func (r *Rotator) Run(ctx context.Context) error {
	for {
		c := r.Claims()
		wait := RenewAt(c).Sub(r.Clock.Now())
		r.log.V(1).Info("Next node token renewal", "in", wait.Round(time.Second), "expires", c.Expires)
		for {
			t := r.Clock.NewTimer(max(wait, 0))
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C():
			}
			err := r.Renew(ctx)
			if err == nil {
				break
			}
			now := r.Clock.Now()
			wait = RetryIn(c, now)
			if now.After(c.Expires) {
				err = fmt.Errorf("%w; the token expired at %s: give this Mac a new credential (macfleet nodes credentials %s)",
					err, c.Expires.UTC().Format(time.RFC3339), c.ServiceAccount)
			}
			r.log.Error(err, "Renewing the node token failed; retrying", "retryIn", wait, "expires", c.Expires)
		}
	}
}

// Renew replaces the token with a new one and rewrites the kubeconfig.
func (r *Rotator) Renew(ctx context.Context) error {
	c := r.Claims()
	lifetime := min(max(c.Expires.Sub(c.IssuedAt), MinDuration), MaxDuration)
	tr, err := r.cs.CoreV1().ServiceAccounts(c.Namespace).CreateToken(ctx, c.ServiceAccount,
		tokenRequest(c.Secret, c.SecretUID, lifetime), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("requesting a new token for ServiceAccount %s/%s: %w", c.Namespace, c.ServiceAccount, err)
	}
	next, err := ParseClaims(tr.Status.Token)
	if err != nil {
		return fmt.Errorf("the new token: %w", err)
	}
	r.mu.Lock()
	r.token, r.claims = tr.Status.Token, next
	r.mu.Unlock()
	r.log.Info("Renewed the node token", "id", next.ID, "expires", next.Expires)
	if r.kubeconfig == "" {
		return nil
	}
	if err := rewriteToken(r.kubeconfig, tr.Status.Token); err != nil {
		// The agent keeps the new token; only a restart after the old one expires
		// would need a new credential.
		r.log.Error(err, "Writing the renewed token to the kubeconfig failed", "kubeconfig", r.kubeconfig)
	}
	return nil
}

// rewriteToken sets the token of the current context's user in the kubeconfig at path.
func rewriteToken(path, token string) error {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return err
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil || cfg.AuthInfos[ctx.AuthInfo] == nil {
		return fmt.Errorf("kubeconfig %s has no user for its current context %q", path, cfg.CurrentContext)
	}
	cfg.AuthInfos[ctx.AuthInfo].Token = token
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	if _, err := os.Stat(path); err != nil {
		return err
	}
	return WriteFile(path, out)
}

// bearer sets the rotator's current token on every request that has no credential.
type bearer struct {
	r    *Rotator
	next http.RoundTripper
}

func (b *bearer) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Authorization") != "" {
		return b.next.RoundTrip(req)
	}
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+b.r.current())
	return b.next.RoundTrip(req)
}

// WrappedRoundTripper lets client-go see through the wrapper (for cancellation).
func (b *bearer) WrappedRoundTripper() http.RoundTripper { return b.next }
