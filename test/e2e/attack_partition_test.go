package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestAttackCachePartitionOfAnotherTeam: team A shares its deployment with team B, and
// A's prompts are cached in A's partition (the partition the gateway names for A's
// keys). Team B calls the deployment's agent directly with its own ServiceAccount
// token, as a workload of B's namespace may, naming A's partition in the header the
// gateway uses, and sends A's prompt: it must restore nothing of A's, while A's next
// request restores it. Before the agent kept a tenant's requests in the tenant's own
// partition it passed the header on from any caller, and B's request restored A's
// prompt (the cached tokens, and their timing, tell B what A asked).
func TestAttackCachePartitionOfAnotherTeam(t *testing.T) {
	nsA, nsB := testenv.NewNamespace(t, fleet.Client), testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(nsA, "memo", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Access = &v1alpha1.Access{Namespaces: []string{nsB}}
	}))
	create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: nsB, Name: "app"}})
	waitReady(t, nsA, "memo", 1, 3*time.Minute)
	agent := localfleet.AgentURL(sliceAddresses(t, nsA, "memo", 1)[0])
	tokB := serviceAccountToken(t, nsB, "app", satoken.DefaultAudience)

	secret := strings.Repeat("Team A's confidential merger memo, paragraph after paragraph. ", 5)
	body := func(question string) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":2,"temperature":0,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`,
			nsA+"/memo", secret, question)
	}
	// asA is team A's request as the gateway sends it: the gateway's identity, A's partition.
	asA := func(question string) (int, string) {
		return call(t, agent, http.MethodPost, "/v1/chat/completions", asGateway, body(question), runnerapi.HeaderCachePartition, nsA)
	}
	if code, b := asA("Summarize the memo."); code != http.StatusOK {
		t.Fatalf("team A's first request: %d %s", code, b)
	}
	// The control: A's partition holds the memo for A.
	var restored int64
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		code, b := asA("Who wrote it?")
		if code != http.StatusOK {
			return false, fmt.Sprintf("team A's next request: %d %s", code, b)
		}
		restored = answerUsage(t, b).Cached
		return restored >= 64, fmt.Sprintf("team A's next request restored %d tokens of the memo", restored)
	})

	// The attack: team B's own token, A's partition named in the header.
	code, b := call(t, agent, http.MethodPost, "/v1/chat/completions", tokB, body("Who wrote it?"),
		runnerapi.HeaderCachePartition, nsA)
	if code != http.StatusOK {
		t.Fatalf("team B's token on the shared deployment: %d %s", code, b)
	}
	if got := answerUsage(t, b).Cached; got != 0 {
		t.Errorf("team B naming team A's partition restored %d tokens of A's memo (A restores %d)", got, restored)
	}
}
