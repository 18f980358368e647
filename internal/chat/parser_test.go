package chat

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

type call struct{ Name, Args string }

type answer struct {
	Content, Reasoning string
	Calls              []call
}

func collect(p *Parser, chunks []string) answer {
	var a answer
	add := func(d Delta) {
		a.Content += d.Content
		a.Reasoning += d.Reasoning
		for _, c := range d.ToolCalls {
			if *c.Index != len(a.Calls) {
				panic("tool call index out of order")
			}
			a.Calls = append(a.Calls, call{c.Function.Name, c.Function.Arguments})
		}
	}
	for _, c := range chunks {
		add(p.Push(c))
	}
	add(p.Finish())
	return a
}

func TestParser(t *testing.T) {
	weather := call{"get_weather", `{"city":"Paris","unit":"c"}`}
	time := call{"get_time", `{"tz":"UTC"}`}
	for _, tc := range []struct {
		name   string
		opts   Options
		output string
		want   answer
	}{
		{"hermes call", Options{Format: FormatHermes, Tools: true, Parallel: true},
			"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>",
			answer{Calls: []call{weather}}},
		{"hermes content then two calls", Options{Format: FormatHermes, Tools: true, Parallel: true},
			"Let me check.\n<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"unit\":\"c\"}}</tool_call>\n<tool_call>{\"name\":\"get_time\",\"arguments\":\"{\\\"tz\\\": \\\"UTC\\\"}\"}</tool_call>",
			answer{Content: "Let me check.\n\n", Calls: []call{weather, time}}},
		{"hermes parallel off keeps the first", Options{Format: FormatHermes, Tools: true},
			"<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"unit\":\"c\"}}</tool_call><tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>",
			answer{Content: "<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>", Calls: []call{weather}}},
		{"hermes malformed is content", Options{Format: FormatHermes, Tools: true, Parallel: true},
			"<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": </tool_call> done",
			answer{Content: "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": </tool_call> done"}},
		{"hermes unclosed at the end", Options{Format: FormatHermes, Tools: true, Parallel: true},
			"<tool_call>{\"name\":\"get_time\",\"arguments\":{\"tz\":\"UTC\"}}",
			answer{Calls: []call{time}}},
		{"hermes without tools is content", Options{Format: FormatHermes},
			"<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>",
			answer{Content: "<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>"}},
		{"llama3 json", Options{Format: FormatLlama3, Tools: true, Parallel: true},
			" {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"c\"}}",
			answer{Calls: []call{weather}}},
		{"llama3 python tag and two calls", Options{Format: FormatLlama3, Tools: true, Parallel: true},
			"<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"c\"}}; {\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}",
			answer{Calls: []call{weather, time}}},
		{"llama3 prose", Options{Format: FormatLlama3, Tools: true, Parallel: true},
			"It is sunny in {Paris}.", answer{Content: "It is sunny in {Paris}."}},
		{"llama3 json that is not a call", Options{Format: FormatLlama3, Tools: true, Parallel: true},
			"{\"answer\": 42}", answer{Content: "{\"answer\": 42}"}},
		{"mistral array", Options{Format: FormatMistral, Tools: true, Parallel: true},
			"[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}, \"id\": \"abc123def\"}, {\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}]",
			answer{Calls: []call{weather, time}}},
		{"mistral args syntax", Options{Format: FormatMistral, Tools: true, Parallel: true},
			"Sure. [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"unit\": \"c\"}[TOOL_CALLS]get_time[ARGS]{\"tz\":\"UTC\"}",
			answer{Content: "Sure. ", Calls: []call{weather, time}}},
		{"mistral malformed", Options{Format: FormatMistral, Tools: true, Parallel: true},
			"[TOOL_CALLS][{\"name\": ", answer{Content: "[TOOL_CALLS][{\"name\": "}},
		{"think then content", Options{Format: FormatHermes, Thinking: true},
			"<think>\nThe user greets.\n</think>\n\nHello!", answer{Reasoning: "\nThe user greets.\n", Content: "Hello!"}},
		{"prompt opened think", Options{Thinking: true, InReasoning: true},
			"step one</think>Answer", answer{Reasoning: "step one", Content: "Answer"}},
		{"think then call", Options{Format: FormatHermes, Tools: true, Thinking: true, Parallel: true},
			"<think>need weather</think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>",
			answer{Reasoning: "need weather", Calls: []call{weather}}},
		{"unterminated think", Options{Thinking: true}, "<think>still thinking", answer{Reasoning: "still thinking"}},
		{"no thinking support", Options{}, "<think>x</think>y", answer{Content: "<think>x</think>y"}},
		{"marker-like text", Options{Format: FormatHermes, Tools: true, Parallel: true},
			"a <tool_cal b <tool", answer{Content: "a <tool_cal b <tool"}},
		{"harmony", Options{Format: FormatHarmony, Tools: true, Parallel: true},
			"<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\",\"unit\":\"c\"}<|call|>",
			answer{Reasoning: "Need the weather.", Calls: []call{weather}}},
		{"harmony content type after the name", Options{Format: FormatHarmony, Tools: true, Parallel: true},
			"<|channel|>commentary to=functions.get_weather json<|message|>{\"city\":\"Paris\",\"unit\":\"c\"}<|call|>",
			answer{Calls: []call{weather}}},
		{"harmony call without a name is content", Options{Format: FormatHarmony, Tools: true, Parallel: true},
			"<|channel|>commentary to=functions.<|message|>{\"a\":1}<|call|>", answer{Content: "{\"a\":1}"}},
		// A call with a blank name names no tool, in any format: the region is content.
		{"qwen3-coder blank name is content", Options{Format: FormatQwen3Coder, Tools: true, Parallel: true},
			"<tool_call>\n<function= >\n<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>",
			answer{Content: "<tool_call>\n<function= >\n<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>"}},
		{"kimi blank name is content", Options{Format: FormatKimi, Tools: true, Parallel: true},
			"<|tool_calls_section_begin|><|tool_call_begin|>functions. :0<|tool_call_argument_begin|>{\"tz\":\"UTC\"}<|tool_call_end|><|tool_calls_section_end|>",
			answer{Content: "<|tool_calls_section_begin|><|tool_call_begin|>functions. :0<|tool_call_argument_begin|>{\"tz\":\"UTC\"}<|tool_call_end|><|tool_calls_section_end|>"}},
		{"hermes spaced name is trimmed", Options{Format: FormatHermes, Tools: true, Parallel: true},
			"<tool_call>{\"name\": \" get_time \", \"arguments\": {\"tz\": \"UTC\"}}</tool_call>",
			answer{Calls: []call{time}}},
		// The module's parser of this format panics on a lone <escape> value.
		{"function-gemma lone escape is content", Options{Format: FormatFunctionGemma, Tools: true, Parallel: true},
			"<start_function_call>call:get_time{tz:<escape>}<end_function_call>",
			answer{Content: "<start_function_call>call:get_time{tz:<escape>}<end_function_call>"}},
		{"harmony final", Options{Format: FormatHarmony, Tools: true, Parallel: true},
			"<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Hi there<|return|>",
			answer{Reasoning: "Easy.", Content: "Hi there"}},
		// Without tools, the channels still split reasoning from the answer (a JSON
		// answer under response_format is the final channel's message alone).
		{"harmony without tools", Options{Format: FormatHarmony},
			"<|channel|>analysis<|message|>A number.<|end|><|start|>assistant<|channel|>final<|message|>{\"n\":1}",
			answer{Reasoning: "A number.", Content: "{\"n\":1}"}},
		{"harmony reasoning about code", Options{Format: FormatHarmony, Tools: true},
			"<|channel|>analysis<|message|>if a < b and List<T> <|end|><|start|>assistant<|channel|>final<|message|>a<b",
			answer{Reasoning: "if a < b and List<T> ", Content: "a<b"}},
		{"harmony call without tools is content", Options{Format: FormatHarmony},
			"<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\":\"UTC\"}<|call|>",
			answer{Content: "{\"tz\":\"UTC\"}"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			whole := collect(NewParser(tc.opts), []string{tc.output})
			if diff := cmp.Diff(tc.want, whole); diff != "" {
				t.Fatalf("whole output (-want +got):\n%s", diff)
			}
			// Streamed in pieces of every size, the answer is the same.
			for size := 1; size <= 7; size++ {
				var chunks []string
				for i := 0; i < len(tc.output); i += size {
					chunks = append(chunks, tc.output[i:min(len(tc.output), i+size)])
				}
				if diff := cmp.Diff(tc.want, collect(NewParser(tc.opts), chunks)); diff != "" {
					t.Fatalf("streamed in %d-byte pieces (-want +got):\n%s", size, diff)
				}
			}
		})
	}
}

// TestParserCutCall: when the output ends inside a call (max_tokens cut it) after
// complete calls, the complete calls come back as calls and the cut one is dropped
// (the finish reason, length, says the limit cut what followed), whole or streamed.
// A region the model closed, or one with no complete call, stays content.
func TestParserCutCall(t *testing.T) {
	empty := call{"get_weather", `{"city":""}`}
	time := call{"get_time", `{"tz":"UTC"}`}
	parallel := Options{Tools: true, Parallel: true}
	for _, tc := range []struct {
		name   string
		format Format
		output string
		want   answer
	}{
		{"llama3 second call cut in its name", FormatLlama3,
			`{"name": "get_weather", "parameters": {"city": ""}}; {"na`, answer{Calls: []call{empty}}},
		{"llama3 second call cut in its arguments", FormatLlama3,
			`<|python_tag|>{"name": "get_weather", "parameters": {"city": ""}}; {"name": "get_time", "parameters": {"tz": "UTC"}}; {"name": "get_time", "parameters": {"tz": "U`,
			answer{Calls: []call{empty, time}}},
		{"llama3 cut after the separator", FormatLlama3,
			`{"name": "get_weather", "parameters": {"city": ""}}; {`, answer{Calls: []call{empty}}},
		{"llama3 first call cut stays content", FormatLlama3,
			`{"name": "get_weather", "parameters": {"ci`, answer{Content: `{"name": "get_weather", "parameters": {"ci`}},
		{"llama3 prose after a call stays content", FormatLlama3,
			`{"name": "get_weather", "parameters": {"city": ""}}; and then`,
			answer{Content: `{"name": "get_weather", "parameters": {"city": ""}}; and then`}},
		{"mistral array cut", FormatMistral,
			`[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": ""}}, {"name": "get_time", "argu`, answer{Calls: []call{empty}}},
		{"mistral array cut after a comma", FormatMistral,
			`[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": ""}},`, answer{Calls: []call{empty}}},
		{"mistral args cut", FormatMistral,
			`[TOOL_CALLS]get_weather[ARGS]{"city": ""}[TOOL_CALLS]get_time[ARGS]{"tz": "U`, answer{Calls: []call{empty}}},
		{"mistral name cut", FormatMistral,
			`[TOOL_CALLS]get_weather[ARGS]{"city": ""}[TOOL_CALLS]get_ti`, answer{Calls: []call{empty}}},
		{"hermes block cut", FormatHermes,
			"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"\"}}\n{\"name\": \"get_ti",
			answer{Calls: []call{empty}}},
		{"hermes second block cut", FormatHermes,
			"<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"\"}}</tool_call>\n<tool_call>{\"name\": \"get_time\", \"arguments\": {\"tz",
			answer{Content: "\n", Calls: []call{empty}}},
		{"hermes lone cut block stays content", FormatHermes,
			"<tool_call>{\"name\": \"get_time\", \"arguments\": {\"tz", answer{Content: "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"tz"}},
		{"harmony second call cut", FormatHarmony,
			"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"\"}<|call|>" +
				"<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\": \"U",
			answer{Calls: []call{empty}}},
		{"hermes closed block stays content", FormatHermes,
			"<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"\"}}{\"na</tool_call>",
			answer{Content: "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"\"}}{\"na</tool_call>"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := parallel
			o.Format = tc.format
			if d := cmp.Diff(tc.want, collect(NewParser(o), []string{tc.output})); d != "" {
				t.Fatalf("whole output (-want +got):\n%s", d)
			}
			for size := 1; size <= 5; size++ {
				var chunks []string
				for i := 0; i < len(tc.output); i += size {
					chunks = append(chunks, tc.output[i:min(len(tc.output), i+size)])
				}
				if d := cmp.Diff(tc.want, collect(NewParser(o), chunks)); d != "" {
					t.Fatalf("streamed in %d-byte pieces (-want +got):\n%s", size, d)
				}
			}
		})
	}
}

func TestCallIDs(t *testing.T) {
	p := NewParser(Options{Format: FormatHermes, Tools: true, Parallel: true})
	d := p.Push(`<tool_call>{"name":"a","arguments":{}}</tool_call><tool_call>{"name":"b","arguments":{}}</tool_call>`)
	if len(d.ToolCalls) != 2 || d.ToolCalls[0].ID == d.ToolCalls[1].ID || len(d.ToolCalls[0].ID) != 29 {
		t.Fatalf("calls %+v: want two distinct call_ ids", d.ToolCalls)
	}
	if !json.Valid([]byte(d.ToolCalls[0].Function.Arguments)) {
		t.Fatalf("arguments %q are not JSON", d.ToolCalls[0].Function.Arguments)
	}
}

func TestDetectFormat(t *testing.T) {
	for src, want := range map[string]Format{
		"{% for m in messages %}<tool_call>{% endfor %}": FormatHermes,
		"[TOOL_CALLS] {{ x }}":                           FormatMistral,
		"<|start_header_id|>{% if tools %}x{% endif %}":  FormatLlama3,
		"<|channel|>final<|message|>":                    FormatHarmony,
		"{% for message in messages %}<|im_start|>{{ message['content'] }}<|im_end|>{% endfor %}": FormatNone,
	} {
		if got := DetectFormat(src); got != want {
			t.Errorf("DetectFormat(%q) = %v, want %v", src, got, want)
		}
	}
}
