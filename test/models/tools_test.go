package models_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

// Templates that write tool calls as each family's own does, written for these tests
// (the families' real templates are not in the module cache); with the tiny models'
// vocabulary their marks are plain text.
const (
	harmonyTemplate = `{% if tools %}<|start|>developer<|message|>{{ tools | tojson }}<|end|>{% endif %}{% for m in messages %}{% if m.role == 'user' %}<|start|>user<|message|>{{ m.content }}<|end|>` +
		`{% elif m.role == 'assistant' and m.tool_calls %}{% for c in m.tool_calls %}<|start|>assistant to=functions.{{ c.function.name }}` +
		`<|channel|>commentary json<|message|>{{ c.function.arguments | tojson }}<|call|>{% endfor %}` +
		`{% elif m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>` +
		`{% elif m.role == 'tool' %}<|start|>functions.tool to=assistant<|channel|>commentary<|message|>{{ m.content }}<|end|>{% endif %}` +
		`{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}`
	hermesFamilyTemplate = `{% if tools %}<|im_start|>system
<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>
{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}
{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}{% elif m.role == 'tool' %}<tool_response>
{{ m.content }}
</tool_response>{% else %}{{ m.content }}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`
	glmTemplate = `{% if tools %}<|system|>
<tools>{{ tools | tojson }}</tools>
{% endif %}{% for m in messages %}<|{{ m.role }}|>
{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}
{% for k, v in c.function.arguments.items() %}<arg_key>{{ k }}</arg_key>
<arg_value>{{ v }}</arg_value>
{% endfor %}</tool_call>{% endfor %}{% elif m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>{% else %}{{ m.content }}{% endif %}
{% endfor %}{% if add_generation_prompt %}<|assistant|>
{% endif %}`
	functionGemmaTemplate = `{% if tools %}<start_of_turn>developer
{% for t in tools %}<start_function_declaration>{{ t | tojson }}<end_function_declaration>{% endfor %}<end_of_turn>
{% endif %}{% for m in messages %}<start_of_turn>{% if m.role == 'assistant' %}model{% else %}{{ m.role }}{% endif %}
{% if m.tool_calls %}{% for c in m.tool_calls %}<start_function_call>call:{{ c.function.name }}{{ '{' }}` +
		`{% for k, v in c.function.arguments.items() %}{{ k }}:<escape>{{ v }}<escape>{% if not loop.last %},{% endif %}{% endfor %}{{ '}' }}` +
		`<end_function_call>{% endfor %}{% elif m.role == 'tool' %}<start_function_response>{{ m.content }}<end_function_response>` +
		`{% else %}{{ m.content }}{% endif %}<end_of_turn>
{% endfor %}{% if add_generation_prompt %}<start_of_turn>model
{% endif %}`
)

// familyTools are each family's call template and the tool format the runner must
// find in it.
var familyTools = map[ggufsynth.Family]struct{ template, format string }{
	ggufsynth.Llama:     {template: hermesFamilyTemplate, format: "hermes"},
	ggufsynth.Qwen3MoE:  {template: hermesFamilyTemplate, format: "hermes"},
	ggufsynth.GPTOSS:    {template: harmonyTemplate, format: "harmony"},
	ggufsynth.GLM4MoE:   {template: glmTemplate, format: "glm"},
	ggufsynth.Gemma3:    {template: functionGemmaTemplate, format: "function-gemma"},
	ggufsynth.Qwen3Next: {template: hermesFamilyTemplate, format: "hermes"},
}

// zoneSchema is what a random-weight model can complete under a grammar.
const zoneSchema = `{"type":"object","properties":{"zone":{"enum":["UTC","CET"]}},"required":["zone"],"additionalProperties":false}`

// toolsParam are the tools offered: one whose arguments are a zoneSchema.
const toolsParam = `[{"type":"function","function":{"name":"get_time","description":"Current time in a zone",
	"parameters":` + zoneSchema + `}}]`

