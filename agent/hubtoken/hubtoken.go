// Package hubtoken gives a node agent the fleet's model hub token: the Secret
// macfleet-system/macfleet-hub-token (key "token"), which an administrator writes once
// for the whole fleet instead of passing --hf-token on every Mac. A node's credential
// may get that one Secret by name and no other (config/agent/rbac.yaml).
//
// The trust is the --hf-token flag's: every Mac downloads every gated or private
// hf:// model its replicas name with it, and the stored file is shared with any
// deployment naming the same source (docs/source-policy.md).
package hubtoken

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

const (
	// SecretName is the Secret of macfleet-system that holds the token.
	SecretName = "macfleet-hub-token"
	// Key is the Secret's key of the token.
	Key = "token"
	// DefaultTTL is how long a read (or its absence) is used before the Secret is read
	// again: a token written or rotated reaches every Mac within it.
	DefaultTTL = time.Minute
	// readTimeout bounds one read of the Secret.
	readTimeout = 10 * time.Second
)

// Source reads the token, at most once per TTL.
type Source struct {
	Clientset kubernetes.Interface
	TTL       time.Duration
	Clock     clock.PassiveClock
	Log       logr.Logger

	mu     sync.Mutex
	token  string
	readAt time.Time
	said   string // the last problem logged, so that a lasting one is logged once
}

// Token is the fleet's hub token, "" when there is none: the Secret or its key is
// missing, or it cannot be read (logged once, with the reason). A failed read keeps
// the last token read until the next TTL.
func (s *Source) Token(ctx context.Context) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	clk, ttl := s.Clock, s.TTL
	if clk == nil {
		clk = clock.RealClock{}
	}
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	now := clk.Now()
	if !s.readAt.IsZero() && now.Sub(s.readAt) < ttl {
		return s.token
	}
	s.readAt = now
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	sec, err := s.Clientset.CoreV1().Secrets(mfv1.SystemNamespace).Get(rctx, SecretName, metav1.GetOptions{})
	problem := ""
	switch {
	case apierrors.IsNotFound(err):
		s.token = ""
	case err != nil:
		problem = "reading the fleet's hub token Secret " + mfv1.SystemNamespace + "/" + SecretName + " (keeping the last one read): " + err.Error()
	default:
		s.token = strings.TrimSpace(string(sec.Data[Key]))
		if s.token == "" {
			problem = "the fleet's hub token Secret " + mfv1.SystemNamespace + "/" + SecretName + " has no key " + Key + ": gated hf:// models are downloaded without a token"
		}
	}
	if problem != "" && problem != s.said {
		s.Log.Info("Hub token", "problem", problem)
	}
	s.said = problem
	return s.token
}
