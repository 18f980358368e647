package e2e

import (
	"context"
	"testing"

	"github.com/openai/openai-go/v3"
)

// strictWeatherParams is a schema the trained model does not write by itself: it
// calls get_weather with the city it was asked about, and knows no "days".
const strictWeatherParams = `{"type":"object","properties":{"city":{"type":"string","enum":["Lisbon","Porto","Faro"]},
	"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"],"additionalProperties":false}`

func strictWeatherTool(strict bool) string {
	s := "false"
	if strict {
		s = "true"
	}
	return `{"type":"function","function":{"name":"get_weather","description":"Current weather for a city","strict":` + s +
		`,"parameters":` + strictWeatherParams + `}}`
}

// TestStrictToolsUnderAuto: a strict tool under tool_choice "auto" (what the agent
// SDKs send for every tool) holds the call's arguments to the schema once the model
// opens a call, through the real runner and the trained model, greedy, and leaves a
// plain answer free. The same request without strict shows the schema is one the
// model breaks by itself.
func TestStrictToolsUnderAuto(t *testing.T) {
	r := startTrained(t)
	schema := compileSchema(t, strictWeatherParams)
	ask := func(strict bool, question string) string {
		return `{"model":"m","max_tokens":48,"temperature":0,"tool_choice":"auto","tools":[` + strictWeatherTool(strict) +
			`],"messages":[{"role":"user","content":"` + question + `"}]}`
	}
	const weather = "What's the weather in Paris?"

	free := r.chatChoice(ask(false, weather))
	if len(free.Message.ToolCalls) != 1 {
		t.Fatalf("without strict: finish %s, message %+v, want one call", free.FinishReason, free.Message)
	}
	if args := free.Message.ToolCalls[0].Function.Arguments; validate(t, schema, args) == nil {
		t.Fatalf("without strict the model already writes arguments that validate (%s): the test proves nothing", args)
	}

	// Through the official client, as an SDK sends it: strict set on the function.
	client, ctx := r.openAI(), context.Background()
	params := func(question string) openai.ChatCompletionNewParams {
		p := chatParams(t, ask(false, question))
		p.Tools[0].OfFunction.Function.Strict = openai.Bool(true)
		p.Temperature = openai.Float(0)
		return p
	}
	c, err := client.Chat.Completions.New(ctx, params(weather))
	if err != nil {
		apiFatal(t, err)
	}
	stream := client.Chat.Completions.NewStreaming(ctx, params(weather))
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		apiFatal(t, err)
	}
	for _, got := range []struct {
		what string
		c    openai.ChatCompletionChoice
	}{{"whole", c.Choices[0]}, {"streamed", acc.Choices[0]}} {
		calls := got.c.Message.ToolCalls
		if got.c.FinishReason != "tool_calls" || len(calls) != 1 {
			t.Fatalf("strict, %s: finish %s, content %q, %d calls, want one call", got.what, got.c.FinishReason, got.c.Message.Content, len(calls))
		}
		if err := validate(t, schema, calls[0].Function.Arguments); calls[0].Function.Name != "get_weather" || err != nil {
			t.Errorf("strict, %s: called %s(%s): %v", got.what, calls[0].Function.Name, calls[0].Function.Arguments, err)
		}
	}

	// A question the model answers in words (it calls a tool on a greeting).
	answer, err := client.Chat.Completions.New(ctx, params("What is the largest planet in our solar system?"))
	if err != nil {
		apiFatal(t, err)
	}
	if m := answer.Choices[0].Message; answer.Choices[0].FinishReason != "stop" || len(m.ToolCalls) != 0 || !sentence.MatchString(m.Content) {
		t.Errorf("a question with a strict tool: %q (finish %s, %d calls), want a sentence that ends the turn",
			m.Content, answer.Choices[0].FinishReason, len(m.ToolCalls))
	}
}
