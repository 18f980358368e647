package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// Speculative decoding (docs/speculative-decoding.md) changes how fast an answer
// comes, never the answer: each test here asks the same runner the same thing with
// X-Macfleet-Speculation off and on and compares the answers token for token.

// readTool and readBack are a turn that quotes a file back, what prompt lookup
// drafts well: the trained model answers "<path> contains: <the file>".
const readTool = `{"type":"function","function":{"name":"read_file","description":"Read a file and return its contents.",
	"parameters":{"type":"object","properties":{"path":{"type":"string","description":"Path of the file"}},"required":["path"]}}}`

func readBack(file string) string {
	content, _ := json.Marshal(file)
	return `{"role":"user","content":"What does notes.txt say?"},
	{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"read_file","arguments":"{\"path\": \"notes.txt\"}"}}]},
	{"role":"tool","tool_call_id":"call_1","content":` + string(content) + `}`
}

const notes = "Review the editor settings before you write the list into the directory, because the message will always keep the small answer clear."

// speculationModel is the trained test model where it is present (it quotes what it
// reads), else the random-weight tiny model (whose greedy answers loop, which
// drafting catches too).
func speculationModel(t *testing.T) string {
	t.Helper()
	if path, ok := trainedModel(); ok {
		return path
	}
	return model(t, "tiny")
}

// trainedModel is the trained test model's path, where it is present.
func trainedModel() (string, bool) { return testassets.TrainedModelPath() }

// specChat posts a chat request with speculation set to spec (and the header pairs
// hdr) and returns the answer.
func specChat(t *testing.T, r *runner, body, spec string, hdr ...string) runnerapi.ChatCompletion {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("test body %s: %v", body, err)
	}
	resp := postChat(t, r, m, append([]string{runnerapi.HeaderSpeculation, spec}, hdr...)...)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var c runnerapi.ChatCompletion
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &c) != nil || len(c.Choices) == 0 || c.Usage == nil {
		t.Fatalf("speculation %s: %d %s", spec, resp.StatusCode, b)
	}
	return c
}

// sameAnswers fails unless off and on hold the same choices: text, tool calls,
// finish reasons, and the logprobs' tokens (their values within float noise: the
// rows are computed in batches of other shapes).
func sameAnswers(t *testing.T, off, on runnerapi.ChatCompletion) {
	t.Helper()
	if len(off.Choices) != len(on.Choices) {
		t.Fatalf("%d choices without speculation, %d with", len(off.Choices), len(on.Choices))
	}
	for i := range off.Choices {
		a, b := off.Choices[i], on.Choices[i]
		ta, tb := callsOf(a.Message.ToolCalls), callsOf(b.Message.ToolCalls)
		if a.Message.Text() != b.Message.Text() || a.FinishReason != b.FinishReason || !bytes.Equal(ta, tb) ||
			a.StopSequence != b.StopSequence {
			t.Fatalf("choice %d differs:\n off: %q %s %s (%s)\n on:  %q %s %s (%s)", i,
				a.Message.Text(), ta, a.FinishReason, a.StopSequence, b.Message.Text(), tb, b.FinishReason, b.StopSequence)
		}
		sameLogprobs(t, a.Logprobs, b.Logprobs)
	}
	if off.Usage.CompletionTokens != on.Usage.CompletionTokens {
		t.Fatalf("completion tokens %d without speculation, %d with", off.Usage.CompletionTokens, on.Usage.CompletionTokens)
	}
	if d := off.Usage.CompletionTokensDetails; d != nil {
		t.Fatalf("speculation off drafted: %+v", *d)
	}
}

