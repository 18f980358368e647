package e2e

import (
	"encoding/json"
	"math"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/testassets"
	"github.com/macfleet/macfleet/test/trainmodel/convert"
	"github.com/macfleet/macfleet/test/trainmodel/corpus"
)

// TestTrainedModelLayout converts weights in train.py's layout and default shapes
// (random values: training runs on a GPU machine, docs/testing.md) and serves the
// GGUF: the runner loads it with the real Llama 3 template and llama3-json tool
// calls, generates, and tokenizes every prompt of the corpus exactly as the corpus
// generator did: the model is trained on the tokens the runner will give it.
func TestTrainedModelLayout(t *testing.T) {
	runnerBinary(t)
	dir := t.TempDir()
	if err := convert.WriteRandom(dir, convert.Defaults, 1); err != nil {
		t.Fatal(err)
	}
	gguf := filepath.Join(dir, "tiny-chat-trained.gguf")
	if err := convert.Convert(dir, gguf); err != nil {
		t.Fatal(err)
	}
	r := startReady(t, gguf)
	st := r.status()
	if st.Chat == nil || st.Chat.Renderer != runnerapi.RendererJinja || st.Chat.ToolFormat != "llama3-json" || !st.Chat.Tools {
		t.Fatalf("status chat %+v, want the model's Jinja template with llama3-json tool calls", st.Chat)
	}

	var c runnerapi.ChatCompletion
	body := `{"model":"m","max_tokens":6,"temperature":0,"tools":[` + weatherTool + `],
		"messages":[{"role":"user","content":"Weather in Paris?"}]}`
	if code := r.postJSON("/v1/chat/completions", json.RawMessage(body), &c); code != http.StatusOK ||
		len(c.Choices) != 1 || c.Usage == nil || c.Usage.CompletionTokens == 0 {
		t.Fatalf("chat completion: %d %+v", code, c)
	}

	l, err := corpus.LoadLlama3()
	if err != nil {
		t.Fatal(err)
	}
	g, err := corpus.NewGenerator(l, corpus.DefaultSeed, filepath.Join("..", "..", corpus.AgentFixtures))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for i := 0; len(kinds) < 8 || kinds["tool-call"] < 4; i++ {
		if i > 3000 {
			t.Fatalf("the first %d documents have only the kinds %v", i, kinds)
		}
		conv, doc, err := g.Document(i)
		if err != nil {
			t.Fatal(err)
		}
		if kinds[conv.Kind] >= 4 {
			continue
		}
		kinds[conv.Kind]++
		checkDocumentTokens(t, r, l, conv, doc)
	}
}

// checkDocumentTokens compares each prompt of a corpus document (the conversation
// up to an assistant turn) with the runner's tokens for that chat request, and each
// assistant turn with the runner's tokens for its text.
func checkDocumentTokens(t *testing.T, r *runner, l *corpus.Llama3, conv corpus.Conversation, doc corpus.Document) {
	t.Helper()
	at := 0
	for k, m := range conv.Messages {
		if m.Role != "assistant" {
			continue
		}
		for at < len(doc.IDs) && !doc.Supervised[at] {
			at++
		}
		req := runnerapi.ChatRequest{Model: "m", Messages: conv.Messages[:k]}
		req.Tools = conv.Tools
		var tok runnerapi.TokenizeResponse
		if code := r.postJSON("/tokenize", map[string]any{"chat": req}, &tok); code != http.StatusOK {
			t.Fatalf("%s: tokenize %d messages: %d", conv.Kind, k, code)
		}
		if !slices.Equal(tok.Tokens, doc.IDs[:at]) {
			t.Fatalf("%s: the runner tokenizes the prompt before turn %d into %d tokens, the corpus into %d (first difference at %d)",
				conv.Kind, k, len(tok.Tokens), at, firstDiff(tok.Tokens, doc.IDs[:at]))
		}
		end := at
		for end < len(doc.IDs) && doc.Supervised[end] {
			end++
		}
		// The turn's text (the next prompt checks that the template renders it so), as
		// the model writes it: tokenized alone, no BOS, its end of turn apart.
		turn := doc.IDs[at : end-1]
		content, err := l.Decode(turn)
		if err != nil {
			t.Fatal(err)
		}
		var ttok runnerapi.TokenizeResponse
		noBOS := false
		if code := r.postJSON("/tokenize", runnerapi.TokenizeRequest{Content: &content, AddSpecial: &noBOS}, &ttok); code != http.StatusOK {
			t.Fatalf("%s: tokenize turn %d: %d", conv.Kind, k, code)
		}
		if !slices.Equal(ttok.Tokens, turn) || doc.IDs[end-1] != int32(l.Tokenizer.EOT) {
			t.Fatalf("%s: the runner tokenizes turn %d %q into %v, the corpus into %v", conv.Kind, k, content, ttok.Tokens, doc.IDs[at:end])
		}
		at = end
	}
}

