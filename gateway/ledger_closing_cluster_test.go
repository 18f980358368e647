package gateway_test

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/ledger"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestLedgerBeatSkipsANamespaceBeingDeleted: the first namespace with a TokenBudget by
// name is being deleted (it stays terminating: the test's API server runs no
// namespace controller, as a namespace stuck on a finalizer does), so it refuses the
// gateway's new usage record. The gateway renews its heartbeat record in the next
// namespace with a budget, where the other replicas see that it is live; before, it
// retried the refused record for as long as it ran and renewed none.
func TestLedgerBeatSkipsANamespaceBeingDeleted(t *testing.T) {
	e := cluster(t)
	suffix := rand.String(6)
	closing, next := "0-closing-"+suffix, "0-next-"+suffix
	for _, ns := range []string{closing, next} {
		if err := e.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
		b := &mfv1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team"},
			Spec: mfv1.TokenBudgetSpec{TokensPerMinute: ptr.To[int64](200)}}
		if err := e.Client.Create(t.Context(), b); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = e.Client.Delete(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: next}})
	})
	if err := e.Client.Delete(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: closing}}); err != nil {
		t.Fatal(err)
	}
	id := "gw-closing-" + suffix
	startGateway(t, e, gateway.Config{TenantKeys: true, GatewayID: id})
	name := ledger.RecordName(id, time.Now())
	testenv.Eventually(t, 3*ledger.RenewEvery, 50*time.Millisecond, func() (bool, string) {
		var tu mfv1.TokenUsage
		err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: next, Name: name}, &tu)
		return err == nil, fmt.Sprintf("the gateway's heartbeat record %s/%s: %v", next, name, err)
	})
	var tu mfv1.TokenUsage
	if err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: closing, Name: name}, &tu); !apierrors.IsNotFound(err) {
		t.Errorf("a record in the namespace being deleted: %v, want none", err)
	}
}
