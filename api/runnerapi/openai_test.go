package runnerapi

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestMessageContentParts(t *testing.T) {
	cases := []struct {
		name, body string
		content    string
		images     []Image
		err        string
	}{
		{name: "string", body: `{"role":"user","content":"hi"}`, content: "hi"},
		{name: "null", body: `{"role":"user","content":null}`},
		{name: "absent", body: `{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}`},
		{name: "text parts", body: `{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}`, content: "ab"},
		{name: "image between texts",
			body:    `{"role":"user","content":[{"type":"text","text":"look: "},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"low"}},{"type":"text","text":" what?"}]}`,
			content: "look:  what?", images: []Image{{URL: "data:image/png;base64,AAAA", Detail: "low", At: 6}}},
		{name: "image first", body: `{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}},{"type":"text","text":"q"}]}`,
			content: "q", images: []Image{{URL: "https://x/y.png", At: 0}}},
		{name: "audio part", body: `{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}`, err: `"input_audio" is not supported`},
		{name: "image part without url object", body: `{"role":"user","content":[{"type":"image_url"}]}`, err: `"image_url" is not supported`},
		{name: "unknown field", body: `{"role":"user","content":"hi","colour":1}`, err: `unknown field "colour"`},
		{name: "content a number", body: `{"role":"user","content":1}`, err: "content must be a string"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var m Message
			err := json.Unmarshal([]byte(tc.body), &m)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(m.Content) != tc.content || len(m.Images) != len(tc.images) {
				t.Fatalf("got %q %+v, want %q %+v", m.Content, m.Images, tc.content, tc.images)
			}
			for i := range tc.images {
				if m.Images[i] != tc.images[i] {
					t.Fatalf("image %d: %+v, want %+v", i, m.Images[i], tc.images[i])
				}
			}
		})
	}
}

// A message with images goes over the wire as a content array and comes back the
// same; one without stays a string.
func TestMessageImagesRoundTrip(t *testing.T) {
	in := Message{Role: "user", Content: "before after", Images: []Image{
		{URL: "data:image/png;base64,AA", At: 0}, {URL: "data:image/jpeg;base64,BB", Detail: "high", At: 7}, {URL: "data:image/gif;base64,CC", At: 12}}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"content":[{"type":"image_url"`) {
		t.Fatalf("not a content array: %s", b)
	}
	var out Message
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.Content != in.Content || len(out.Images) != 3 {
		t.Fatalf("round trip: %+v from %s", out, b)
	}
	for i := range in.Images {
		if out.Images[i] != in.Images[i] {
			t.Fatalf("image %d: %+v, want %+v", i, out.Images[i], in.Images[i])
		}
	}
	b, err = json.Marshal(Message{Role: "user", Content: "plain"})
	if err != nil || string(b) != `{"role":"user","content":"plain"}` {
		t.Fatalf("plain message: %s %v", b, err)
	}
}

// DecodeJSON still names an unknown field inside a message.
func TestDecodeChatUnknownMessageField(t *testing.T) {
	var r ChatRequest
	e := DecodeJSON([]byte(`{"model":"m","messages":[{"role":"user","content":"hi","colour":1}]}`), &r)
	if e == nil || e.Code != CodeUnknownParameter || e.Param != "colour" {
		t.Fatalf("got %+v, want unknown_parameter colour", e)
	}
}
