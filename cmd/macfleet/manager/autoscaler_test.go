package manager_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/cmd/macfleet/manager"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestAutoscalerWiring runs the manager as `macfleet manager` does, with a fake agent
// over plain HTTP (Config.AgentHTTP; the certificates the manager reads real agents
// with are tested in controllers/autoscaler and end to end): the autoscaler reads the
// load of an autoscaled deployment's Ready replica from its agent's /api/status,
// scales the deployment, and the deployment controller creates the new replicas.
func TestAutoscalerWiring(t *testing.T) {
	c := env.Client
	ctx := t.Context()
	ns := testenv.NewNamespace(t, c)
	// The agent: 3 requests in flight on the first replica.
	var leases, reads atomic.Int32
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reads.Add(1)
		models := []map[string]any{}
		if name := firstReplica.Load(); name != nil {
			models = append(models, map[string]any{"name": ns + "/" + *name, "leases": leases.Load()})
		}
		body := map[string]any{"ready": true, "models": models}
		_ = json.NewEncoder(w).Encode(body)
	}))
	t.Cleanup(agent.Close)

	startManager(t, manager.Config{
		RestConfig:         env.Config,
		MetricsAddr:        "0",
		ProbeAddr:          "0",
		AgentHTTP:          &http.Client{Timeout: 5 * time.Second},
		AutoscalerInterval: 50 * time.Millisecond,
	})

	allowModelsExample(t, c)
	md := &mfv1.ModelDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "elastic"},
		Spec: mfv1.ModelDeploymentSpec{
			Model:     mfv1.ModelSource{Source: "https://models.example/chat.gguf"},
			Resources: &mfv1.ModelResources{Memory: ptr.To(resource.MustParse("2Gi"))},
			Autoscaling: &mfv1.AutoscalingSpec{MaxReplicas: 3, TargetInFlight: ptr.To[int32](1),
				StabilizationWindow: &metav1.Duration{}},
		},
	}
	if err := c.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	// The deployment controller creates the first replica; the test plays its agent
	// and reports it Ready at the fake agent's address.
	var first mfv1.ModelReplica
	testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() (bool, string) {
		var list mfv1.ModelReplicaList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		if len(list.Items) != 1 {
			return false, fmt.Sprintf("%d replicas", len(list.Items))
		}
		first = list.Items[0]
		return true, ""
	})
	// A copy: first is decoded into again below while the agent's handler reads the name.
	name := first.Name
	firstReplica.Store(&name)
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(&first), &first); err != nil {
			return err
		}
		meta.SetStatusCondition(&first.Status.Conditions, metav1.Condition{Type: mfv1.ReplicaReady, Status: metav1.ConditionTrue, Reason: mfv1.ReasonRunnerReady})
		first.Status.Endpoint = strings.TrimPrefix(agent.URL, "http://")
		return c.Status().Update(ctx, &first)
	}); err != nil {
		t.Fatal(err)
	}
	waitAutoscaling := func(replicas int32, reason, msg string) {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() (bool, string) {
			if err := c.Get(ctx, client.ObjectKeyFromObject(md), md); err != nil {
				return false, err.Error()
			}
			cond := meta.FindStatusCondition(md.Status.Conditions, mfv1.DeploymentAutoscaling)
			got := ptr.Deref(md.Spec.Replicas, -1)
			return cond != nil && got == replicas && cond.Reason == reason && strings.Contains(cond.Message, msg),
				fmt.Sprintf("replicas %d, condition %+v", got, cond)
		})
	}
	waitAutoscaling(1, mfv1.ReasonWithinTarget, "the autoscaler owns spec.replicas (1 to 3 replicas, target 1 requests in flight each)")

	leases.Store(3)
	waitAutoscaling(3, mfv1.ReasonWithinTarget, "3 replicas for the load")
	testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() (bool, string) {
		var list mfv1.ModelReplicaList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 3, fmt.Sprintf("%d replicas, want the 3 the autoscaler asked for", len(list.Items))
	})
	if n := reads.Load(); n == 0 {
		t.Error("the autoscaler scaled without reading the agent")
	}
}

// firstReplica names the replica the fake agent of TestAutoscalerWiring serves.
var firstReplica atomic.Pointer[string]
