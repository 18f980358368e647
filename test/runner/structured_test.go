package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// personSchema is bounded (lengths, ranges, enums, item counts), so even a
// random-weight model under it reaches the end of the object.
const personSchema = `{"type":"object","properties":{
	"name":{"type":"string","minLength":1,"maxLength":12},
	"age":{"type":"integer","minimum":0,"maximum":120},
	"color":{"enum":["red","green","blue"]},
	"tags":{"type":"array","items":{"type":"string","maxLength":6},"maxItems":3},
	"born":{"type":"string","format":"date"}},
	"required":["name","age","color","tags","born"],"additionalProperties":false}`

// boundedWeatherTool has parameters a random-weight model can complete.
const boundedWeatherTool = `{"type":"function","function":{"name":"get_weather","description":"Current weather for a city",
	"parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":16},"unit":{"type":"string","enum":["c","f"]}},
	"required":["city","unit"],"additionalProperties":false}}}`

const timeTool = `{"type":"function","function":{"name":"get_time","description":"Current time in a zone",
	"parameters":{"type":"object","properties":{"zone":{"enum":["UTC","CET"]}},"required":["zone"],"additionalProperties":false}}}`

func compileSchema(t testing.TB, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func validate(t testing.TB, s *jsonschema.Schema, text string) error {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return s.Validate(v)
}

// apiFatal fails the test with the whole error body of an API error.
func apiFatal(t testing.TB, err error) {
	t.Helper()
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		t.Fatalf("%d: %s", apiErr.StatusCode, apiErr.RawJSON())
	}
	t.Fatal(err)
}

