package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/testassets"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// apiModel is a random-weight model with the real Llama 3 vocabulary and Llama 3.1
// chat template, written once to the fleet's model server.
var apiModel = sync.OnceValue(func() error {
	spec, err := testassets.Llama31Spec()
	if err != nil {
		return err
	}
	return ggufsynth.Write(filepath.Join(fleet.ModelsDir, "llama31.gguf"), spec)
})

// apiDeployment serves apiModel in a new namespace and returns the model name.
func apiDeployment(t *testing.T) string {
	t.Helper()
	if err := apiModel(); err != nil {
		t.Fatal(err)
	}
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "assistant", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model.Source = fleet.ModelsURL + "/llama31.gguf"
		md.Spec.Engine.ContextLength = 4096
	}))
	waitReady(t, ns, "assistant", 1, 3*time.Minute)
	return ns + "/assistant"
}

const e2eWeatherTool = `{"type":"function","function":{"name":"get_weather","description":"Current weather for a city",
	"parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":24}},"required":["city"],"additionalProperties":false}}}`

func params(t testing.TB, body string) openai.ChatCompletionNewParams {
	t.Helper()
	var p openai.ChatCompletionNewParams
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAPIThroughGateway: the serving surface end to end through the gateway, with the
// official OpenAI Go client: a tool call round trip (forced call, streamed and
// reassembled by the SDK, then the tool's result and an answer), strict json_schema
// output on 20 seeded runs, logprobs, two choices, and a field that is refused by name.
// Then the same through the official openai npm package, run by node.
func TestAPIThroughGateway(t *testing.T) {
	model := apiDeployment(t)
	c := gatewayClient()
	ctx := t.Context()

	stream := c.Chat.Completions.NewStreaming(ctx, params(t, fmt.Sprintf(`{"model":%q,"max_tokens":64,"seed":1,
		"tool_choice":"required","parallel_tool_calls":false,"tools":[%s],
		"messages":[{"role":"user","content":"Weather in Paris?"}]}`, model, e2eWeatherTool)))
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	msg := acc.Choices[0].Message
	if acc.Choices[0].FinishReason != "tool_calls" || len(msg.ToolCalls) != 1 || msg.ToolCalls[0].Function.Name != "get_weather" {
		t.Fatalf("finish %q, message %+v: want one get_weather call", acc.Choices[0].FinishReason, msg)
	}
	call := msg.ToolCalls[0]
	var args struct{ City string }
	if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil || len([]rune(args.City)) > 24 {
		t.Fatalf("arguments %q: %v", call.Function.Arguments, err)
	}
	answer, err := c.Chat.Completions.New(ctx, params(t, fmt.Sprintf(`{"model":%q,"max_tokens":16,"seed":1,"tools":[%s],"messages":[
		{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","content":null,"tool_calls":[{"id":%q,"type":"function","function":{"name":"get_weather","arguments":%q}}]},
		{"role":"tool","tool_call_id":%q,"content":"{\"temperature\": 21}"}]}`, model, e2eWeatherTool, call.ID, call.Function.Arguments, call.ID)))
	if err != nil {
		t.Fatal(err)
	}
	if answer.Usage.PromptTokens <= acc.Usage.PromptTokens && acc.Usage.PromptTokens > 0 || answer.Choices[0].FinishReason == "" {
		t.Errorf("answer to the tool result: %+v", answer)
	}

	schema := `{"type":"object","properties":{"name":{"type":"string","maxLength":16},"age":{"type":"integer","minimum":0,"maximum":120},
		"pet":{"enum":["cat","dog","none"]}},"required":["name","age","pet"],"additionalProperties":false}`
	for seed := range 20 {
		r, err := c.Chat.Completions.New(ctx, params(t, fmt.Sprintf(`{"model":%q,"max_tokens":200,"seed":%d,"temperature":1,
			"messages":[{"role":"user","content":"A person, please."}],
			"response_format":{"type":"json_schema","json_schema":{"name":"person","strict":true,"schema":%s}}}`, model, seed, schema)))
		if err != nil {
			t.Fatal(err)
		}
		var p struct {
			Name string
			Age  *int
			Pet  string
		}
		content := r.Choices[0].Message.Content
		dec := json.NewDecoder(strings.NewReader(content))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil || p.Age == nil || *p.Age < 0 || *p.Age > 120 || len([]rune(p.Name)) > 16 ||
			(p.Pet != "cat" && p.Pet != "dog" && p.Pet != "none") || r.Choices[0].FinishReason != "stop" {
			t.Errorf("seed %d: %q (finish %s) does not match the schema: %v", seed, content, r.Choices[0].FinishReason, err)
		}
	}

	two, err := c.Chat.Completions.New(ctx, params(t, fmt.Sprintf(`{"model":%q,"max_tokens":6,"n":2,"seed":3,"logprobs":true,"top_logprobs":2,
		"messages":[{"role":"user","content":"Hello"}]}`, model)))
	if err != nil {
		t.Fatal(err)
	}
	if len(two.Choices) != 2 {
		t.Fatalf("%d choices, want 2", len(two.Choices))
	}
	for _, ch := range two.Choices {
		if len(ch.Logprobs.Content) == 0 || len(ch.Logprobs.Content[0].TopLogprobs) != 2 {
			t.Errorf("choice %d logprobs %+v", ch.Index, ch.Logprobs)
		}
	}

	_, err = c.Chat.Completions.New(ctx, params(t, fmt.Sprintf(`{"model":%q,"logit_bias":{"1":5},"messages":[{"role":"user","content":"x"}]}`, model)))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "logit_bias" {
		t.Errorf("logit_bias through the gateway: %v, want a 400 naming it", err)
	}

	t.Run("responses", func(t *testing.T) { checkResponses(t, c, model) })
	t.Run("anthropic messages", func(t *testing.T) { checkAnthropic(t, model) })
	t.Run("openai npm package", func(t *testing.T) { runNodeClient(t, model) })
}

// checkResponses: the Responses API through the gateway with the official Go client:
// text, a stream, and a forced function call.
func checkResponses(t *testing.T, c openai.Client, model string) {
	ctx := t.Context()
	text := responses.ResponseNewParams{Model: model, Instructions: openai.String("Be brief."),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Hello")}, MaxOutputTokens: openai.Int(16)}
	r, err := c.Responses.New(ctx, text)
	if err != nil {
		t.Fatal(err)
	}
	if r.OutputText() == "" || r.Usage.InputTokens == 0 || r.Usage.OutputTokens == 0 || !strings.HasPrefix(r.ID, "resp_") {
		t.Errorf("response %+v", r)
	}
	stream := c.Responses.NewStreaming(ctx, text)
	var deltas strings.Builder
	var final responses.Response
	for stream.Next() {
		switch ev := stream.Current(); ev.Type {
		case "response.output_text.delta":
			deltas.WriteString(ev.Delta)
		case "response.completed", "response.incomplete":
			final = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if deltas.Len() == 0 || final.OutputText() != deltas.String() || final.Usage.OutputTokens == 0 {
		t.Errorf("streamed %q, final %+v", deltas.String(), final)
	}
	call := responses.ResponseNewParams{Model: model, Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Weather in Paris?")},
		MaxOutputTokens: openai.Int(200), ParallelToolCalls: openai.Bool(false),
		ToolChoice: responses.ResponseNewParamsToolChoiceUnion{OfToolChoiceMode: openai.Opt(responses.ToolChoiceOptionsRequired)},
		Tools: []responses.ToolUnionParam{{OfFunction: &responses.FunctionToolParam{Name: "get_weather", Strict: openai.Bool(true),
			Parameters: map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string", "maxLength": 24}},
				"required": []string{"city"}, "additionalProperties": false}}}}}
	r, err = c.Responses.New(ctx, call)
	if err != nil {
		t.Fatal(err)
	}
	var fc *responses.ResponseFunctionToolCall
	for _, item := range r.Output {
		if item.Type == "function_call" {
			x := item.AsFunctionCall()
			fc = &x
		}
	}
	if fc == nil || fc.Name != "get_weather" || !json.Valid([]byte(fc.Arguments)) || fc.CallID == "" {
		t.Fatalf("forced function call: %+v", r.Output)
	}
}

// checkAnthropic: the Anthropic Messages API through the gateway, raw HTTP with
// x-api-key: a message, a forced tool use, a stream, and an error in Anthropic's shape.
func checkAnthropic(t *testing.T, model string) {
	send := func(body string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, fleet.GatewayURL+"/v1/messages", strings.NewReader(body))
		req.Header.Set("x-api-key", "unused")
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("content-type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	var msg struct {
		Type         string
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
		Content      []struct {
			Type, Text, Name string
			Input            map[string]any
		}
		Usage struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		}
	}
	resp, b := send(fmt.Sprintf(`{"model":%q,"max_tokens":12,"system":"Be brief.","messages":[{"role":"user","content":"Hello"}]}`, model))
	if err := json.Unmarshal(b, &msg); err != nil || resp.StatusCode != 200 || msg.Usage.InputTokens == 0 || len(msg.Content) == 0 {
		t.Fatalf("message: %d %s", resp.StatusCode, b)
	}
	resp, b = send(fmt.Sprintf(`{"model":%q,"max_tokens":200,"tool_choice":{"type":"any","disable_parallel_tool_use":true},"messages":[{"role":"user","content":"Weather in Paris?"}],
		"tools":[{"name":"get_weather","input_schema":{"type":"object","properties":{"city":{"type":"string","maxLength":24}},"required":["city"]}}]}`, model))
	msg.Content = nil
	if err := json.Unmarshal(b, &msg); err != nil || resp.StatusCode != 200 || msg.StopReason != "tool_use" ||
		msg.Content[len(msg.Content)-1].Type != "tool_use" || msg.Content[len(msg.Content)-1].Input["city"] == nil {
		t.Fatalf("tool use: %d %s", resp.StatusCode, b)
	}
	// A stop sequence taken from the middle of a greedy answer ends the same answer
	// there, and is reported as Anthropic reports it.
	greedy := fmt.Sprintf(`{"model":%q,"max_tokens":24,"temperature":0,"messages":[{"role":"user","content":"Tell a story"}]`, model)
	resp, b = send(greedy + "}")
	msg.Content = nil
	if err := json.Unmarshal(b, &msg); err != nil || resp.StatusCode != 200 || len(msg.Content) != 1 ||
		msg.StopReason != "max_tokens" || msg.StopSequence != nil {
		t.Fatalf("greedy answer: %d %s", resp.StatusCode, b)
	}
	full := []rune(msg.Content[0].Text)
	if len(full) < 8 {
		t.Fatalf("greedy answer too short to take a stop sequence from: %q", string(full))
	}
	stop := string(full[len(full)/2 : len(full)/2+3])
	want := string(full)[:strings.Index(string(full), stop)]
	stopJSON, _ := json.Marshal([]string{stop})
	resp, b = send(greedy + `,"stop_sequences":` + string(stopJSON) + "}")
	msg.Content, msg.StopSequence = nil, nil
	if err := json.Unmarshal(b, &msg); err != nil || resp.StatusCode != 200 || msg.StopReason != "stop_sequence" ||
		msg.StopSequence == nil || *msg.StopSequence != stop {
		t.Fatalf("stop sequence %q: %d %s", stop, resp.StatusCode, b)
	}
	text := ""
	if len(msg.Content) > 0 {
		text = msg.Content[0].Text
	}
	if text != want {
		t.Errorf("stopped at %q: content %q, want %q", stop, text, want)
	}
	resp, b = send(fmt.Sprintf(`{"model":%q,"max_tokens":8,"stream":true,"messages":[{"role":"user","content":"Hello"}]}`, model))
	var events []string
	for _, line := range strings.Split(string(b), "\n") {
		if e, ok := strings.CutPrefix(line, "event: "); ok {
			events = append(events, e)
		}
	}
	if resp.StatusCode != 200 || len(events) < 5 || events[0] != "message_start" || events[len(events)-1] != "message_stop" ||
		events[len(events)-2] != "message_delta" {
		t.Errorf("stream: %d events %v", resp.StatusCode, events)
	}
	resp, b = send(`{"model":"no-such-model","max_tokens":8,"messages":[{"role":"user","content":"Hello"}]}`)
	var e struct {
		Type  string
		Error struct{ Type, Message string }
	}
	if json.Unmarshal(b, &e) != nil || resp.StatusCode != 404 || e.Type != "error" || e.Error.Type != "not_found_error" {
		t.Errorf("unknown model: %d %s, want Anthropic's not_found_error", resp.StatusCode, b)
	}
}

// runNodeClient runs testdata/openai-node.cjs with node against the fleet's gateway.
func runNodeClient(t *testing.T, model string) {
	runNodeScript(t, "openai-node.cjs", fleet.GatewayURL+"/v1", "unused", model)
}

// runNodeScript runs testdata/<script> with node and the openai package (see
// nodeScript); the script's last line says its checks passed.
func runNodeScript(t *testing.T, script, baseURL, apiKey, model string, env ...string) {
	t.Helper()
	if err := runNode(t, nodeScript(t, script, baseURL, apiKey, model, env...)); err != nil {
		t.Fatal(err)
	}
}

// nodeScript is the command that runs testdata/<script> with node and the openai
// package, the client pointed at baseURL with apiKey, and env added. The package comes
// from $MACFLEET_NODE_MODULES (default ~/.cache/macfleet/npm/node_modules, where
// .ci/run installs it); without it the test is skipped, except in CI.
func nodeScript(t *testing.T, script, baseURL, apiKey, model string, env ...string) *exec.Cmd {
	t.Helper()
	modules := nodeModules()
	node, err := exec.LookPath("node")
	if _, serr := os.Stat(filepath.Join(modules, "openai")); err != nil || serr != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("node (%v) or the openai package in %s (%v) is missing; .ci/run installs both", err, modules, serr)
		}
		t.Skipf("node or the openai npm package is missing (%s); .ci/run installs them", modules)
	}
	cmd := exec.CommandContext(t.Context(), node, filepath.Join("testdata", script))
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules, "OPENAI_BASE_URL="+baseURL,
		"OPENAI_API_KEY="+apiKey, "MODEL="+model)
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

// nodeModules is where the npm clients of hack/npm are installed: $MACFLEET_NODE_MODULES,
// default ~/.cache/macfleet/npm/node_modules.
func nodeModules() string {
	if m := os.Getenv("MACFLEET_NODE_MODULES"); m != "" {
		return m
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "macfleet", "npm", "node_modules")
}

// runNode runs a nodeScript command and logs its output; any goroutine may call it.
func runNode(t *testing.T, cmd *exec.Cmd) error {
	out, err := cmd.CombinedOutput()
	t.Logf("node %s:\n%s", filepath.Base(cmd.Args[len(cmd.Args)-1]), out)
	if err != nil {
		return fmt.Errorf("the openai npm client failed: %w", err)
	}
	if !strings.Contains(string(out), "all checks passed") {
		return fmt.Errorf("the script did not report its checks")
	}
	return nil
}