// TestToolCallPerFamily serves each family's tiny model with a template that writes
// calls in the family's own format, forces a call (a named tool_choice: the grammar
// constrains the output, the model cannot choose one itself), and checks that the
// call parses back into tool_calls with JSON arguments of the tool's schema, and that
// the template renders the call and its result as the next turn's prompt.
func TestToolCallPerFamily(t *testing.T) {
	eachFamily(t, func(t *testing.T, _ string, m tinyModel) {
		ft := familyTools[m.family]
		r := familyRunner(t, m.family, ft.template)
		if st := r.status(); st.Chat == nil || st.Chat.ToolFormat != ft.format || !st.Chat.Tools {
			t.Fatalf("status chat %+v, want tool format %s", st.Chat, ft.format)
		}
		call, reasoning, first := forcedCall(t, r)
		// The next turn: the call and its result, rendered by the template; a result
		// 39 words longer makes a prompt at least 39 tokens longer.
		long, short := nextTurn(t, r, call, strings.Repeat("noon ", 40)), nextTurn(t, r, call, "noon")
		if long-short < 39 || short <= first {
			t.Errorf("the next turn's prompt: %d tokens with a result of 40 words, %d with one, %d before the call: "+
				"want the call and its result rendered", long, short, first)
		}
		t.Logf("%s: %s call %s(%s) after %d bytes of reasoning; the next turn's prompt %d tokens (was %d)", m.family,
			ft.format, call.Function.Name, call.Function.Arguments, len(reasoning), long, first)
	})
}

// forcedCall forces a call to get_time and checks it: one call with arguments of the
// tool's schema. It returns the call, the reasoning before it and the prompt's tokens.
func forcedCall(t *testing.T, r *modelRunner) (call runnerapi.ToolCall, reasoning string, prompt int) {
	t.Helper()
	c, ch := seededAnswer(t, r, `{"model":"m","max_tokens":600,"temperature":1,"seed":%d,"tools":`+toolsParam+`,
		"parallel_tool_calls":false,"tool_choice":{"type":"function","function":{"name":"get_time"}},
		"messages":[{"role":"user","content":"What time is it?"}]}`)
	if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 || ch.Message.ToolCalls[0].Function.Name != "get_time" {
		t.Fatalf("forced call: finish %q, message %+v; want one call to get_time", ch.FinishReason, ch.Message)
	}
	call = ch.Message.ToolCalls[0]
	checkZone(t, call.Function.Arguments)
	return call, ch.Message.ReasoningContent, c.Usage.PromptTokens
}

// seededAnswer posts body (its seed a %d) with one seed after another until an
// answer is more than reasoning cut by max_tokens, and returns it. The grammar lets
// a model that writes the harmony format reason in its analysis channel first, which
// a random-weight model may not close before max_tokens; an answer cut there must be
// reasoning alone (content would be a broken grammar).
func seededAnswer(t *testing.T, r *modelRunner, body string) (runnerapi.ChatCompletion, runnerapi.ChatChoice) {
	t.Helper()
	for seed := range 12 {
		var c runnerapi.ChatCompletion
		if code := r.postChat(t, fmt.Sprintf(body, seed), &c); code != http.StatusOK || len(c.Choices) != 1 || c.Usage == nil {
			t.Fatalf("seed %d: %d %+v", seed, code, c)
		}
		ch := c.Choices[0]
		if ch.FinishReason != "length" || len(ch.Message.ToolCalls) > 0 || ch.Message.Text() != "" {
			return c, ch
		}
		t.Logf("seed %d: reasoning cut by max_tokens (%d bytes)", seed, len(ch.Message.ReasoningContent))
	}
	t.Fatal("no seed's answer closed its reasoning")
	return runnerapi.ChatCompletion{}, runnerapi.ChatChoice{}
}

// checkZone checks arguments (or an answer) against the tool's schema.
func checkZone(t *testing.T, arguments string) {
	t.Helper()
	var args struct {
		Zone string `json:"zone"`
	}
	if err := json.Unmarshal([]byte(arguments), &args); err != nil || (args.Zone != "UTC" && args.Zone != "CET") {
		t.Fatalf("%q: %v; want the schema's {\"zone\": \"UTC\" or \"CET\"}", arguments, err)
	}
}