func chatParams(t testing.TB, body string) openai.ChatCompletionNewParams {
	t.Helper()
	var p openai.ChatCompletionNewParams
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func (r *runner) openAI() openai.Client {
	return openai.NewClient(option.WithBaseURL(r.base+"/v1/"), option.WithAPIKey("unused"),
		option.WithHTTPClient(r.client), option.WithMaxRetries(0))
}

// TestStructuredOutputs: a json_schema response format holds on every seeded run of a
// random-weight model with the real Llama 3 vocabulary, whole and streamed; schema
// constructs the grammar cannot enforce are refused by name.
func TestStructuredOutputs(t *testing.T) {
	r := startReady(t, specModel(t, "llama31", testassets.Llama31Spec))
	client := r.openAI()
	ctx := context.Background()
	schema := compileSchema(t, personSchema)
	body := func(seed int) string {
		return fmt.Sprintf(`{"model":"m","max_tokens":400,"temperature":1,"seed":%d,
			"messages":[{"role":"user","content":"Describe a person."}],
			"response_format":{"type":"json_schema","json_schema":{"name":"person","strict":true,"schema":%s}}}`, seed, personSchema)
	}
	for seed := range 20 {
		c, err := client.Chat.Completions.New(ctx, chatParams(t, body(seed)))
		if err != nil {
			t.Fatal(err)
		}
		content := c.Choices[0].Message.Content
		if fr := c.Choices[0].FinishReason; fr != "stop" {
			t.Errorf("seed %d: finish_reason %q (content %q), want stop", seed, fr, content)
		}
		if err := validate(t, schema, content); err != nil {
			t.Errorf("seed %d: %q does not validate: %v", seed, content, err)
		}
	}
	stream := client.Chat.Completions.NewStreaming(ctx, chatParams(t, body(99)))
	acc := openai.ChatCompletionAccumulator{}
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if err := validate(t, schema, acc.Choices[0].Message.Content); err != nil || chunks < 5 {
		t.Errorf("streamed in %d chunks %q: %v", chunks, acc.Choices[0].Message.Content, err)
	}

	// json_object: any JSON object.
	for seed := range 3 {
		c, err := client.Chat.Completions.New(ctx, chatParams(t, fmt.Sprintf(`{"model":"m","max_tokens":300,"seed":%d,
			"messages":[{"role":"user","content":"JSON please"}],"response_format":{"type":"json_object"}}`, seed)))
		if err != nil {
			t.Fatal(err)
		}
		content := c.Choices[0].Message.Content
		var obj map[string]any
		switch fr := c.Choices[0].FinishReason; {
		case fr == "stop" && json.Unmarshal([]byte(content), &obj) != nil:
			t.Errorf("json_object seed %d: %q is not a JSON object", seed, content)
		case fr == "length" && !strings.HasPrefix(strings.TrimSpace(content), "{"):
			t.Errorf("json_object seed %d: cut at the length limit, %q does not start an object", seed, content)
		case fr != "stop" && fr != "length":
			t.Errorf("json_object seed %d: finish_reason %q", seed, fr)
		}
	}

	for _, tc := range []struct {
		name, format, param, code, message string
	}{
		{"unsupported keyword", `{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"a":{"not":{"type":"string"}}}}}}`,
			"response_format.json_schema.schema", runnerapi.CodeUnsupportedParameter, `keyword "not"`},
		{"unsupported format", `{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","format":"email"}}}`,
			"response_format.json_schema.schema", runnerapi.CodeUnsupportedParameter, "format email"},
		{"pattern the converter refuses", `{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","pattern":"abc"}}}`,
			"response_format", runnerapi.CodeInvalidValue, "Pattern must start with '^'"},
		{"no schema", `{"type":"json_schema","json_schema":{"name":"x"}}`,
			"response_format.json_schema.schema", runnerapi.CodeMissingField, "needs a schema"},
		{"unknown type", `{"type":"yaml"}`, "response_format.type", runnerapi.CodeInvalidValue, "text, json_object or json_schema"},
		{"unknown field", `{"type":"json_schema","json_schema":{"name":"x","schema":{},"strictly":true}}`,
			"strictly", runnerapi.CodeUnknownParameter, "strictly"},
	} {
		// Raw HTTP: the SDK's params drop a format they do not know.
		var e struct {
			Error struct {
				Message, Code string
				Param         *string
			}
		}
		code := r.postJSON("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":`+tc.format+`}`, &e)
		if code != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != tc.param ||
			e.Error.Code != tc.code || !strings.Contains(e.Error.Message, tc.message) {
			t.Errorf("%s: got %d %+v, want 400 %s on %s saying %q", tc.name, code, e.Error, tc.code, tc.param, tc.message)
		}
	}
}

// hermesTemplate and mistralTemplate teach their formats' call syntax, as Qwen's and
// Mistral's templates do.
const hermesTemplate = `{% if tools %}<|im_start|>system
You may call functions. <tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>
Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}
{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}
</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`

const mistralTemplate = `{% for m in messages %}{% if m.role == 'user' %}{% if loop.last and tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ m.content }}[/INST]` +
	`{% elif m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | map(attribute='function') | list | tojson }}</s>` +
	`{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]{% else %}{{ m.content }}</s>{% endif %}{% endfor %}`

// withTemplate is the real Llama 3 vocabulary with another chat template.
func withTemplate(tmpl string) func() (ggufsynth.Spec, error) {
	return func() (ggufsynth.Spec, error) {
		s, err := testassets.Llama31Spec()
		s.ChatTemplate = tmpl
		return s, err
	}
}

// TestForcedToolCalls: tool_choice "required" and a named function make even a
// random-weight model return a valid call, in each format's own syntax, parsed into
// OpenAI tool_calls whole and streamed; the call then round-trips as history.
func TestForcedToolCalls(t *testing.T) {
	llama31, err := testassets.Find("llama3-instruct", "tool_calls")
	if err != nil {
		t.Fatal(err)
	}
	models := []struct {
		name, format string
		spec         func() (ggufsynth.Spec, error)
		source       string
	}{
		{"llama31", "llama3-json", testassets.Llama31Spec, llama31.Source},
		{"llama3-vocab-hermes", "hermes", withTemplate(hermesTemplate), hermesTemplate},
		{"llama3-vocab-mistral", "mistral", withTemplate(mistralTemplate), mistralTemplate},
		{"llama3-vocab-deepseek", "deepseek-v3.1", withTemplate(deepseekTemplate), deepseekTemplate},
		{"llama3-vocab-kimi", "kimi-k2", withTemplate(kimiTemplate), kimiTemplate},
		{"llama3-vocab-qwen3-coder", "qwen3-coder", withTemplate(qwen3CoderTemplate), qwen3CoderTemplate},
	}
	params := map[string]*jsonschema.Schema{}
	for _, tool := range []string{boundedWeatherTool, timeTool} {
		var d struct {
			Function struct {
				Name       string          `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		if err := json.Unmarshal([]byte(tool), &d); err != nil {
			t.Fatal(err)
		}
		params[d.Function.Name] = compileSchema(t, string(d.Function.Parameters))
	}
	for _, m := range models {
		t.Run(m.name, func(t *testing.T) {
			r := startReady(t, specModel(t, m.name, m.spec))
			if st := r.status(); st.Chat == nil || st.Chat.ToolFormat != m.format {
				t.Fatalf("status chat %+v, want tool format %s", st.Chat, m.format)
			}
			client := r.openAI()
			ctx := context.Background()
			body := func(choice string, seed int, parallel bool) string {
				return fmt.Sprintf(`{"model":"m","max_tokens":200,"seed":%d,"tool_choice":%s,"parallel_tool_calls":%v,
					"tools":[%s,%s],"messages":[{"role":"user","content":"Weather in Paris?"}]}`, seed, choice, parallel, boundedWeatherTool, timeTool)
			}
			check := func(what string, c openai.ChatCompletionMessage, fr string, name string, max int) {
				t.Helper()
				if fr != "tool_calls" || len(c.ToolCalls) == 0 || len(c.ToolCalls) > max {
					t.Fatalf("%s: finish_reason %q, %d calls (content %q), want 1..%d calls", what, fr, len(c.ToolCalls), c.Content, max)
				}
				for _, call := range c.ToolCalls {
					s := params[call.Function.Name]
					switch {
					case s == nil || name != "" && call.Function.Name != name:
						t.Errorf("%s: call to %q", what, call.Function.Name)
					case !strings.HasPrefix(call.ID, "call_"):
						t.Errorf("%s: call id %q", what, call.ID)
					default:
						if err := validate(t, s, call.Function.Arguments); err != nil {
							t.Errorf("%s: arguments %q: %v", what, call.Function.Arguments, err)
						}
					}
				}
			}
			for seed := range 5 {
				c, err := client.Chat.Completions.New(ctx, chatParams(t, body(`"required"`, seed, false)))
				if err != nil {
					t.Fatal(err)
				}
				check(fmt.Sprintf("required, seed %d", seed), c.Choices[0].Message, c.Choices[0].FinishReason, "", 1)
			}
			// Built with the SDK's types: its JSON decoding of params drops the name.
			named := chatParams(t, body(`"auto"`, 7, false))
			named.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfFunctionToolChoice: &openai.ChatCompletionNamedToolChoiceParam{
				Function: openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_time"}}}
			c, err := client.Chat.Completions.New(ctx, named)
			if err != nil {
				apiFatal(t, err)
			}
			check("named", c.Choices[0].Message, c.Choices[0].FinishReason, "get_time", 1)

			stream := client.Chat.Completions.NewStreaming(ctx, chatParams(t, body(`"required"`, 3, false)))
			acc := openai.ChatCompletionAccumulator{}
			for stream.Next() {
				acc.AddChunk(stream.Current())
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			check("streamed", acc.Choices[0].Message, acc.Choices[0].FinishReason, "", 1)

			// Strict tools under "auto": the lazy grammar's trigger for this format
			// compiles, and the text runs free until a call opens.
			strict := strings.ReplaceAll(body(`"auto"`, 2, true), `"function":{`, `"function":{"strict":true,`)
			var lazy runnerapi.ChatCompletion
			if code := r.postJSON("/v1/chat/completions", strict, &lazy); code != http.StatusOK || len(lazy.Choices) != 1 {
				t.Fatalf("strict tools under auto: %d %+v", code, lazy)
			}
			for _, call := range lazy.Choices[0].Message.ToolCalls {
				if s := params[call.Function.Name]; s == nil || validate(t, s, call.Function.Arguments) != nil {
					t.Errorf("strict tools under auto: call %s(%s)", call.Function.Name, call.Function.Arguments)
				}
			}

			// The call and its result go back as history, rendered by the model's
			// template: the runner counts exactly the tokens of that rendering.
			call := acc.Choices[0].Message.ToolCalls[0]
			history := fmt.Sprintf(`{"model":"m","max_tokens":16,"seed":1,"tools":[%s,%s],"messages":[
				{"role":"user","content":"Weather in Paris?"},
				{"role":"assistant","content":null,"tool_calls":[{"id":%q,"type":"function","function":{"name":%q,"arguments":%q}}]},
				{"role":"tool","tool_call_id":%q,"content":"{\"temperature\": 21}"}]}`,
				boundedWeatherTool, timeTool, call.ID, call.Function.Name, call.Function.Arguments, call.ID)
			// Raw HTTP: the SDK re-encodes the tools' schemas (sorting their keys), and
			// the count is compared with /tokenize of the very same body.
			var answer runnerapi.ChatCompletion
			if code := r.postJSON("/v1/chat/completions", history, &answer); code != http.StatusOK {
				t.Fatalf("the answer to the tool result: %d", code)
			}
			var req runnerapi.ChatRequest
			if e := runnerapi.DecodeJSON([]byte(history), &req); e != nil {
				t.Fatal(e)
			}
			tmpl, err := chat.NewTemplate(m.source, "<|begin_of_text|>", "<|eot_id|>")
			if err != nil {
				t.Fatal(err)
			}
			prompt, e := tmpl.Render(chat.InputOf(&req), true)
			if e != nil {
				t.Fatal(e)
			}
			var args map[string]any
			_ = json.Unmarshal([]byte(call.Function.Arguments), &args)
			for _, want := range []string{call.Function.Name, fmt.Sprint(args[map[string]string{"get_weather": "unit", "get_time": "zone"}[call.Function.Name]]), "temperature"} {
				if !strings.Contains(prompt, want) {
					t.Errorf("the rendered history lacks %q:\n%s", want, prompt)
				}
			}
			var tok runnerapi.TokenizeResponse
			if code := r.postJSON("/tokenize", map[string]any{"chat": json.RawMessage(history)}, &tok); code != http.StatusOK {
				t.Fatalf("tokenize: %d", code)
			}
			if answer.Usage.PromptTokens != tok.Count || tok.Count < len(prompt)/8 {
				t.Errorf("the answer counts %d prompt tokens, /tokenize %d, for a rendering of %d bytes", answer.Usage.PromptTokens, tok.Count, len(prompt))
			}
		})
	}
}
