package clustermode_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// A replica's spec.engine.promptCache reaches its runner (its hot share capped by
// hotBytes), and a restarted agent — its runners unloaded, not adopted — finds the SSD
// tier the first one wrote: the first repeated prompt is an SSD hit.
func TestPromptCacheAcrossAgentRestart(t *testing.T) {
	cacheDir := t.TempDir()
	a1 := startAgent(t, agentOptions{promptCacheDir: cacheDir})
	ns := testenv.NewNamespace(t, env.Client)
	newReplica(t, ns, "pc-0", a1.node, replicaOpts{deployment: "pc", servedName: "pc", ctxLen: 2048,
		promptCache: &v1alpha1.PromptCacheSpec{Enabled: ptr.To(true), HotBytes: ptr.To(resource.MustParse("16Mi"))}})
	waitReplica(t, time.Minute, ns, "pc-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady)
	})
	prompt := strings.Repeat("A conversation that goes on and on about runners and caches. ", 10)
	chat := func(a *testAgent) string {
		t.Helper()
		body := map[string]any{"model": "pc", "max_tokens": 6, "temperature": 0,
			"messages": []map[string]string{{"role": "user", "content": prompt}}}
		resp, b := a.do(http.MethodPost, "/v1/chat/completions", body, auth...)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("chat: %d %s", resp.StatusCode, b)
		}
		return string(b)
	}
	chat(a1)
	key := ns + "/pc-0"
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		m, _ := a1.model(key)
		pc := m.PromptCache
		return pc != nil && pc.SavesPersisted >= 1 && pc.HotShareBytes == 16<<20,
			fmt.Sprintf("prompt cache of %s: %+v", key, pc)
	})
	a1.stop()

	a2 := startAgent(t, agentOptions{node: a1.node, promptCacheDir: cacheDir})
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		m, ok := a2.model(key)
		return ok && m.State == "Ready", fmt.Sprintf("%s in the new agent: %v %s", key, ok, m.State)
	})
	chat(a2)
	m, _ := a2.model(key)
	if pc := m.PromptCache; pc == nil || pc.Hits < 1 || pc.HotHits != 0 || pc.Restores < 1 {
		t.Fatalf("after the restart: %+v; want the repeated prompt restored from an SSD hit", pc)
	}
}
