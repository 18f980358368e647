package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// specModel synthesizes a model from a spec once per test binary.
func specModel(t testing.TB, key string, spec func() (ggufsynth.Spec, error)) string {
	t.Helper()
	modelsMu.Lock()
	defer modelsMu.Unlock()
	if p, ok := modelsByName[key]; ok {
		return p
	}
	s, err := spec()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(modelDir, key+".gguf")
	if err := ggufsynth.Write(p, s); err != nil {
		t.Fatal(err)
	}
	modelsByName[key] = p
	return p
}

const weatherTool = `{"type":"function","function":{"name":"get_weather","description":"Current weather for a city",
	"parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["c","f"]}},"required":["city"]}}}`

// A conversation with a tool call and its result in the history.
const toolConversation = `{"model":"llama31","max_tokens":8,"temperature":0,"tools":[` + weatherTool + `],"messages":[
	{"role":"system","content":"You are a weather assistant."},
	{"role":"user","content":"What's the weather in Paris?"},
	{"role":"assistant","content":null,"tool_calls":[{"id":"call_abc","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"unit\":\"c\"}"}}]},
	{"role":"tool","tool_call_id":"call_abc","content":"{\"temperature\": 21, \"sky\": \"clear\"}"}]}`

// TestChatTemplateRealVocabulary runs a model with the real Llama 3 vocabulary and the
// real Llama 3.1 template: the runner renders with the model's own template (tools,
// tool calls and tool results included), tokenizes the special tokens as special, and
// serves the official client.
func TestChatTemplateRealVocabulary(t *testing.T) {
	r := startReady(t, specModel(t, "llama31", testassets.Llama31Spec))
	st := r.status()
	if st.Chat == nil || st.Chat.Renderer != runnerapi.RendererJinja || st.Chat.ToolFormat != "llama3-json" || !st.Chat.Tools {
		t.Fatalf("status chat %+v, want the model's Jinja template with llama3-json tool calls", st.Chat)
	}

	// The prompt the runner counts is the template's rendering, tokenized with the
	// special tokens as single tokens and one BOS.
	var tok runnerapi.TokenizeResponse
	if code := r.postJSON("/tokenize", map[string]any{"chat": json.RawMessage(toolConversation)}, &tok); code != http.StatusOK {
		t.Fatalf("tokenize: %d", code)
	}
	src, err := testassets.Find("llama3-instruct", "tool_calls")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chat.NewTemplate(src.Source, "<|begin_of_text|>", "<|eot_id|>")
	if err != nil {
		t.Fatal(err)
	}
	var req runnerapi.ChatRequest
	if e := runnerapi.DecodeJSON([]byte(toolConversation), &req); e != nil {
		t.Fatal(e)
	}
	prompt, e := tmpl.Render(chat.InputOf(&req), true)
	if e != nil {
		t.Fatal(e)
	}
	count := func(id int32) int {
		n := 0
		for _, x := range tok.Tokens {
			if x == id {
				n++
			}
		}
		return n
	}
	if tok.Tokens[0] != testassets.Llama3BeginOfText || count(testassets.Llama3BeginOfText) != 1 {
		t.Errorf("prompt has %d BOS tokens (first token %d), want exactly one, first", count(testassets.Llama3BeginOfText), tok.Tokens[0])
	}
	for text, id := range map[string]int32{"<|start_header_id|>": testassets.Llama3StartHeader,
		"<|end_header_id|>": testassets.Llama3EndHeader, "<|eot_id|>": testassets.Llama3EndOfTurn} {
		if want := strings.Count(prompt, text); want < 3 || count(id) != want {
			t.Errorf("%s: %d tokens, the rendered prompt has %d", text, count(id), want)
		}
	}
	// Ordinary text is BPE-tokenized: far fewer tokens than bytes.
	if n := len(tok.Tokens); n > len(prompt)/2 {
		t.Errorf("%d tokens for %d bytes: the text was not BPE-merged", n, len(prompt))
	}

	client := openai.NewClient(option.WithBaseURL(r.base+"/v1/"), option.WithAPIKey("unused"),
		option.WithHTTPClient(r.client), option.WithMaxRetries(0))
	ctx := context.Background()
	var params openai.ChatCompletionNewParams
	if err := json.Unmarshal([]byte(toolConversation), &params); err != nil {
		t.Fatal(err)
	}
	c, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if c.Usage.PromptTokens != int64(len(tok.Tokens)) {
		t.Errorf("prompt_tokens %d, /tokenize counted %d", c.Usage.PromptTokens, len(tok.Tokens))
	}
	if fr := c.Choices[0].FinishReason; !slices.Contains([]string{"stop", "length", "tool_calls"}, fr) {
		t.Errorf("finish_reason %q", fr)
	}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.Choices[0].Message.Content != c.Choices[0].Message.Content ||
		len(acc.Choices[0].Message.ToolCalls) != len(c.Choices[0].Message.ToolCalls) {
		t.Errorf("streamed %+v, non-streamed %+v", acc.Choices[0].Message, c.Choices[0].Message)
	}

	// Fields that are not served, or malformed, are refused by name, through the
	// official client.
	for _, tc := range []struct {
		opt   option.RequestOption
		param string
		code  string
	}{
		{option.WithJSONSet("frobnicate", true), "frobnicate", runnerapi.CodeUnknownParameter},
		{option.WithJSONSet("prediction", map[string]any{"type": "file", "content": "x"}), "prediction", runnerapi.CodeInvalidValue},
		{option.WithJSONSet("audio", map[string]any{"voice": "alloy", "format": "mp3"}), "audio", runnerapi.CodeUnsupportedParameter},
		{option.WithJSONSet("n", 2), "n", runnerapi.CodeInvalidValue}, // one slot
		{option.WithJSONSet("tool_choice", map[string]any{"type": "function", "function": map[string]any{"name": "nope"}}), "tool_choice", runnerapi.CodeInvalidValue},
	} {
		_, err := client.Chat.Completions.New(ctx, params, tc.opt)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != tc.param || apiErr.Code != tc.code {
			t.Errorf("%s: got %v, want 400 %s naming it", tc.param, err, tc.code)
		}
	}
	// A conversation the template refuses is the client's 400, not a 500.
	var two openai.ChatCompletionNewParams
	_ = json.Unmarshal([]byte(toolConversation), &two)
	two.Messages = append(two.Messages, two.Messages[2])
	two.Messages[len(two.Messages)-1].OfAssistant.ToolCalls = append(two.Messages[len(two.Messages)-1].OfAssistant.ToolCalls,
		two.Messages[2].OfAssistant.ToolCalls...)
	_, err = client.Chat.Completions.New(ctx, two)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Code != runnerapi.CodeTemplateError ||
		!strings.Contains(apiErr.Message, "only supports single tool-calls") {
		t.Errorf("two tool calls for a single-call template: %v, want 400 %s with the template's message", err, runnerapi.CodeTemplateError)
	}
}

