package e2e

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// A draft model (--draft, docs/speculative-decoding.md): a smaller model of the same
// vocabulary whose greedy tokens the slots draft where prompt lookup finds nothing.
// Like every draft it changes the speed, never the answer.

// draftModels are the trained test model and its trained draft, or the test skips.
func draftModels(t *testing.T) (target, draft string) {
	t.Helper()
	target, ok := trainedModel()
	if !ok {
		t.Skip("the trained test model is not present")
	}
	draft, ok, err := testassets.DraftModelPath()
	if err != nil || !ok {
		t.Skipf("the trained draft model is not present (%v)", err)
	}
	return target, draft
}

// weather is a turn with nothing to copy from its conversation: prompt lookup finds
// little, the draft model drafts.
const weather = `"messages":[{"role":"user","content":"Tell me about the weather in the mountains."}]`

// TestDraftModelIsLossless: with a draft model the answers are the same token for
// token as without drafting, on every path a slot takes, and the draft model's
// drafts are verified (its /status counts grow) and some kept.
func TestDraftModelIsLossless(t *testing.T) {
	target, draft := draftModels(t)
	r := startReady(t, target, "--parallel", "2", "--draft", draft)
	quote := `"messages":[` + readBack(notes) + `],"tools":[` + readTool + `]`
	for _, tc := range []struct {
		name, body string
		hdr        []string
	}{
		{"plain", `{"model":"m","max_tokens":96,"temperature":0,` + weather + `}`, nil},
		{"logprobs", `{"model":"m","max_tokens":96,"temperature":0,"logprobs":true,"top_logprobs":3,` + weather + `}`, nil},
		{"stop", `{"model":"m","max_tokens":96,"temperature":0,"stop":["light"],` + weather + `}`, nil},
		{"json schema", `{"model":"m","max_tokens":96,"temperature":0,"response_format":{"type":"json_schema","json_schema":{"name":"n",
			"schema":{"type":"object","properties":{"place":{"type":"string"},"weather":{"type":"string"}},"required":["place","weather"]}}},` + weather + `}`, nil},
		{"seeded temperature 1, n=2", `{"model":"m","max_tokens":96,"temperature":1,"seed":11,"n":2,` + weather + `}`, nil},
		{"copy-heavy", `{"model":"m","max_tokens":160,"temperature":0,` + quote + `}`, nil},
		{"continued answer", `{"model":"m","max_tokens":96,"temperature":0,"messages":[{"role":"user","content":"Tell me about the weather in the mountains."},
			{"role":"assistant","content":"The weather"}]}`, []string{runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := r.status().Draft
			off := specChat(t, r, tc.body, runnerapi.SpeculationOff, tc.hdr...)
			if after := r.status().Draft; after.Drafted != before.Drafted {
				t.Fatalf("speculation off, the draft model drafted: %+v then %+v", before, after)
			}
			on := specChat(t, r, tc.body, runnerapi.SpeculationOn, tc.hdr...)
			sameAnswers(t, off, on)
			t.Logf("%q: %d tokens, drafts %+v", on.Choices[0].Message.Text(), on.Usage.CompletionTokens, on.Usage.CompletionTokensDetails)
		})
	}
	st := r.status().Draft
	if st == nil || st.Path != draft || st.SizeBytes <= 0 || st.Drafted == 0 || st.Kept == 0 {
		t.Fatalf("/status draft = %+v: want the draft model, with drafted tokens of which some were kept", st)
	}
	// A draft on the CPU (the model's device here; on a GPU, where a step timed at load
	// was shorter) takes its q8_0 tokens from its greedy head, which the runner checked
	// against the draft's logits at load; on a GPU it reads its logits.
	checkDraftPlacement(t, st, "")
	if onCPU := st.Device == "CPU"; onCPU != (st.HeadBytes > 0) {
		t.Errorf("/status draft on %s has head_bytes = %d: want a greedy head exactly on the CPU", st.Device, st.HeadBytes)
	}
	t.Logf("draft model: %d of %d drafted tokens kept, greedy head %d bytes, on %s (%s)", st.Kept, st.Drafted, st.HeadBytes,
		st.Device, st.Placement)
}

// checkDraftPlacement checks /status's draft placement for --draft-device asked ("" for
// auto): asked, where it was; left to the runner, the CPU beside a model on the CPU,
// and beside a model on a GPU the device whose step, both timed, was shorter.
func checkDraftPlacement(t *testing.T, st *runnerapi.DraftStatus, asked string) {
	t.Helper()
	switch {
	case asked == "cpu" && st.Device != "CPU", asked == "gpu" && st.Device == "CPU":
		t.Errorf("/status draft device %q, placement %q: --draft-device %s was asked", st.Device, st.Placement, asked)
	case asked != "" && !strings.Contains(st.Placement, "--draft-device "+asked):
		t.Errorf("/status draft placement %q does not name --draft-device %s", st.Placement, asked)
	case asked == "" && !gpuSuite() && (st.Device != "CPU" || st.Placement != "the model is on the CPU"):
		t.Errorf("/status draft device %q, placement %q: want the CPU, as the model", st.Device, st.Placement)
	case asked == "" && gpuSuite():
		cpu, accel := st.CPUStepSeconds, st.AcceleratorStepSeconds
		if cpu <= 0 || accel <= 0 || (cpu < accel) != (st.Device == "CPU") || !strings.HasPrefix(st.Placement, "measured") {
			t.Errorf("/status draft %+v: beside a model on a GPU, want both steps timed and the shorter one's device", st)
		}
	}
}

