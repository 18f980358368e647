package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// macStudio pins a deployment's replicas to the fleet's mac-studio-1.
var macStudio = map[string]string{v1alpha1.LabelMemoryGiB: "64"}

// writeModel synthesizes a tiny model with its own weights (seed) into dir and
// returns its file name and SHA-256.
func writeModel(t *testing.T, dir, name string, seed uint64) string {
	t.Helper()
	spec := ggufsynth.Tiny()
	spec.Name, spec.Seed = name, seed
	p := filepath.Join(dir, name+".gguf")
	if err := ggufsynth.Write(p, spec); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// privateSource serves dir over plain HTTP on 127.0.0.2 and adds a rule to the
// fleet's SourcePolicy that lets only ns use that host, until the test ends. It
// returns the server's base URL.
func privateSource(t *testing.T, ns, dir string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(dir)), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	rule := v1alpha1.SourcePolicyRule{Namespaces: []string{ns}, Hosts: []string{"127.0.0.2"}, AllowPlainHTTP: true}
	editPolicy := func(edit func(*v1alpha1.SourcePolicy)) {
		// Not t.Context(): the rule is also removed in a cleanup, after it is done.
		ctx := context.Background()
		testenv.Eventually(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
			var sp v1alpha1.SourcePolicy
			if err := fleet.Client.Get(ctx, client.ObjectKey{Name: v1alpha1.SourcePolicyName}, &sp); err != nil {
				return false, err.Error()
			}
			edit(&sp)
			if err := fleet.Client.Update(ctx, &sp); err != nil {
				return false, err.Error()
			}
			return true, ""
		})
	}
	editPolicy(func(sp *v1alpha1.SourcePolicy) { sp.Spec.Rules = append(sp.Spec.Rules, rule) })
	t.Cleanup(func() {
		editPolicy(func(sp *v1alpha1.SourcePolicy) {
			sp.Spec.Rules = slices.DeleteFunc(sp.Spec.Rules, func(r v1alpha1.SourcePolicyRule) bool {
				return slices.Equal(r.Namespaces, rule.Namespaces)
			})
		})
	})
	base := "http://" + ln.Addr().String()
	// The admission policy reads the SourcePolicy from its own informer: wait until it
	// admits the host for ns (a server-side dry run), so the test's first create is not
	// refused by the policy as it was before the edit.
	mem := resource.MustParse("1Mi")
	testenv.Eventually(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		probe := deployment(ns, "source-policy-probe", 0, func(md *v1alpha1.ModelDeployment) {
			md.Spec.Model = v1alpha1.ModelSource{Source: base + "/probe.gguf"}
			md.Spec.Resources = &v1alpha1.ModelResources{Memory: &mem}
		})
		if err := fleet.Client.Create(t.Context(), probe, client.DryRunAll); err != nil {
			return false, "the source policy to admit " + base + " for " + ns + ": " + err.Error()
		}
		return true, ""
	})
	return base
}

// TestAttackAnotherTenantsDigest: team B deploys a public source naming team A's
// private model's digest (with resources.memory, so that no header is read) onto the
// Mac that holds team A's model, to be served team A's model; B's replica must get
// what its own source serves — a checksum mismatch — and never load.
func TestAttackAnotherTenantsDigest(t *testing.T) {
	nsA, nsB := testenv.NewNamespace(t, fleet.Client), testenv.NewNamespace(t, fleet.Client)
	privateDir := t.TempDir()
	digestA := writeModel(t, privateDir, "team-a-private", 101)
	digestB := writeModel(t, fleet.ModelsDir, "attack-public-b", 102)
	base := privateSource(t, nsA, privateDir)

	mem := resource.MustParse("256Mi")
	create(t, deployment(nsA, "private", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model = v1alpha1.ModelSource{Source: base + "/team-a-private.gguf", SHA256: digestA}
		md.Spec.Resources = &v1alpha1.ModelResources{Memory: &mem}
		md.Spec.Placement.NodeSelector = macStudio
	}))
	waitReady(t, nsA, "private", 1, 3*time.Minute)

	create(t, deployment(nsB, "thief", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model = v1alpha1.ModelSource{Source: fleet.ModelsURL + "/attack-public-b.gguf", SHA256: digestA}
		md.Spec.Resources = &v1alpha1.ModelResources{Memory: &mem}
		md.Spec.Placement.NodeSelector = macStudio
		md.Spec.ProgressDeadlineSeconds = ptr.To[int32](30)
	}))
	testenv.Eventually(t, 2*time.Minute, 200*time.Millisecond, func() (bool, string) {
		var rs v1alpha1.ModelReplicaList
		if err := fleet.Client.List(t.Context(), &rs, client.InNamespace(nsB)); err != nil {
			return false, err.Error()
		}
		for _, r := range rs.Items {
			if conditionTrue(r.Status.Conditions, v1alpha1.ReplicaDownloaded) || conditionTrue(r.Status.Conditions, v1alpha1.ReplicaReady) {
				t.Fatalf("team B's replica %s is serving: it was handed team A's model by its digest\n%s", r.Name, describeReplicas(rs.Items))
			}
		}
		var md v1alpha1.ModelDeployment
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: nsB, Name: "thief"}, &md); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentReplicaFailure)
		// The mismatch names what B's own source serves.
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonChecksumMismatch &&
			strings.Contains(c.Message, digestB), "ReplicaFailure: " + conditionText(c)
	})
}

