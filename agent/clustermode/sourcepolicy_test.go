package clustermode_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestSourcePolicyAtTheAgent: the agent fetches under the cluster's SourcePolicy. A
// source its namespace may not use fails the replica's Downloaded condition with
// SourceNotAllowed and the fix; once the policy allows it, the retry succeeds.
func TestSourcePolicyAtTheAgent(t *testing.T) {
	b, err := os.ReadFile(tinyModel)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "tiny.gguf", time.Time{}, bytes.NewReader(b))
	}))
	t.Cleanup(hs.Close)

	holder := sourcepolicy.NewHolder(nil)
	st, err := store.New(t.TempDir(), store.Options{Policy: holder})
	if err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, agentOptions{store: st, sourcePolicy: holder})
	ns := testenv.NewNamespace(t, env.Client)
	newReplica(t, ns, "sp-0", a.node, replicaOpts{deployment: "sp", source: hs.URL + "/models/tiny.gguf", sha: hex.EncodeToString(sum[:])})
	mr := waitReplica(t, time.Minute, ns, "sp-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaDownloaded, metav1.ConditionFalse, v1alpha1.ReasonSourceNotAllowed)
	})
	c := meta.FindStatusCondition(mr.Status.Conditions, v1alpha1.ReplicaDownloaded)
	if want := `source host "127.0.0.1" is not allowed for namespace "` + ns + `": add it to spec.rules[].hosts`; !strings.Contains(c.Message, want) {
		t.Errorf("Downloaded message %q does not contain %q", c.Message, want)
	}

	sp := &v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.SourcePolicyName},
		Spec: v1alpha1.SourcePolicySpec{
			Rules:           []v1alpha1.SourcePolicyRule{{Namespaces: []string{ns}, Hosts: []string{"127.0.0.1"}, AllowPlainHTTP: true}},
			AllowedNetworks: []string{"127.0.0.0/8"},
		}}
	if err := env.Client.Create(t.Context(), sp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sp) })
	waitReplica(t, time.Minute, ns, "sp-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaDownloaded, metav1.ConditionTrue, v1alpha1.ReasonStored)
	})
}