// familyRunner serves family's tiny model with template as its chat template.
func familyRunner(t *testing.T, family ggufsynth.Family, template string) *modelRunner {
	t.Helper()
	bin := os.Getenv(runnerproc.RunnerEnv)
	if bin == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	spec, err := ggufsynth.TinyFamily(family)
	if err != nil {
		t.Fatal(err)
	}
	spec.ChatTemplate = template
	path := filepath.Join(t.TempDir(), family.Arch()+"-tools.gguf")
	if err := ggufsynth.Write(path, spec); err != nil {
		t.Fatal(err)
	}
	return startRunner(t, bin, path)
}

// TestHarmonyConstrained: a model that writes the harmony format answers
// response_format json_schema with the object alone as its content (the final
// channel's message, markers and reasoning apart), streamed with no mark in any
// chunk. How many chunks carry it depends on scheduling: the runner sends what was
// generated since its last write, all of a short answer at once on a busy machine.
// That the parser passes the final channel on as it comes is TestHarmonyStreams's.
func TestHarmonyConstrained(t *testing.T) {
	r := familyRunner(t, ggufsynth.GPTOSS, harmonyTemplate)
	_, ch := seededAnswer(t, r, `{"model":"m","max_tokens":600,"temperature":1,"seed":%d,
		"response_format":{"type":"json_schema","json_schema":{"name":"zone","strict":true,"schema":`+zoneSchema+`}},
		"messages":[{"role":"user","content":"Which zone?"}]}`)
	if ch.FinishReason != "stop" {
		t.Fatalf("structured answer: finish %q, message %+v", ch.FinishReason, ch.Message)
	}
	checkZone(t, ch.Message.Text())
	t.Logf("structured answer %s after %d bytes of reasoning", ch.Message.Text(), len(ch.Message.ReasoningContent))
	content, pieces := streamedObject(t, r.base)
	t.Logf("streamed: %s in %d content chunks", content, pieces)
	checkZone(t, content)
}

// streamedObject streams the zone answer with the official client, one seed after
// another until content comes, and returns the content and how many chunks carried
// it. No chunk carries a harmony mark.
func streamedObject(t *testing.T, base string) (content string, pieces int) {
	t.Helper()
	var schema map[string]any
	if err := json.Unmarshal([]byte(zoneSchema), &schema); err != nil {
		t.Fatal(err)
	}
	oc := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithMaxRetries(0))
	for seed := range 12 {
		s := oc.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{Model: "m",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Which zone?")},
			MaxTokens: openai.Int(600), Temperature: openai.Float(1), Seed: openai.Int(int64(seed)),
			ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
				JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "zone", Strict: openai.Bool(true), Schema: schema}}}})
		content, pieces = "", 0
		for s.Next() {
			c := s.Current()
			if len(c.Choices) == 0 || c.Choices[0].Delta.Content == "" {
				continue
			}
			if d := c.Choices[0].Delta.Content; strings.Contains(d, "<|") {
				t.Fatalf("a streamed chunk carries a harmony mark: %q", d)
			}
			content += c.Choices[0].Delta.Content
			pieces++
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		if content != "" {
			return content, pieces
		}
	}
	t.Fatal("no seed's streamed answer closed its reasoning")
	return "", 0
}

// TestHarmonyMarksAsControlTokens: where the vocabulary has the harmony marks as
// control tokens, as gpt-oss's does (<|call|> and <|return|> then end generation,
// <|end|> does not), the forced call's grammar takes them as their text, the runner
// shows them to the parser, and the call parses.
func TestHarmonyMarksAsControlTokens(t *testing.T) {
	bin := os.Getenv(runnerproc.RunnerEnv)
	if bin == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	spec, err := ggufsynth.TinyFamily(ggufsynth.GPTOSS)
	if err != nil {
		t.Fatal(err)
	}
	tokens, scores, types := ggufsynth.Vocabulary(spec.Vocab)
	marks := []string{"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>"}
	for i, m := range marks {
		at := len(tokens) - len(marks) + i
		tokens[at], types[at] = m, ggufsynth.TokenControl
	}
	spec.Tokenizer = &ggufsynth.Tokenizer{Model: "llama", Tokens: tokens, Types: types, Scores: scores,
		BOS: ggufsynth.BOSToken, EOS: ggufsynth.EOSToken, EOT: -1, AddBOS: true}
	spec.ChatTemplate = harmonyTemplate
	path := filepath.Join(t.TempDir(), "harmony-control.gguf")
	if err := ggufsynth.Write(path, spec); err != nil {
		t.Fatal(err)
	}
	r := startRunner(t, bin, path)
	// Each mark one token: the prompt is shorter than with the marks spelled out.
	plain := familyRunner(t, ggufsynth.GPTOSS, harmonyTemplate)
	call, reasoning, prompt := forcedCall(t, r)
	if _, _, spelled := forcedCall(t, plain); prompt >= spelled {
		t.Errorf("the prompt is %d tokens with the marks as control tokens, %d spelled out: want fewer", prompt, spelled)
	}
	t.Logf("call %s(%s) after %d bytes of reasoning; prompt %d tokens", call.Function.Name, call.Function.Arguments,
		len(reasoning), prompt)
}

