package clustermode_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// A model whose runner serves it without its prompt cache (qwen3next keeps a
// recurrent state, which cannot be cut back to a prefix) is Ready, and its replica's
// status and the agent's /api/status name the path off with the runner's reason; a
// llama model with the same cache settings names none.
func TestReplicaStatusNamesThePathsOff(t *testing.T) {
	spec, err := ggufsynth.TinyFamily(ggufsynth.Qwen3Next)
	if err != nil {
		t.Fatal(err)
	}
	hybrid := filepath.Join(t.TempDir(), "qwen3next.gguf")
	if err := ggufsynth.Write(hybrid, spec); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, agentOptions{promptCacheDir: t.TempDir()})
	ns := testenv.NewNamespace(t, env.Client)
	cache := &v1alpha1.PromptCacheSpec{Enabled: ptr.To(true), HotBytes: ptr.To(resource.MustParse("16Mi"))}
	newReplica(t, ns, "hybrid-0", a.node, replicaOpts{deployment: "hybrid", servedName: "hybrid", source: "file://" + hybrid,
		reservation: "1Gi", promptCache: cache})
	newReplica(t, ns, "llama-0", a.node, replicaOpts{deployment: "llama", servedName: "llama", promptCache: cache})

	const reason = "cannot be cut back to a prefix (qwen3next)"
	mr := waitReplica(t, 2*time.Minute, ns, "hybrid-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return allOf(
			func() (bool, string) {
				return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady)
			},
			func() (bool, string) {
				p := mr.Status.PathsOff
				return len(p) == 1 && p[0].Path == v1alpha1.ServingPathPromptCache && strings.Contains(p[0].Reason, reason),
					fmt.Sprintf("pathsOff %+v", p)
			})
	})
	t.Logf("hybrid-0 status.pathsOff: %+v", mr.Status.PathsOff)
	m, _ := a.model(ns + "/hybrid-0")
	// The agent relays the runner's list: the prompt cache, and speculative decoding
	// (a recurrent state cannot be cut back by a rejected draft), which the replica's
	// status does not name (it changes the speed only).
	if len(m.Off) != 2 || m.Off[0].Path != runnerapi.PathPromptCache || !strings.Contains(m.Off[0].Reason, reason) ||
		m.Off[1].Path != runnerapi.PathSpeculation {
		t.Errorf("/api/status off of hybrid-0: %+v, want the prompt cache with its reason, then speculation", m.Off)
	}
	if m.PromptCache != nil && m.PromptCache.HotShareBytes != 0 {
		t.Errorf("hybrid-0's prompt cache %+v: want no hot share", m.PromptCache)
	}

	mr = waitReplica(t, time.Minute, ns, "llama-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady)
	})
	key := ns + "/llama-0"
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		m, _ := a.model(key)
		return m.PromptCache != nil && m.PromptCache.HotShareBytes == 16<<20, fmt.Sprintf("prompt cache of %s: %+v", key, m.PromptCache)
	})
	mr = getReplica(t, ns, "llama-0")
	if m, _ := a.model(key); len(mr.Status.PathsOff) != 0 || len(m.Off) != 0 {
		t.Errorf("llama-0: pathsOff %+v, /api/status off %+v; want none", mr.Status.PathsOff, m.Off)
	}
}
