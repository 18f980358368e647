package compat_test

import (
	"flag"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat/compat"
	"github.com/macfleet/macfleet/internal/chat/translate"
)

var update = flag.Bool("update", false, "rewrite docs/api.md's policy tables from the code")

const apiDoc = "../../../docs/api.md"

// section names a policy's table in docs/api.md: it stands between these markers.
func markers(p *compat.Policy) (begin, end string) {
	return "<!-- compat " + p.Endpoint + " -->\n", "<!-- /compat " + p.Endpoint + " -->\n"
}

// TestDocsTables: docs/api.md shows each policy exactly as the code has it (go test
// ./internal/chat/compat -update rewrites them).
func TestDocsTables(t *testing.T) {
	b, err := os.ReadFile(apiDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, p := range compat.Policies() {
		begin, end := markers(p)
		i, j := strings.Index(doc, begin), strings.Index(doc, end)
		if i < 0 || j < i {
			t.Errorf("docs/api.md has no %q … %q section", strings.TrimSpace(begin), strings.TrimSpace(end))
			continue
		}
		got, want := doc[i+len(begin):j], p.Markdown()
		if got == want {
			continue
		}
		if *update {
			doc = doc[:i+len(begin)] + want + doc[j:]
			continue
		}
		t.Errorf("docs/api.md's table of %s differs from internal/chat/compat (run go test ./internal/chat/compat -update):\n%s",
			p.Endpoint, cmp.Diff(want, got))
	}
	if *update && doc != string(b) {
		if err := os.WriteFile(apiDoc, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// jsonFields are the JSON names of a struct's fields, embedded structs' included.
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case f.Anonymous && name == "":
			out = append(out, jsonFields(f.Type)...)
		case name != "" && name != "-":
			out = append(out, name)
		}
	}
	return out
}

// TestPoliciesCoverTheRequests: every field a request type decodes has a row, and
// every top-level row is a field it decodes or one refused whatever its value.
func TestPoliciesCoverTheRequests(t *testing.T) {
	for _, tc := range []struct {
		p   *compat.Policy
		req any
	}{
		{&compat.Chat, runnerapi.ChatRequest{}},
		{&compat.Responses, translate.ResponsesRequest{}},
		{&compat.Messages, translate.MessagesRequest{}},
	} {
		fields := jsonFields(reflect.TypeOf(tc.req))
		rows := tc.p.TopLevel()
		for _, f := range fields {
			if !slices.Contains(rows, f) {
				t.Errorf("%s: the request decodes %q, which has no row in the policy", tc.p.Endpoint, f)
			}
		}
		for _, r := range rows {
			if _, refused := tc.p.Refusal(r); !slices.Contains(fields, r) && !refused {
				t.Errorf("%s: the policy has a row for %q, which the request does not decode and is not refused", tc.p.Endpoint, r)
			}
		}
	}
}

// TestMessagesPolicyCoversNestedFields: every field of an Anthropic client tool and
// of thinking has a row of its own ("tools[].strict", "thinking.display"; a field
// honoured by value, as "tools[].type=custom"), so a field newer clients send is
// classified before it is decoded.
func TestMessagesPolicyCoversNestedFields(t *testing.T) {
	for prefix, typ := range map[string]reflect.Type{"tools[].": reflect.TypeFor[translate.AnthropicTool](),
		"thinking.": reflect.TypeFor[translate.AnthropicThinking]()} {
		for _, f := range jsonFields(typ) {
			name := prefix + f
			if !slices.ContainsFunc(compat.Messages.Fields, func(r compat.Field) bool {
				return r.Name == name || strings.HasPrefix(r.Name, name+"=")
			}) {
				t.Errorf("%s has no row in the policy of /v1/messages", name)
			}
		}
	}
}

// TestChatHintsAreUnsupportedFields: the agent reads a chat request's hints from its
// Unsupported fields alone, so every hint of the chat policy must be one.
func TestChatHintsAreUnsupportedFields(t *testing.T) {
	fields := jsonFields(reflect.TypeOf(runnerapi.Unsupported{}))
	for _, f := range compat.Chat.Fields {
		if f.Treatment == compat.Hint && !slices.Contains(fields, f.Name) {
			t.Errorf("the chat hint %q is not a field of runnerapi.Unsupported", f.Name)
		}
	}
}

func TestHints(t *testing.T) {
	for _, tc := range []struct {
		body string
		want []string
	}{
		{`{"model":"m","store":false,"service_tier":"auto","metadata":{},"user":""}`, nil},
		{`{"model":"m","store":true,"service_tier":"flex","metadata":{"a":"b"},"user":"u","prompt_cache_key":"k"}`,
			[]string{"store", "metadata", "user", "service_tier"}},
		{`[1]`, nil},
	} {
		if d := cmp.Diff(tc.want, compat.Chat.Hints([]byte(tc.body))); d != "" {
			t.Errorf("%s (-want +got):\n%s", tc.body, d)
		}
	}
	for _, tc := range []struct {
		name, value string
		want        bool
	}{
		{"tools[].defer_loading", "true", true},
		{"tools[].defer_loading", "false", false},
		{"tools[].allowed_callers", `[ "direct" ]`, false},
		{"tools[].allowed_callers", `["code_execution_20250825"]`, true},
		{"thinking.display", `"omitted"`, true},
		{"thinking.display", "null", false},
		{"tools[].strict", "true", false}, // honoured, not a hint
		{"tools[].nope", "true", false},
	} {
		if got := compat.Messages.Ignored(tc.name, []byte(tc.value)); got != tc.want {
			t.Errorf("Ignored(%s, %s) = %v, want %v", tc.name, tc.value, got, tc.want)
		}
	}
	if got := compat.HeaderValue([]string{"a", "b", "a"}); got != "a, b" {
		t.Errorf("HeaderValue = %q", got)
	}
}
