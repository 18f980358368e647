package endpoints

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/endpoints/addressproof"
)

// scripted answers Verify from a table by Mac name and records the calls.
type scripted struct {
	verdicts map[string]addressproof.Verdict
	probed   map[string]bool
	calls    []string
}

func (s *scripted) Verify(_ context.Context, node, addr string, _ time.Time) (addressproof.Verdict, bool) {
	s.calls = append(s.calls, node+"@"+addr)
	return s.verdicts[node], s.probed[node]
}

// TestVerifyAddresses: only the Macs holding a Ready replica of the deployment, with
// a usable address not excluded already, are verified, once each; those not proven
// are excluded with the verdict's reason, a failed handshake of this pass is an
// Event, and the deployment is looked at again at the earliest recheck.
func TestVerifyAddresses(t *testing.T) {
	// Each Mac with its address and one replica (two on "proven", none Ready on
	// "not-ready-replica"; "missing" has no MacNode).
	macs := []struct {
		node, addr string
		ready      metav1.ConditionStatus
	}{
		{"proven", "10.0.0.1:8080", metav1.ConditionTrue},
		{"refused-now", "10.0.0.2:8080", metav1.ConditionTrue},
		{"refused-before", "10.0.0.3:8080", metav1.ConditionTrue},
		{"api-server", "10.96.0.1:443", metav1.ConditionTrue},
		{"loopback", "127.0.0.1:8080", metav1.ConditionTrue},
		{"not-ready-replica", "10.0.0.6:8080", metav1.ConditionFalse},
	}
	nodes := nodeMap()
	replicas := []v1alpha1.ModelReplica{replica("again", "proven", metav1.ConditionTrue), replica("lost", "missing", metav1.ConditionTrue)}
	for _, m := range macs {
		nodes[m.node] = macNode(m.node, m.addr, metav1.ConditionTrue)
		replicas = append(replicas, replica("on-"+m.node, m.node, m.ready))
	}
	v := &scripted{
		verdicts: map[string]addressproof.Verdict{
			"proven":         {Proven: true, RecheckAfter: 5 * time.Minute},
			"refused-now":    {Why: "agent address 10.0.0.2:8080 failed verification (1 times): the server is macfleet://node/x", RecheckAfter: time.Second},
			"refused-before": {Why: "agent address 10.0.0.3:8080 failed verification (3 times): timeout", RecheckAfter: 3 * time.Second},
		},
		probed: map[string]bool{"refused-now": true},
	}
	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Addresses: v, Recorder: rec}
	excluded := map[string]string{"api-server": "an address of the API server"}

	recheck := r.verifyAddresses(context.Background(), dep, replicas, nodes, excluded)

	slices.Sort(v.calls)
	if diff := cmp.Diff([]string{"proven@10.0.0.1:8080", "refused-before@10.0.0.3:8080", "refused-now@10.0.0.2:8080"}, v.calls); diff != "" {
		t.Errorf("verified (-want +got):\n%s", diff)
	}
	want := map[string]string{
		"api-server":     "an address of the API server",
		"refused-now":    v.verdicts["refused-now"].Why,
		"refused-before": v.verdicts["refused-before"].Why,
	}
	if diff := cmp.Diff(want, excluded); diff != "" {
		t.Errorf("excluded (-want +got):\n%s", diff)
	}
	if recheck != time.Second {
		t.Errorf("recheck after %v, want the earliest, 1s", recheck)
	}
	close(rec.Events)
	var got []string
	for e := range rec.Events {
		got = append(got, e)
	}
	if len(got) != 1 || !strings.HasPrefix(got[0], "Warning AddressUnverified agent address 10.0.0.2:8080 failed verification") ||
		!strings.Contains(got[0], "--advertise-address") {
		t.Errorf("events %q, want one AddressUnverified Warning for refused-now naming the fix", got)
	}
}