// promptCacheOf reads the prompt cache report of the model key ("<namespace>/<replica>")
// from the agent at addr; nil while the agent does not have it.
func promptCacheOf(t *testing.T, addr, key string) (*enginepool.PromptCacheStats, bool) {
	t.Helper()
	var st struct {
		Models []enginepool.ModelSnapshot `json:"models"`
	}
	if err := agentGet(t.Context(), addr, "/api/status", &st); err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Models {
		if m.Name == key {
			return m.PromptCache, true
		}
	}
	return nil, false
}

// TestAttackFleetPromptCacheOfAnotherTenant: in the running fleet, team B deploys the
// same model file as team A on the same Mac, after team A's runner saved a long prompt
// to the SSD tier and went away, and sends that prompt to restore team A's state (and
// learn from the timing what A asked); B's runner must find nothing of A's, while A's
// next runner restores it.
func TestAttackFleetPromptCacheOfAnotherTenant(t *testing.T) {
	addr := fleet.Agent("mac-studio-1").Addr
	secret := strings.Repeat("Team A's confidential merger memo, paragraph after paragraph. ", 6)
	// run deploys the tiny model in ns on mac-studio-1, sends the secret prompt, waits
	// for its state to be saved to the SSD (or restored from it), removes the
	// deployment and its runner, and returns the runner's prompt cache report.
	run := func(ns, name string) enginepool.PromptCacheStats {
		t.Helper()
		create(t, deployment(ns, name, 1, func(md *v1alpha1.ModelDeployment) {
			md.Spec.Engine.ContextLength = 1024
			md.Spec.Placement.NodeSelector = macStudio
		}))
		rs := waitReady(t, ns, name, 1, 3*time.Minute)
		key := ns + "/" + rs[0].Name
		c := openaiDirect(addr)
		_, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
			Model: name, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(secret)},
			MaxTokens: openai.Int(2), Temperature: openai.Float(0),
		}, option.WithHeader(v1alpha1.HeaderReplica, key))
		if err != nil {
			t.Fatalf("%s's chat: %v", ns, err)
		}
		var pc *enginepool.PromptCacheStats
		testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
			pc, _ = promptCacheOf(t, addr, key)
			// A state saved to the SSD, or one restored from it (then nothing new is saved).
			return pc != nil && (pc.SavesPersisted >= 1 || pc.Restores >= 1), fmt.Sprintf("the prompt cache of %s: %+v", key, pc)
		})
		removeDeployment(t, ns, name)
		testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
			_, ok := promptCacheOf(t, addr, key)
			return !ok, key + " still on the agent"
		})
		return *pc
	}

	nsA, nsB := testenv.NewNamespace(t, fleet.Client), testenv.NewNamespace(t, fleet.Client)
	if a := run(nsA, "memo"); a.Restores != 0 {
		t.Fatalf("team A's first runner restored %d states from an empty cache", a.Restores)
	}
	b := run(nsB, "memo")
	if b.Hits != 0 || b.Restores != 0 || b.RestoredTokens != 0 {
		t.Errorf("team B's runner restored team A's prompt: %d SSD hits, %d restores (%d tokens) from %s",
			b.Hits, b.Restores, b.RestoredTokens, b.SSDDir)
	}
	// The control: the SSD tier works, for its own tenant.
	if again := run(nsA, "memo-again"); again.Restores < 1 {
		t.Errorf("team A's next runner did not restore its own prompt: %+v", again)
	}
}
