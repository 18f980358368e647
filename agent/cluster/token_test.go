package cluster_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/agent/cluster"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/testenv"
)

// TestFleetToken reads the token from a file or the Secret, and follows a rotation of
// either while keeping the last good token when a read fails.
func TestFleetToken(t *testing.T) {
	ctx := t.Context()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := cluster.LoadFleetToken(ctx, env.Client, file); err != nil || tok != "one" {
		t.Fatalf("from the file: %q %v", tok, err)
	}
	// The package's API server is shared: an earlier run (-count) may have left them.
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.SystemNamespace}}); err != nil &&
		!apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	_ = env.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: v1alpha1.SystemNamespace,
		Name: v1alpha1.FleetTokenSecret}})
	if _, err := cluster.LoadFleetToken(ctx, env.Client, ""); err == nil || !strings.Contains(err.Error(), v1alpha1.FleetTokenSecret) {
		t.Errorf("without the Secret: %v; want an error naming it", err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: v1alpha1.SystemNamespace, Name: v1alpha1.FleetTokenSecret},
		Data: map[string][]byte{v1alpha1.FleetTokenKey: []byte("s1")}}
	if err := env.Client.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	if tok, err := cluster.LoadFleetToken(ctx, env.Client, ""); err != nil || tok != "s1" {
		t.Fatalf("from the Secret: %q %v", tok, err)
	}

	run := func(ts *cluster.TokenSource) {
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = ts.Run(rctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	fromFile := cluster.NewTokenSource("one", env.Client, file, 20*time.Millisecond, logr.Discard())
	run(fromFile)
	if err := os.WriteFile(file, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		return fromFile.Token() == "two", "token " + fromFile.Token()
	})
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	fromSecret := cluster.NewTokenSource("s1", env.Client, "", 20*time.Millisecond, logr.Discard())
	run(fromSecret)
	sec.Data[v1alpha1.FleetTokenKey] = []byte("s2")
	if err := env.Client.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		return fromSecret.Token() == "s2", "token " + fromSecret.Token()
	})
	if got := fromFile.Token(); got != "two" {
		t.Errorf("after the file went away the token is %q, want the last good one", got)
	}
}
