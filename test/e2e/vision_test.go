package e2e

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/testenv"
	"github.com/macfleet/macfleet/test/support/visiontest"
)

// TestVisionThroughTheFleet: a deployment that names a synthesized projector answers
// an image question through the gateway on each API — Chat Completions and Responses
// with the official OpenAI Go client, Messages with the official Anthropic npm client
// — with the image's tokens counted in usage, the same image a prompt-cache hit (by
// its bytes: the same picture by URL, fetched and inlined by the agent under the
// source policy, hits the data URI's), another image a miss; an image URL on a host
// the policy does not list is a 400 naming the rule, and a deployment without a
// projector is a 400 naming spec.model.projector.
func TestVisionThroughTheFleet(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	proj := writeVisionModel(t)
	gemma := func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model.Source = fleet.ModelsURL + "/vision-gemma3.gguf"
		md.Spec.Engine = v1alpha1.EngineSpec{Settings: engine.Settings{ContextLength: 512, Parallel: 1}}
	}
	create(t, deployment(ns, "vision", 1, gemma, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model.Projector = fleet.ModelsURL + "/vision-gemma3-mmproj.gguf"
	}))
	create(t, deployment(ns, "text-only", 1, gemma))
	waitReady(t, ns, "vision", 1, 3*time.Minute)
	waitReady(t, ns, "text-only", 1, 3*time.Minute)
	model := ns + "/vision"
	imgs := map[string][]byte{"A": visiontest.PNG(t, visiontest.Gradient), "B": visiontest.PNG(t, visiontest.Checkers),
		"C": visiontest.PNG(t, visiontest.Stripes(1)), "D": visiontest.PNG(t, visiontest.Stripes(2))}
	c := gatewayClient()

	// Chat Completions: the image's tokens, a hit by data URI and by URL, a miss.
	ask := func(img string) visiontest.Answer {
		return visiontest.Ask(t, c, visiontest.ChatParams(model, visiontest.Question, img, 6))
	}
	text := ask("")
	first := ask(visiontest.DataURI(imgs["A"]))
	if got := first.Prompt - text.Prompt; got < int64(proj.ImageTokens()) {
		t.Errorf("chat: %d prompt tokens with the image, %d without: want at least the image's %d more", first.Prompt, text.Prompt, proj.ImageTokens())
	}
	again := ask(visiontest.DataURI(imgs["A"]))
	byURL := ask(fleet.ModelsURL + "/vision-a.png")
	for _, hit := range []struct {
		how string
		a   visiontest.Answer
	}{{"the same image again", again}, {"the same image by URL", byURL}} {
		if hit.a.Cached != hit.a.Prompt-1 || hit.a.Text != first.Text || hit.a.Prompt != first.Prompt {
			t.Errorf("chat, %s: %d of %d prompt tokens cached, answer %q; first %q with %d: want all but the last reused and the same answer",
				hit.how, hit.a.Cached, hit.a.Prompt, hit.a.Text, first.Text, first.Prompt)
		}
	}
	other := ask(visiontest.DataURI(imgs["B"]))
	if limit := other.Prompt - int64(proj.ImageTokens()) - 1; other.Cached > limit {
		t.Errorf("chat, another image: %d of %d prompt tokens cached, want at most %d", other.Cached, other.Prompt, limit)
	}

	// Responses: a new image is a miss, then a hit.
	r1, r2 := askResponses(t, c, model, imgs["C"]), askResponses(t, c, model, imgs["C"])
	if r1.Prompt != first.Prompt || r1.Cached > r1.Prompt-int64(proj.ImageTokens())-1 || r2.Cached != r2.Prompt-1 || r2.Text != r1.Text {
		t.Errorf("responses: a new image %+v, again %+v; want %d input tokens, a miss from the image on, then all but the last cached and the same answer",
			r1, r2, first.Prompt)
	}

	// Messages, through the official Anthropic npm client.
	m := askMessages(t, model, imgs["D"])
	if m[0].Prompt != first.Prompt || m[0].Cached > m[0].Prompt-int64(proj.ImageTokens())-1 || m[1].Cached != m[1].Prompt-1 || m[1].Text != m[0].Text {
		t.Errorf("messages: a new image %+v, again %+v; want %d input tokens, a miss from the image on, then all but the last cached and the same answer",
			m[0], m[1], first.Prompt)
	}
	t.Logf("prompt tokens: text %d, with an image %d; answers: A %q, B %q, C %q, D %q", text.Prompt, first.Prompt, first.Text, other.Text,
		r1.Text, m[0].Text)

	// Refusals: a host the source policy does not list, a model without a projector.
	visionRefused(t, c, model, "http://203.0.113.9/a.png", http.StatusBadRequest, `source host "203.0.113.9" is not allowed`)
	visionRefused(t, c, ns+"/text-only", visiontest.DataURI(imgs["A"]), http.StatusBadRequest, "spec.model.projector")
}

