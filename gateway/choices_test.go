package gateway

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/fairqueue"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestParseHeadChoices: "n" is read as the slots a request takes, 1 for anything
// that is not a count above one (the agent gives the 400), at most maxChoices; a bad
// "n" never makes the gateway refuse the body itself.
func TestParseHeadChoices(t *testing.T) {
	for body, want := range map[string]int{
		`{"model":"m"}`:               1,
		`{"model":"m","n":3}`:         3,
		`{"model":"m","n":1}`:         1,
		`{"model":"m","n":0}`:         1,
		`{"model":"m","n":-2}`:        1,
		`{"model":"m","n":2.5}`:       1,
		`{"model":"m","n":"4"}`:       1,
		`{"model":"m","n":null}`:      1,
		`{"model":"m","n":100000}`:    maxChoices,
		`{"model":"m","n":{"x":1}}`:   1,
		`{"n":2,"model":"m","x":[1]}`: 2,
	} {
		for _, pb := range []int{0, 64} {
			h, aerr := parseHead([]byte(body), pb)
			if aerr != nil || h.N != want {
				t.Errorf("parseHead(%s, %d) = n %d, %v; want n %d", body, pb, h.N, aerr, want)
			}
		}
	}
}

// TestChoicesTakeSlots: through the gateway, a chat with n 2 on a replica with two
// slots takes both, so the next request waits in the queue until it ends.
func TestChoicesTakeSlots(t *testing.T) {
	g, rep := keysGateway(t, Options{})
	g.SetTable(BuildTable([]mfv1.ModelDeployment{deployment("a", "m", "")},
		[]mfv1.ModelReplica{withParallel(replica("a", "r0", "m", "mac", rep.host(), metav1.ConditionTrue), 2)},
		[]mfv1.MacNode{node("mac", metav1.ConditionTrue)}))
	wide := sendAsync(t, g.url, "/v1/chat/completions", `{"model":"m","n":2,"messages":[{"role":"user","content":"hi"}]}`,
		"Authorization", "Bearer key-a", "X-Test-Tag", "wide")
	rep.waitArrived(t, 1)
	next := send(t, g, "key-a", "next")
	g.waitQueued(t, fairqueue.Interactive, 1)
	if got := rep.order(); len(got) != 1 {
		t.Fatalf("the replica got %v while a 2-choice request held both its slots", got)
	}
	for range 2 {
		rep.gate <- struct{}{}
	}
	wantOK(t, map[string]<-chan answer{"wide": wide, "next": next})
	testenv.Eventually(t, 10*time.Second, time.Millisecond, func() (bool, string) {
		n := g.bal.Outstanding("a/r0")
		return n == 0, fmt.Sprintf("%d slots still counted after both ended", n)
	})
}
