package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testassets"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// trainedDeployment deploys the trained test model (docs/testing.md) as name with a
// context of ctx tokens, one replica, and returns its namespace/name. Without the
// model file the test is skipped, except in CI.
func trainedDeployment(t *testing.T, name string, ctx int32) string {
	t.Helper()
	trained, err := testassets.WriteChatModel(filepath.Join(fleet.ModelsDir, "tiny-chat-trained.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if !trained {
		if os.Getenv("CI") != "" {
			t.Fatalf("the trained test model %s is missing", testassets.TrainedChatModel)
		}
		t.Skipf("the trained test model %s is missing", testassets.TrainedChatModel)
	}
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, name, 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model.Source = fleet.ModelsURL + "/tiny-chat-trained.gguf"
		md.Spec.Engine.ContextLength = ctx
	}))
	waitReady(t, ns, name, 1, 3*time.Minute)
	return ns + "/" + name
}

// sdkLoopPackages are the npm packages testdata/sdk-loops.cjs needs, by SDK.
var sdkLoopPackages = map[string][]string{
	"agents": {"@openai/agents", "zod"},
	"ai":     {"ai", "@ai-sdk/openai", "zod"},
}

// TestSDKToolLoops runs two agent SDKs (the npm packages @openai/agents and ai)
// against the trained test model (testdata/sdk-loops.cjs): each completes a tool loop to a final
// output that carries the tool's result, and 10 of 10 structured answers at the
// SDK's default limits parse.
func TestSDKToolLoops(t *testing.T) {
	model := trainedDeployment(t, "assistant", 4096)
	for _, sdk := range []string{"agents", "ai"} {
		t.Run(sdk, func(t *testing.T) {
			for _, pkg := range sdkLoopPackages[sdk] {
				if _, err := os.Stat(filepath.Join(nodeModules(), filepath.FromSlash(pkg))); err != nil {
					if os.Getenv("CI") != "" {
						t.Fatalf("the %s npm package is missing (%v); hack/deps.sh installs hack/npm's lockfile", pkg, err)
					}
					t.Skipf("the %s npm package is missing in %s; hack/deps.sh installs hack/npm's lockfile", pkg, nodeModules())
				}
			}
			runNodeScript(t, "sdk-loops.cjs", fleet.GatewayURL+"/v1", "unused", model, "SDK="+sdk)
		})
	}
}