// TestFunctionGemmaStringText: the call grammar of the function-gemma format, as the
// runner's grammar engine reads it, lets a string argument hold "<" (code and markup
// do) but not "<e", which opens the format's <escape> and <end_function_call>: an
// answer continued from a call cut inside such a string is taken, or refused as not
// following the grammar of tools.
func TestFunctionGemmaStringText(t *testing.T) {
	r := familyRunner(t, ggufsynth.Gemma3, functionGemmaTemplate)
	const note = `[{"type":"function","function":{"name":"note","parameters":{"type":"object",
		"properties":{"text":{"type":"string"}},"required":["text"]}}}]`
	for _, tc := range []struct {
		text string
		want int
	}{
		{"if a < b then <div> << x", http.StatusOK},
		{"ends <", http.StatusOK},
		{"x <end", http.StatusBadRequest},
		{"x <em>", http.StatusBadRequest},
		{"x <escape>y", http.StatusBadRequest}, // the string closed: a comma or "}" next
	} {
		answer := "<start_function_call>call:note{text:<escape>" + tc.text
		body := fmt.Sprintf(`{"model":"m","max_tokens":4,"tools":%s,"tool_choice":"required","messages":[
			{"role":"user","content":"Take a note"},{"role":"assistant","content":%q}]}`, note, answer)
		req, err := http.NewRequest(http.MethodPost, r.base+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var raw bytes.Buffer
		_, _ = raw.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || tc.want != http.StatusOK && !strings.Contains(raw.String(), "does not follow the grammar of tools") {
			t.Errorf("a call continued inside the string %q: %d %s, want %d", tc.text, resp.StatusCode, raw.String(), tc.want)
		}
	}
}

// nextTurn is the prompt tokens of the turn after call, with result as its result.
func nextTurn(t *testing.T, r *modelRunner, call runnerapi.ToolCall, result string) int {
	t.Helper()
	var next runnerapi.ChatCompletion
	code := r.postChat(t, fmt.Sprintf(`{"model":"m","max_tokens":1,"temperature":0,"tools":%s,"messages":[
		{"role":"user","content":"What time is it?"},
		{"role":"assistant","content":null,"tool_calls":[{"id":%q,"type":"function","function":{"name":"get_time","arguments":%q}}]},
		{"role":"tool","tool_call_id":%q,"content":%q}]}`, toolsParam, call.ID, call.Function.Arguments, call.ID, result), &next)
	if code != http.StatusOK || next.Usage == nil {
		t.Fatalf("the turn after the tool result: %d %+v", code, next)
	}
	return next.Usage.PromptTokens
}

// postChat posts a chat body to r and decodes its answer into v; it returns the status.
func (r *modelRunner) postChat(t *testing.T, body string, v any) int {
	t.Helper()
	resp, err := http.Post(r.base+"/v1/chat/completions", "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw bytes.Buffer
	_, _ = raw.ReadFrom(resp.Body)
	if err := json.Unmarshal(raw.Bytes(), v); err != nil || resp.StatusCode != http.StatusOK {
		t.Logf("chat: %d %s", resp.StatusCode, raw.String())
	}
	return resp.StatusCode
}