func sameLogprobs(t *testing.T, a, b *runnerapi.ChatLogprobs) {
	t.Helper()
	if (a == nil) != (b == nil) || a == nil {
		return
	}
	if len(a.Content) != len(b.Content) {
		t.Fatalf("%d logprobs without speculation, %d with", len(a.Content), len(b.Content))
	}
	for k := range a.Content {
		x, y := a.Content[k], b.Content[k]
		if x.Token != y.Token || math.Abs(x.Logprob-y.Logprob) > 1e-3 || len(x.TopLogprobs) != len(y.TopLogprobs) {
			t.Fatalf("logprob %d: %q %.5f (%d top) without speculation, %q %.5f (%d top) with",
				k, x.Token, x.Logprob, len(x.TopLogprobs), y.Token, y.Logprob, len(y.TopLogprobs))
		}
	}
}

// callsOf is the tool calls' functions (their ids are random).
func callsOf(calls []runnerapi.ToolCall) []byte {
	fns := make([]runnerapi.FunctionCall, len(calls))
	for i, c := range calls {
		fns[i] = c.Function
	}
	b, _ := json.Marshal(fns)
	return b
}

// accepted is how many drafted tokens the answer kept.
func accepted(c runnerapi.ChatCompletion) int {
	if d := c.Usage.CompletionTokensDetails; d != nil {
		return d.AcceptedPredictionTokens
	}
	return 0
}