// thinkingTemplate opens a <think> block in the generation prompt when the request
// asks for it through chat_template_kwargs.
const thinkingTemplate = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
	"{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}"

// TestChatReasoning: chat_template_kwargs reach the template, and output inside a
// <think> block comes back as reasoning_content, whole and streamed.
func TestChatReasoning(t *testing.T) {
	r := startReady(t, specModel(t, "tiny-thinking", func() (ggufsynth.Spec, error) {
		s := ggufsynth.Tiny()
		s.ChatTemplate = thinkingTemplate
		return s, nil
	}))
	if st := r.status(); st.Chat == nil || !st.Chat.Thinking {
		t.Fatalf("status chat %+v, want thinking", st.Chat)
	}
	body := func(thinking, stream bool) map[string]any {
		b := chatBody("Think about it", 12, stream)
		b["chat_template_kwargs"] = map[string]any{"enable_thinking": thinking}
		return b
	}
	var plain, thought runnerapi.ChatCompletion
	if code := r.postJSON("/v1/chat/completions", body(false, false), &plain); code != http.StatusOK {
		t.Fatalf("chat: %d", code)
	}
	if code := r.postJSON("/v1/chat/completions", body(true, false), &thought); code != http.StatusOK {
		t.Fatalf("chat: %d", code)
	}
	if m := plain.Choices[0].Message; m.Text() == "" || m.ReasoningContent != "" {
		t.Errorf("without thinking: content %q reasoning %q, want content only", m.Text(), m.ReasoningContent)
	}
	m := thought.Choices[0].Message
	if m.Text() != "" || m.ReasoningContent == "" {
		t.Fatalf("with thinking: content %q reasoning %q, want reasoning only", m.Text(), m.ReasoningContent)
	}
	if thought.Usage.PromptTokens <= plain.Usage.PromptTokens {
		t.Errorf("prompt with <think> has %d tokens, without %d: the kwarg did not reach the template",
			thought.Usage.PromptTokens, plain.Usage.PromptTokens)
	}
	resp, err := r.post(context.Background(), "/v1/chat/completions", body(true, true))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	reasoning, content := readThought(t, resp.Body)
	if reasoning != m.ReasoningContent || content != "" {
		t.Errorf("streamed reasoning %q content %q; whole reasoning %q", reasoning, content, m.ReasoningContent)
	}
}

// readThought reads a whole chat stream of one choice: its reasoning and its content.
func readThought(t *testing.T, body io.Reader) (reasoning, content string) {
	t.Helper()
	var rs, cs strings.Builder
	_, done, err := readSSE(t, body, func(ev sseEvent) bool {
		var ch runnerapi.ChatCompletionChunk
		if json.Unmarshal([]byte(ev.data), &ch) == nil && len(ch.Choices) == 1 {
			if d := ch.Choices[0].Delta; d.ReasoningContent != nil {
				rs.WriteString(*d.ReasoningContent)
			} else if d.Content != nil {
				cs.WriteString(*d.Content)
			}
		}
		return true
	})
	if err != nil || !done {
		t.Fatalf("stream: done %v, %v", done, err)
	}
	return rs.String(), cs.String()
}