// writeVisionModel writes a tiny Gemma 3 model, its projector and the first image
// into the fleet's model server, and returns the projector.
func writeVisionModel(t *testing.T) ggufsynth.Projector {
	t.Helper()
	proj := visiontest.WriteModel(t, filepath.Join(fleet.ModelsDir, "vision-gemma3.gguf"), filepath.Join(fleet.ModelsDir, "vision-gemma3-mmproj.gguf"))
	if err := os.WriteFile(filepath.Join(fleet.ModelsDir, "vision-a.png"), visiontest.PNG(t, visiontest.Gradient), 0o644); err != nil {
		t.Fatal(err)
	}
	return proj
}

// askResponses asks the question about img through the Responses API.
func askResponses(t *testing.T, c openai.Client, model string, img []byte) visiontest.Answer {
	t.Helper()
	r, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: model, Temperature: openai.Float(0),
		MaxOutputTokens: openai.Int(6), Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			responses.ResponseInputItemParamOfMessage(responses.ResponseInputMessageContentListParam{
				{OfInputImage: &responses.ResponseInputImageParam{ImageURL: openai.String(visiontest.DataURI(img)), Detail: responses.ResponseInputImageDetailAuto}},
				responses.ResponseInputContentParamOfInputText(visiontest.Question),
			}, responses.EasyInputMessageRoleUser)}}})
	if err != nil {
		t.Fatalf("responses: %v", apiErrorBody(err))
	}
	return visiontest.Answer{Text: r.OutputText(), Prompt: r.Usage.InputTokens, Cached: r.Usage.InputTokensDetails.CachedTokens}
}

// askMessages asks the question about img twice through the Messages API with the
// official Anthropic npm client (testdata/vision-messages.cjs).
func askMessages(t *testing.T, model string, img []byte) [2]visiontest.Answer {
	t.Helper()
	if _, err := os.Stat(nodeModules() + "/@anthropic-ai/sdk"); err != nil && os.Getenv("CI") == "" {
		t.Skipf("the @anthropic-ai/sdk npm package is missing in %s; hack/deps.sh test installs it", nodeModules())
	}
	cmd := nodeScript(t, "vision-messages.cjs", fleet.GatewayURL+"/v1", "unused", model, "ANTHROPIC_BASE_URL="+fleet.GatewayURL,
		"IMAGE="+base64.StdEncoding.EncodeToString(img), "QUESTION="+visiontest.Question)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("the Anthropic client: %v\n%s%s", err, out, ee.Stderr)
		}
		t.Fatalf("the Anthropic client: %v", err)
	}
	var got [2]visiontest.Answer
	lines := 0
	for line := range strings.SplitSeq(string(out), "\n") {
		rest, ok := strings.CutPrefix(line, "message: ")
		if !ok {
			continue
		}
		var m struct {
			Text  string `json:"text"`
			Usage struct {
				In     int64 `json:"input_tokens"`
				Cached int64 `json:"cache_read_input_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(rest), &m); err != nil || lines == 2 {
			t.Fatalf("the Anthropic client's line %q: %v", line, err)
		}
		// Anthropic's input_tokens are those not read from the cache.
		got[lines] = visiontest.Answer{Text: m.Text, Prompt: m.Usage.In + m.Usage.Cached, Cached: m.Usage.Cached}
		lines++
	}
	if lines != 2 {
		t.Fatalf("the Anthropic client printed %d messages:\n%s", lines, out)
	}
	return got
}

// visionRefused checks that the image question about img is refused with status and
// a message holding says.
func visionRefused(t *testing.T, c openai.Client, model, img string, status int, says string) {
	t.Helper()
	_, err := c.Chat.Completions.New(t.Context(), visiontest.ChatParams(model, visiontest.Question, img, 6))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != status || !strings.Contains(apiErr.Message, says) {
		t.Errorf("an image question to %s about %.40s: %v, want %d saying %q", model, img, apiErrorBody(err), status, says)
	}
}

// apiErrorBody is err with the body an API error came with.
func apiErrorBody(err error) error {
	if apiErr := (*openai.Error)(nil); errors.As(err, &apiErr) {
		return fmt.Errorf("%w: %s", err, apiErr.RawJSON())
	}
	return err
}