// TestDraftModelDevice: --draft-device puts the draft where it is asked, and a GPU
// asked for beside a model that has none is refused at load, naming the fix. The
// answers stay the same wherever the draft computes.
func TestDraftModelDevice(t *testing.T) {
	target, draft := draftModels(t)
	body := `{"model":"m","max_tokens":64,"temperature":0,` + weather + `}`
	var first string
	for _, dev := range []string{"cpu", "gpu"} {
		if dev == "gpu" && !gpuSuite() {
			h := startRunner(t, target, "--draft", draft, "--draft-device", "gpu").loadFailed(60 * time.Second)
			for _, want := range []string{"--draft-device gpu", "not on an accelerator", "use auto or cpu"} {
				if !strings.Contains(h.Error, want) {
					t.Fatalf("load error %q does not say %q", h.Error, want)
				}
			}
			continue
		}
		r := startReady(t, target, "--draft", draft, "--draft-device", dev)
		c := specChat(t, r, body, runnerapi.SpeculationOn)
		st := r.status().Draft
		if st == nil || st.Drafted == 0 {
			t.Fatalf("--draft-device %s: /status draft = %+v, want drafted tokens", dev, st)
		}
		checkDraftPlacement(t, st, dev)
		if first == "" {
			first = c.Choices[0].Message.Text()
		} else if got := c.Choices[0].Message.Text(); got != first && !gpuSuite() {
			t.Errorf("the draft on the GPU answered %q, on the CPU %q", got, first)
		}
		t.Logf("--draft-device %s: on %s (%s), %d of %d kept", dev, st.Device, st.Placement, st.Kept, st.Drafted)
	}
}

// TestDraftModelPromptCacheTurn: a conversation's next turn, which reuses the
// previous turn's cells (and the draft's sequence its common prefix), answers the
// same with and without the draft model.
func TestDraftModelPromptCacheTurn(t *testing.T) {
	target, draft := draftModels(t)
	r := startReady(t, target, "--draft", draft)
	first := `{"model":"m","max_tokens":64,"temperature":0,` + weather + `}`
	answers := map[string]string{}
	for _, spec := range []string{runnerapi.SpeculationOff, runnerapi.SpeculationOn} {
		c := specChat(t, r, first, spec)
		next := `{"model":"m","max_tokens":64,"temperature":0,"messages":[{"role":"user","content":"Tell me about the weather in the mountains."},
			{"role":"assistant","content":` + quoteJSON(c.Choices[0].Message.Text()) + `},{"role":"user","content":"And in the city?"}]}`
		second := specChat(t, r, next, spec)
		if second.Usage.PromptTokensDetails == nil || second.Usage.PromptTokensDetails.CachedTokens == 0 {
			t.Fatalf("speculation %s: the second turn reused no cached token: %+v", spec, second.Usage)
		}
		answers[spec] = c.Choices[0].Message.Text() + "\x00" + second.Choices[0].Message.Text()
	}
	if answers[runnerapi.SpeculationOff] != answers[runnerapi.SpeculationOn] {
		t.Fatalf("turns differ:\n off: %q\n on:  %q", answers[runnerapi.SpeculationOff], answers[runnerapi.SpeculationOn])
	}
	if st := r.status().Draft; st == nil || st.Drafted == 0 {
		t.Fatalf("/status draft = %+v: the draft model drafted nothing", st)
	}
}

// TestDraftModelItself: with the model itself as its draft, greedy drafts are the
// model's own greedy tokens, so almost all of them are kept: a check that drafting
// with a model works at all (a draft out of step with the slot's tokens keeps few),
// and, on the CPU, that the greedy head (embeddings of five blocks here) chooses what
// the model's logits choose.
func TestDraftModelItself(t *testing.T) {
	target, _ := draftModels(t)
	r := startReady(t, target, "--draft", target)
	for _, q := range []string{"Tell me about the weather in the mountains.", "How do I write a list into a directory?"} {
		specChat(t, r, `{"model":"m","max_tokens":64,"temperature":0,"messages":[{"role":"user","content":`+quoteJSON(q)+`}]}`, runnerapi.SpeculationOn)
	}
	st := r.status().Draft
	if st == nil || st.Drafted < 20 || float64(st.Kept) < 0.9*float64(st.Drafted) {
		t.Fatalf("/status draft = %+v: the model as its own draft should keep at least 90%% of at least 20 drafted tokens", st)
	}
	t.Logf("the model as its draft: %d of %d drafted tokens kept", st.Kept, st.Drafted)
}

// TestDraftModelOfAnotherVocabulary: a draft whose vocabulary is not the model's is
// refused at load, naming the difference and the fix.
func TestDraftModelOfAnotherVocabulary(t *testing.T) {
	target, _ := draftModels(t)
	h := startRunner(t, target, "--draft", model(t, "tiny")).loadFailed(60 * time.Second)
	for _, want := range []string{"--draft", "the draft model has 512 tokens", "must share the model's vocabulary"} {
		if !strings.Contains(h.Error, want) {
			t.Fatalf("load error %q does not say %q", h.Error, want)
		}
	}
}

// quoteJSON is s as a JSON string.
func quoteJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestDraftModelNotLoadedWhereSpeculationIsOff: a model with a recurrent state never
// drafts, so its runner does not load the draft model it is given: /status has no
// draft, and lists speculation as off with its reason.
func TestDraftModelNotLoadedWhereSpeculationIsOff(t *testing.T) {
	m := familyModel(t, ggufsynth.Qwen3Next)
	r := startReady(t, m, "--draft", m)
	st := r.status()
	if st.Draft != nil {
		t.Fatalf("/status draft = %+v: a model that never drafts loaded its draft model", st.Draft)
	}
	if !slices.ContainsFunc(st.Off, func(p runnerapi.PathOff) bool { return p.Path == runnerapi.PathSpeculation }) {
		t.Fatalf("/status off = %+v: want speculation off", st.Off)
	}
}
