package translate

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// pngData is a base64 payload the tests send as an image (the translation checks
// only that it is base64; the runner decodes the picture).
const pngData = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAfbLI3wAAAABJRU5ErkJggg=="

// chatMessages is the messages of the chat request f received, as JSON.
func chatMessages(t *testing.T, f *fakeChat) []json.RawMessage {
	t.Helper()
	b, _ := json.Marshal(f.got["messages"])
	var msgs []json.RawMessage
	if err := json.Unmarshal(b, &msgs); err != nil {
		t.Fatalf("messages %s: %v", b, err)
	}
	return msgs
}

func TestAnthropicImageBlocks(t *testing.T) {
	f := &fakeChat{whole: toolWhole}
	w := post(t, Anthropic(f), "/v1/messages", `{"model":"m","max_tokens":5,"system":"S","messages":[
		{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello"},
		{"role":"user","content":[{"type":"text","text":"What is in "},
		{"type":"image","source":{"type":"base64","media_type":"image/png","data":"`+pngData+`"},"cache_control":{"type":"ephemeral"}},
		{"type":"text","text":" and "},{"type":"image","source":{"type":"url","url":"https://images.example/cat.jpg"}}]}]}`)
	if w.Code != http.StatusOK {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	msgs := chatMessages(t, f)
	if len(msgs) != 4 {
		t.Fatalf("messages %s", msgs)
	}
	want := `{"content":[{"text":"What is in ","type":"text"},{"image_url":{"url":"data:image/png;base64,` + pngData + `"},"type":"image_url"},` +
		`{"text":" and ","type":"text"},{"image_url":{"url":"https://images.example/cat.jpg"},"type":"image_url"}],"role":"user"}`
	if diff := cmp.Diff(want, compact(t, msgs[3])); diff != "" {
		t.Errorf("the image message (-want +got):\n%s", diff)
	}
	// The messages before it (the system prompt put first) keep their text content.
	for i, want := range []string{`{"content":"S","role":"system"}`, `{"content":"Hi","role":"user"}`, `{"content":"Hello","role":"assistant"}`} {
		if got := compact(t, msgs[i]); got != want {
			t.Errorf("messages[%d] = %s, want %s", i, got, want)
		}
	}
}

func compact(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func TestAnthropicImageErrors(t *testing.T) {
	user := func(block string) string {
		return `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[` + block + `]}]}`
	}
	for _, tc := range []struct{ name, body, param, says string }{
		{"no source", user(`{"type":"image"}`), "messages[0].content[0].source", "needs a source"},
		{"media type", user(`{"type":"image","source":{"type":"base64","media_type":"image/tiff","data":"` + pngData + `"}}`),
			"messages[0].content[0].source.media_type", "image/jpeg"},
		{"no data", user(`{"type":"image","source":{"type":"base64","media_type":"image/png","data":""}}`),
			"messages[0].content[0].source.data", "required"},
		{"bad base64", user(`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"not base64!"}}`),
			"messages[0].content[0].source.data", "base64"},
		{"file source", user(`{"type":"image","source":{"type":"file","file_id":"file_1"}}`),
			"messages[0].content[0].source.type", "Files API"},
		{"unknown source type", user(`{"type":"image","source":{"type":"pixels"}}`), "messages[0].content[0].source.type", "base64 or url"},
		{"unknown source field", user(`{"type":"image","source":{"type":"url","url":"https://x/y.png","size":3}}`),
			"messages[0].content[0].source.size", "size"},
		{"ftp url", user(`{"type":"image","source":{"type":"url","url":"ftp://x/y.png"}}`), "messages[0].content[0].source.url", "https://"},
		{"data uri of text", user(`{"type":"image","source":{"type":"url","url":"data:text/plain;base64,eA=="}}`),
			"messages[0].content[0].source.url", "data:image/"},
		{"assistant image", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]}]}`,
			"messages[1].content[0].type", "images in user messages"},
		{"image in a tool result", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]}]}]}`,
			"messages[0].content[0].content[0].type", "only text"},
		{"document", user(`{"type":"document","source":{"type":"url","url":"https://x/y.pdf"}}`), "messages[0].content[0].type", "document"},
	} {
		f := &fakeChat{whole: toolWhole}
		w := post(t, Anthropic(f), "/v1/messages", tc.body)
		var e struct {
			Error struct{ Type, Message string }
		}
		_ = json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != http.StatusBadRequest || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, tc.param) ||
			!strings.Contains(e.Error.Message, tc.says) {
			t.Errorf("%s: %d %s, want a 400 naming %s and saying %q", tc.name, w.Code, w.Body, tc.param, tc.says)
		}
		if f.got != nil {
			t.Errorf("%s: the chat handler was called", tc.name)
		}
	}
}