// TestSpeculationIsLossless: greedy and seeded answers are the same token for token
// with and without speculation on every path a slot takes (a continued answer
// included), and the copy-heavy turns keep drafted tokens (else the comparison shows
// nothing).
func TestSpeculationIsLossless(t *testing.T) {
	r := startReady(t, speculationModel(t), "--parallel", "2")
	quote := `"messages":[` + readBack(notes) + `],"tools":[` + readTool + `]`
	for _, tc := range []struct {
		name, body string
		drafts     bool // the answer must keep drafted tokens
	}{
		{"plain", `{"model":"m","max_tokens":160,"temperature":0,` + quote + `}`, true},
		{"logprobs", `{"model":"m","max_tokens":160,"temperature":0,"logprobs":true,"top_logprobs":3,` + quote + `}`, true},
		{"stop", `{"model":"m","max_tokens":160,"temperature":0,"stop":["small"],` + quote + `}`, false},
		{"max tokens", `{"model":"m","max_tokens":9,"temperature":0,` + quote + `}`, false},
		{"json schema", `{"model":"m","max_tokens":120,"temperature":0,"response_format":{"type":"json_schema","json_schema":{"name":"n",
			"schema":{"type":"object","properties":{"file":{"type":"string"},"text":{"type":"string"}},"required":["file","text"]}}},
			"messages":[{"role":"user","content":"Return a JSON object with the file and the text of notes.txt: ` + notes + `"}]}`, false},
		{"tool call", `{"model":"m","max_tokens":120,"temperature":0,"tools":[` + readTool + `],
			"messages":[{"role":"user","content":"Read notes.txt and then read notes.txt again."}]}`, false},
		{"seeded temperature 1, n=2", `{"model":"m","max_tokens":120,"temperature":1,"seed":7,"n":2,` + quote + `}`, false},
		{"penalties", `{"model":"m","max_tokens":120,"temperature":0,"frequency_penalty":0.5,` + quote + `}`, false},
		{"continued answer", `{"model":"m","max_tokens":160,"temperature":0,"tools":[` + readTool + `],"messages":[` + readBack(notes) +
			`,{"role":"assistant","content":"notes.txt contains: Review the"}]}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if strings.HasPrefix(tc.name, "continued") {
				hdr = []string{runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage}
			}
			off := specChat(t, r, tc.body, runnerapi.SpeculationOff, hdr...)
			on := specChat(t, r, tc.body, runnerapi.SpeculationOn, hdr...)
			sameAnswers(t, off, on)
			if tc.drafts && accepted(on) == 0 {
				t.Fatalf("the copy-heavy turn kept no drafted token (%q, drafts %+v): the comparison shows nothing", on.Choices[0].Message.Text(), on.Usage.CompletionTokensDetails)
			}
			t.Logf("%q %s: %d tokens, drafts %+v", on.Choices[0].Message.Text(), callsOf(on.Choices[0].Message.ToolCalls), on.Usage.CompletionTokens, on.Usage.CompletionTokensDetails)
		})
	}
}

// TestSpeculationPromptCacheTurns: a conversation's next turn, which reuses the
// previous turn's cells (the drafted cells past the answer removed), answers the
// same with and without speculation, and so does a turn after a cancelled one.
func TestSpeculationPromptCacheTurns(t *testing.T) {
	r := startReady(t, speculationModel(t))
	first := `{"model":"m","max_tokens":160,"temperature":0,"tools":[` + readTool + `],"messages":[` + readBack(notes) + `]}`
	answers := map[string]string{}
	for _, spec := range []string{runnerapi.SpeculationOff, runnerapi.SpeculationOn} {
		c := specChat(t, r, first, spec)
		content, _ := json.Marshal(c.Choices[0].Message.Text())
		next := `{"model":"m","max_tokens":160,"temperature":0,"tools":[` + readTool + `],"messages":[` + readBack(notes) +
			`,{"role":"assistant","content":` + string(content) + `},{"role":"user","content":"Read notes.txt again."}]}`
		second := specChat(t, r, next, spec)
		if second.Usage.PromptTokensDetails == nil || second.Usage.PromptTokensDetails.CachedTokens == 0 {
			t.Fatalf("speculation %s: the second turn reused no cached token: %+v", spec, second.Usage)
		}
		third := specChat(t, r, first, spec) // back to the first turn: its cells cut back
		answers[spec] = c.Choices[0].Message.Text() + "\x00" + second.Choices[0].Message.Text() + "\x00" + third.Choices[0].Message.Text()
		if third.Choices[0].Message.Text() != c.Choices[0].Message.Text() {
			t.Fatalf("speculation %s: the first turn asked again answers %q, first %q", spec, third.Choices[0].Message.Text(), c.Choices[0].Message.Text())
		}
	}
	if answers[runnerapi.SpeculationOff] != answers[runnerapi.SpeculationOn] {
		t.Fatalf("turns differ:\n off: %q\n on:  %q", answers[runnerapi.SpeculationOff], answers[runnerapi.SpeculationOn])
	}
}

// TestSpeculationStreamAndCancel: a streamed answer is the same with and without
// speculation, and one cancelled after its first tokens leaves its slot's cells
// right for the next request on it.
func TestSpeculationStreamAndCancel(t *testing.T) {
	r := startReady(t, speculationModel(t))
	body := map[string]any{"model": "m", "max_tokens": 160, "temperature": 0, "stream": true}
	var msgs, tools []any
	if err := json.Unmarshal([]byte("["+readBack(notes)+"]"), &msgs); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte("["+readTool+"]"), &tools); err != nil {
		t.Fatal(err)
	}
	body["messages"], body["tools"] = msgs, tools
	stream := func(spec string, stopAfter int) string {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.base+"/v1/chat/completions", bytes.NewReader(b))
		req.Header.Set(runnerapi.HeaderSpeculation, spec)
		resp, err := r.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var text strings.Builder
		chunks := 0
		_, _, _ = readSSE(t, resp.Body, func(ev sseEvent) bool {
			var c runnerapi.ChatCompletionChunk
			if json.Unmarshal([]byte(ev.data), &c) == nil && len(c.Choices) > 0 && c.Choices[0].Delta.Content != nil {
				text.WriteString(*c.Choices[0].Delta.Content)
				chunks++
			}
			return stopAfter == 0 || chunks < stopAfter
		})
		return text.String()
	}
	off := stream(runnerapi.SpeculationOff, 0)
	if on := stream(runnerapi.SpeculationOn, 0); on != off || off == "" {
		t.Fatalf("streamed answers differ:\n off: %q\n on:  %q", off, on)
	}
	for range 3 {
		stream(runnerapi.SpeculationOn, 3) // cancelled mid-answer
	}
	waitFor(t, 30*time.Second, "the cancelled requests' slots to free", func() bool { return r.status().SlotsBusy == 0 })
	if again := stream(runnerapi.SpeculationOn, 0); again != off {
		t.Fatalf("after cancelled requests the answer is %q, want %q", again, off)
	}
}

// TestSpeculationFromAPrediction: a chat request's prediction (OpenAI's predicted
// outputs) is what the slot drafts from: an answer with nothing to copy from its
// conversation keeps most of its tokens as drafts when the prediction is that answer,
// and is the same token for token with the prediction, with a wrong one, and with
// speculation off (which drafts nothing, prediction or not).
func TestSpeculationFromAPrediction(t *testing.T) {
	r := startReady(t, speculationModel(t))
	ask := func(prediction string) string {
		b := `{"model":"m","max_tokens":64,"temperature":0,"logprobs":true,"messages":[{"role":"user","content":"Tell me about the weather in the mountains."}]`
		if prediction != "" {
			p, _ := json.Marshal(map[string]any{"type": "content", "content": []map[string]string{{"type": "text", "text": prediction}}})
			b += `,"prediction":` + string(p)
		}
		return b + "}"
	}
	off := specChat(t, r, ask(""), runnerapi.SpeculationOff)
	answer := off.Choices[0].Message.Text()
	predicted := specChat(t, r, ask(answer), runnerapi.SpeculationOn)
	sameAnswers(t, off, predicted)
	if n := accepted(predicted); n*2 < predicted.Usage.CompletionTokens {
		t.Errorf("predicted its own answer (%q): %d of %d tokens drafted and kept, want at least half (drafts %+v)",
			answer, n, predicted.Usage.CompletionTokens, predicted.Usage.CompletionTokensDetails)
	}
	wrong := specChat(t, r, ask("Completely unrelated text about databases and their indexes."), runnerapi.SpeculationOn)
	sameAnswers(t, off, wrong)
	sameAnswers(t, off, specChat(t, r, ask(answer), runnerapi.SpeculationOff))
	t.Logf("%q: %d tokens; drafts with the answer predicted %+v, with a wrong prediction %+v", answer,
		predicted.Usage.CompletionTokens, predicted.Usage.CompletionTokensDetails, wrong.Usage.CompletionTokensDetails)
}

// TestTrainedModelQuotesWhatItReads: the trained model quotes a file it reads back
// word for word, files of its corpus's words in orders no document of it holds, and
// prompt lookup drafts most of such an answer: what the copy-heavy benchmark measures
// (docs/testing.md, "The trained test model"). The model before it (2026-11-27)
// slipped a word in each of these and kept at most 4 drafted tokens.
func TestTrainedModelQuotesWhatItReads(t *testing.T) {
	r := startTrained(t)
	for i, file := range []string{unseenFile,
		"Explain first because file editor test read because. Small always also shell project run this only while ask because unless the; " +
			"Repository old first context avoid code line this an this small find a.",
		"Avoid find review never ask into safe prefer file; Into terminal show context directory new. " +
			"Show into when exact result context exact result check only or a local until. Because avoid each error until this repository into;",
	} {
		c := specChat(t, r, `{"model":"m","max_tokens":200,"temperature":0,"tools":[`+readTool+`],"messages":[`+readBack(file)+`]}`,
			runnerapi.SpeculationOn)
		answer := c.Choices[0].Message.Text()
		if !strings.HasSuffix(answer, file) {
			t.Errorf("file %d: the answer does not end with the file word for word:\n got %q\nfile %q", i, answer, file)
			continue
		}
		det := c.Usage.CompletionTokensDetails
		if det == nil || 2*det.AcceptedPredictionTokens < c.Usage.CompletionTokens {
			t.Errorf("file %d: %d answer tokens, drafted tokens kept %+v: want at least half the answer", i, c.Usage.CompletionTokens, det)
		}
	}
}
