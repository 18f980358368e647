package cluster

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// LoadFleetToken reads the fleet token from file when set, else from the Secret
// macfleet-system/macfleet-fleet-token (key "token") with the agent's credential.
func LoadFleetToken(ctx context.Context, c client.Reader, file string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("reading the fleet token: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", fmt.Errorf("the fleet token file %s is empty", file)
		}
		return tok, nil
	}
	var sec corev1.Secret
	key := types.NamespacedName{Namespace: v1alpha1.SystemNamespace, Name: v1alpha1.FleetTokenSecret}
	if err := c.Get(ctx, key, &sec); err != nil {
		return "", fmt.Errorf("reading the fleet token from Secret %s (or pass --fleet-token-file): %w", key, err)
	}
	tok := strings.TrimSpace(string(sec.Data[v1alpha1.FleetTokenKey]))
	if tok == "" {
		return "", fmt.Errorf("Secret %s has no %q key", key, v1alpha1.FleetTokenKey)
	}
	return tok, nil
}

// TokenSource holds the fleet token and follows its rotation: Run re-reads the file
// (or the Secret) every Interval and switches to a new token at once; a failed read
// keeps the current one. The request path only reads memory.
type TokenSource struct {
	reader   client.Reader
	file     string
	interval time.Duration
	clock    clock.WithTicker
	log      logr.Logger

	mu  sync.RWMutex
	tok string
}

// NewTokenSource starts from token (already read, so that a missing one fails the
// start), re-read from file, else from the Secret through c, every interval (default
// 10s for a file, 1m for the Secret).
func NewTokenSource(token string, c client.Reader, file string, interval time.Duration, log logr.Logger) *TokenSource {
	if interval <= 0 {
		interval = time.Minute
		if file != "" {
			interval = 10 * time.Second
		}
	}
	return &TokenSource{reader: c, file: file, interval: interval, clock: clock.RealClock{}, log: log, tok: token}
}

// Token is the current fleet token.
func (t *TokenSource) Token() string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.tok
}

// Run refreshes the token until ctx ends.
func (t *TokenSource) Run(ctx context.Context) error {
	tick := t.clock.NewTicker(t.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
		}
		tok, err := LoadFleetToken(ctx, t.reader, t.file)
		if err != nil {
			if ctx.Err() == nil {
				t.log.V(1).Info("Re-reading the fleet token failed; keeping the current one", "err", err.Error())
			}
			continue
		}
		t.mu.Lock()
		changed := tok != t.tok
		t.tok = tok
		t.mu.Unlock()
		if changed {
			t.log.Info("The fleet token changed; requests must present the new one")
		}
	}
}