func TestResponsesInputImage(t *testing.T) {
	f := &fakeChat{whole: toolWhole}
	w := post(t, Responses(f), "/v1/responses", `{"model":"m","instructions":"S","input":[
		{"role":"user","content":[{"type":"input_text","text":"Compare"},{"type":"input_image","image_url":"data:image/png;base64,`+pngData+`","detail":"low"},
		{"type":"input_image","image_url":"https://images.example/b.png","detail":"auto"}]}]}`)
	if w.Code != http.StatusOK {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	msgs := chatMessages(t, f)
	want := []string{`{"content":"S","role":"system"}`, `{"content":[{"text":"Compare","type":"text"},` +
		`{"image_url":{"detail":"low","url":"data:image/png;base64,` + pngData + `"},"type":"image_url"},` +
		`{"image_url":{"detail":"auto","url":"https://images.example/b.png"},"type":"image_url"}],"role":"user"}`}
	var got []string
	for _, m := range msgs {
		got = append(got, compact(t, m))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("messages (-want +got):\n%s", diff)
	}
}

func TestResponsesInputImageErrors(t *testing.T) {
	for _, tc := range []struct{ name, body, param string }{
		{"file_id", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","file_id":"file_1"}]}]}`, "input[0].content[0].file_id"},
		{"no image_url", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image"}]}]}`, "input[0].content[0].image_url"},
		{"not a url", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`, "input[0].content[0].image_url"},
		{"system image", `{"model":"m","input":[{"role":"system","content":[{"type":"input_image","image_url":"https://x/y.png"}]}]}`, "input[0].content[0].type"},
		{"assistant image", `{"model":"m","input":[{"role":"assistant","content":[{"type":"input_image","image_url":"https://x/y.png"}]}]}`, "input[0].content[0].type"},
		{"tool output image", `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_image","image_url":"https://x/y.png"}]}]}`,
			"input[0].output[0].type"},
		{"input_file", `{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}`, "input[0].content[0].type"},
	} {
		f := &fakeChat{whole: toolWhole}
		w := post(t, Responses(f), "/v1/responses", tc.body)
		var e struct{ Error struct{ Param *string } }
		_ = json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != tc.param {
			t.Errorf("%s: %d %s, want a 400 naming %s", tc.name, w.Code, w.Body, tc.param)
		}
		if f.got != nil {
			t.Errorf("%s: the chat handler was called", tc.name)
		}
	}
}

// TestResponsesInputImageFromTheOfficialClient: the official OpenAI Go client's
// input_image reaches the chat handler as an image_url part.
func TestResponsesInputImageFromTheOfficialClient(t *testing.T) {
	f := &fakeChat{whole: toolWhole}
	srv := httptest.NewServer(Responses(f))
	defer srv.Close()
	c := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	uri := "data:image/png;base64," + pngData
	_, err := c.Responses.New(context.Background(), responses.ResponseNewParams{Model: "m", Input: responses.ResponseNewParamsInputUnion{
		OfInputItemList: responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage(responses.ResponseInputMessageContentListParam{
			responses.ResponseInputContentParamOfInputText("What is this?"),
			{OfInputImage: &responses.ResponseInputImageParam{ImageURL: openai.String(uri), Detail: responses.ResponseInputImageDetailHigh}},
		}, responses.EasyInputMessageRoleUser)}}})
	if err != nil {
		t.Fatal(err)
	}
	msgs := chatMessages(t, f)
	want := `{"content":[{"text":"What is this?","type":"text"},{"image_url":{"detail":"high","url":"` + uri + `"},"type":"image_url"}],"role":"user"}`
	if len(msgs) != 1 || compact(t, msgs[0]) != want {
		t.Errorf("messages %s, want [%s]", msgs, want)
	}
}

// TestCountTokensSendsTheImage: count_tokens counts the prompt with its images.
func TestCountTokensSendsTheImage(t *testing.T) {
	var got map[string]any
	count := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&got)
		_, _ = w.Write([]byte(`{"prompt_tokens":300}`))
	})
	w := post(t, AnthropicCountTokens(count), "/v1/messages/count_tokens", `{"model":"m","messages":[{"role":"user","content":[
		{"type":"image","source":{"type":"base64","media_type":"image/png","data":"`+pngData+`"}}]}]}`)
	b, _ := json.Marshal(got["messages"])
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"input_tokens":300`) ||
		!strings.Contains(string(b), `"image_url":{"url":"data:image/png;base64,`) {
		t.Errorf("%d %s; the count saw %s", w.Code, w.Body, b)
	}
}
