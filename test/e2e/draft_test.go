package e2e

import (
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testassets"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestDraftModelDeployment: a ModelDeployment of the trained test model with its
// trained draft (spec.model.draft) on the local fleet: the Mac's agent fetches the
// draft beside the model and starts the runner with it (its loaded spec names the
// draft's file), the deployment's estimate counts it, and through the gateway with the
// official client a greedy answer with X-Macfleet-Speculation on is the one without,
// with drafted tokens kept (usage completion_tokens_details).
func TestDraftModelDeployment(t *testing.T) {
	target, ok := testassets.TrainedModelPath()
	if !ok {
		t.Skip("the trained test model is not present")
	}
	draft, ok, err := testassets.DraftModelPath()
	if err != nil || !ok {
		t.Skipf("the trained draft model is not present (%v)", err)
	}
	for name, src := range map[string]string{"trained.gguf": target, "trained-draft.gguf": draft} {
		copyFile(t, src, filepath.Join(fleet.ModelsDir, name))
	}
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "drafted", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model.Source = fleet.ModelsURL + "/trained.gguf"
		md.Spec.Model.Draft = fleet.ModelsURL + "/trained-draft.gguf"
	}))
	create(t, deployment(ns, "plain", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model.Source = fleet.ModelsURL + "/trained.gguf"
	}))
	r := waitReady(t, ns, "drafted", 1, 3*time.Minute)[0]
	waitReady(t, ns, "plain", 1, 3*time.Minute)

	var st struct {
		Models []struct {
			Name       string `json:"name"`
			LoadedSpec *struct {
				Path      string `json:"path"`
				DraftPath string `json:"draftPath"`
			} `json:"loadedSpec"`
		} `json:"models"`
	}
	if err := agentGet(t.Context(), fleet.Agent(r.Spec.NodeName).Addr, "/api/status", &st); err != nil {
		t.Fatal(err)
	}
	loaded := ""
	for _, m := range st.Models {
		if m.Name == r.Namespace+"/"+r.Name && m.LoadedSpec != nil {
			loaded = m.LoadedSpec.DraftPath
		}
	}
	if loaded == "" {
		t.Errorf("the agent of %s runs replica %s without its draft model: %+v", r.Spec.NodeName, r.Name, st.Models)
	}
	est := func(name string) int64 {
		var md v1alpha1.ModelDeployment
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &md); err != nil || md.Status.EstimatedMemory == nil {
			t.Fatalf("deployment %s: estimatedMemory %v (%v)", name, md.Status.EstimatedMemory, err)
		}
		return md.Status.EstimatedMemory.Value()
	}
	if with, without := est("drafted"), est("plain"); with <= without {
		t.Errorf("estimatedMemory with the draft %d, without %d: the draft is not counted", with, without)
	}

	c := gatewayClient()
	ask := func(mode string) *openai.ChatCompletion {
		t.Helper()
		resp, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
			Model:       openai.ChatModel(ns + "/drafted"),
			Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me about the weather in the mountains.")},
			MaxTokens:   openai.Int(64),
			Temperature: openai.Float(0),
		}, option.WithHeader(runnerapi.HeaderSpeculation, mode))
		if err != nil {
			t.Fatalf("speculation %s: %v", mode, err)
		}
		return resp
	}
	off, on := ask(runnerapi.SpeculationOff), ask(runnerapi.SpeculationOn)
	kept := on.Usage.CompletionTokensDetails.AcceptedPredictionTokens
	t.Logf("%d completion tokens; with speculation on %d drafted tokens kept, %d rejected", on.Usage.CompletionTokens,
		kept, on.Usage.CompletionTokensDetails.RejectedPredictionTokens)
	if got, want := on.Choices[0].Message.Content, off.Choices[0].Message.Content; got != want || want == "" {
		t.Errorf("speculation on answered %q, off %q: want the same greedy answer", got, want)
	}
	if off.Usage.CompletionTokensDetails.AcceptedPredictionTokens != 0 || kept == 0 {
		t.Errorf("drafted tokens kept: %d off, %d on; want none off, some on", off.Usage.CompletionTokensDetails.AcceptedPredictionTokens, kept)
	}
}

// copyFile copies src to dst (created or replaced).
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