func firstDiff(a, b []int32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestTrainedModelAnswers holds the trained test model (docs/testing.md) to what it
// was trained for, through the real runner, greedy: answers in sentences, a call of
// the offered tool with the city the user named, an answer that carries the tool's
// result, and JSON that parses under response_format. It needs the model: without
// test/models/tiny-chat-trained.gguf (or MACFLEET_TRAINED_MODEL) it skips.
func TestTrainedModelAnswers(t *testing.T) {
	r := startTrained(t)
	chat := r.chatChoice

	hi := chat(`{"model":"m","max_tokens":48,"temperature":0,"messages":[{"role":"user","content":"Hi"}]}`)
	if text := hi.Message.Text(); hi.FinishReason != "stop" || !sentence.MatchString(text) || len(strings.Fields(text)) < 2 {
		t.Errorf("Hi: %q (finish %s), want a sentence that ends the turn", text, hi.FinishReason)
	}

	const ask = `{"role":"user","content":"What's the weather in Lisbon?"}`
	call := chat(`{"model":"m","max_tokens":48,"temperature":0,"tools":[` + weatherTool + `],"messages":[` + ask + `]}`)
	if call.FinishReason != "tool_calls" || len(call.Message.ToolCalls) != 1 {
		t.Fatalf("weather question: finish %s, message %+v, want one tool call", call.FinishReason, call.Message)
	}
	fn := call.Message.ToolCalls[0].Function
	var args struct {
		City string `json:"city"`
	}
	if fn.Name != "get_weather" || json.Unmarshal([]byte(fn.Arguments), &args) != nil || args.City != "Lisbon" {
		t.Fatalf("weather question: called %s(%s), want get_weather with the city Lisbon", fn.Name, fn.Arguments)
	}
	callJSON, _ := json.Marshal(call.Message.ToolCalls)
	final := chat(`{"model":"m","max_tokens":64,"temperature":0,"tools":[` + weatherTool + `],"messages":[` + ask +
		`,{"role":"assistant","content":null,"tool_calls":` + string(callJSON) + `},` +
		`{"role":"tool","tool_call_id":"` + call.Message.ToolCalls[0].ID + `","content":"{\"city\": \"Lisbon\", \"temperature\": 23, \"condition\": \"sunny\"}"}]}`)
	if text := final.Message.Text(); final.FinishReason != "stop" || !strings.Contains(text, "23") || !strings.Contains(text, "sunny") {
		t.Errorf("answer from the tool result: %q (finish %s), want one that says 23 and sunny", text, final.FinishReason)
	}

	js := chat(`{"model":"m","max_tokens":64,"temperature":0,"response_format":{"type":"json_object"},
		"messages":[{"role":"user","content":"Return a JSON object with the country and capital of Spain."}]}`)
	var obj map[string]any
	if err := json.Unmarshal([]byte(js.Message.Text()), &obj); err != nil || js.FinishReason != "stop" || len(obj) == 0 {
		t.Errorf("JSON answer %q (finish %s): %v", js.Message.Text(), js.FinishReason, err)
	}
}

// startTrained starts a runner on the trained test model, or skips without it.
func startTrained(t *testing.T) *runner {
	t.Helper()
	runnerBinary(t)
	path, ok := testassets.TrainedModelPath()
	if !ok {
		t.Skipf("no trained test model at %s: docs/testing.md says how to make one", path)
	}
	return startReady(t, path)
}

// chatChoice posts a chat request that must succeed with one choice, and returns it.
func (r *runner) chatChoice(body string) runnerapi.ChatChoice {
	r.t.Helper()
	var c runnerapi.ChatCompletion
	if code := r.postJSON("/v1/chat/completions", json.RawMessage(body), &c); code != http.StatusOK || len(c.Choices) != 1 {
		r.t.Fatalf("chat completion %s: %d %+v", body, code, c)
	}
	return c.Choices[0]
}

// sentence is an answer in words: a capital first, a full stop, question or
// exclamation mark last.
// sentence is English prose: a capital, words of letters, a stop, and then either
// nothing or more of the same after a space ("Hello! What would you like to know?").
var sentence = regexp.MustCompile(`^[A-Z][A-Za-z',]*( [A-Za-z0-9',"-]+)*[.!?]( [A-Z][^\n]*)?$`)

// TestTrainedModelMatchesReference: llama.cpp computes, from the GGUF of weights in
// train.py's layout, what train.py's model computes from the weights themselves
// (test/trainmodel/reference.py, its forward pass in pure Python): the greedy tokens
// and their log-probabilities. Rotary pairs, grouped-query heads (4 query heads on
// 2 key/value heads), norms and the tied output all take part; weights trained in
// another convention would turn to noise in the GGUF. F32, so that only the order
// of the sums differs.
func TestTrainedModelMatchesReference(t *testing.T) {
	runnerBinary(t)
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 to run the reference forward pass")
	}
	dir := t.TempDir()
	h := convert.Hyperparameters{Vocab: 128256, Embd: 32, Layers: 2, Heads: 4, KVHeads: 2, FF: 64, Ctx: 4096,
		RopeTheta: 10000, NormEps: convert.NormEps}
	if err := convert.WriteRandom(dir, h, 5); err != nil {
		t.Fatal(err)
	}
	spec, err := convert.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	spec.DType = ggufsynth.F32
	gguf := filepath.Join(dir, "reference.gguf")
	if err := ggufsynth.Write(gguf, spec); err != nil {
		t.Fatal(err)
	}
	l, err := corpus.LoadLlama3()
	if err != nil {
		t.Fatal(err)
	}
	prompt, err := l.Encode("<|begin_of_text|>The weather in Paris is sunny, and the files are")
	if err != nil {
		t.Fatal(err)
	}
	const steps = 3
	ids := make([]string, len(prompt))
	for i, id := range prompt {
		ids[i] = strconv.Itoa(int(id))
	}
	out, err := exec.Command(py, filepath.Join("..", "trainmodel", "reference.py"), "--weights", dir,
		"--prompt", strings.Join(ids, ","), "--steps", strconv.Itoa(steps)).Output()
	if err != nil {
		t.Fatalf("reference.py: %v", err)
	}
	var ref struct {
		Tokens   []int32   `json:"tokens"`
		Logprobs []float64 `json:"logprobs"`
	}
	if err := json.Unmarshal(out, &ref); err != nil || len(ref.Tokens) != steps {
		t.Fatalf("reference.py printed %q: %v", out, err)
	}

	r := startReady(t, gguf)
	var c runnerapi.Completion
	body := map[string]any{"model": "m", "prompt": prompt, "max_tokens": steps, "temperature": 0, "logprobs": 1}
	if code := r.postJSON("/v1/completions", body, &c); code != http.StatusOK || len(c.Choices) != 1 || c.Choices[0].Logprobs == nil {
		t.Fatalf("completion: %d %+v", code, c)
	}
	lp := c.Choices[0].Logprobs
	if len(lp.TokenLogprobs) != steps {
		t.Fatalf("llama.cpp gave %d tokens, want %d", len(lp.TokenLogprobs), steps)
	}
	for i := range steps {
		want, err := l.Decode(ref.Tokens[i : i+1])
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(lp.TokenLogprobs[i]-ref.Logprobs[i]) > 1e-3 || (utf8.ValidString(want) && lp.Tokens[i] != want) {
			t.Errorf("token %d: llama.cpp %q (logprob %.5f), the reference %q (%.5f)", i, lp.Tokens[i], lp.TokenLogprobs[i], want, ref.Logprobs[i])
		}
	}
}
