// Package compat is macfleet's compatibility policy: for every request field of the
// three chat APIs it serves (OpenAI Chat Completions, OpenAI Responses, Anthropic
// Messages), and for the fields the leading clients send beyond them, whether the
// field is honoured, accepted as a hint, or refused.
//
//   - Honoured: macfleet does what the field asks.
//   - Hint: accepted, and ignoring it cannot change what a correct answer is (routing
//     and caching hints, metadata, service tiers, context-management requests a
//     server may decline, include items it may leave out). A hint that a request
//     carries with a value that would have an effect elsewhere is named in the
//     response header IgnoredHintsHeader, so nothing is silently dropped.
//   - Refused: a 400 naming the field, because ignoring it would change the answer the
//     client relies on.
//
// A field in no table is unknown (a typo, or an API addition macfleet has not
// classified yet) and stays a 400. The tables here are data: the translators and the
// chat handler read them, and docs/api.md's tables are rendered from them (a test
// fails when the two differ).
package compat

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
)

// IgnoredHintsHeader is the response header that lists the request's hints that were
// accepted without effect, comma-separated: top-level field names, nested fields by
// their row's name ("tools[].defer_loading", "thinking.display"), and hosted tools
// as "tools[TYPE]", for example "tools[web_search]".
const IgnoredHintsHeader = "X-Macfleet-Ignored-Hints"

// Treatment is what macfleet does with a field.
type Treatment string

// Treatments.
const (
	Honoured Treatment = "honoured"
	Hint     Treatment = "hint"
	Refused  Treatment = "refused"
)

// Field is one request field's policy.
type Field struct {
	// Name is the field's JSON path: "stream", "thinking.type", "tools[].cache_control".
	Name string
	// Treatment is the field's; Does says what macfleet does with it (for a field
	// honoured or refused by value, which values).
	Treatment Treatment
	Does      string
	// Neutral are the JSON values of a hint that ask for what macfleet does anyway
	// (store: false); a hint with one of them is not reported as ignored.
	Neutral []string
}

// Policy is one API's table.
type Policy struct {
	// API names the API and Endpoint its path.
	API, Endpoint string
	Fields        []Field
}

// Lookup finds a field by its JSON path.
func (p *Policy) Lookup(name string) (Field, bool) {
	i := slices.IndexFunc(p.Fields, func(f Field) bool { return f.Name == name })
	if i < 0 {
		return Field{}, false
	}
	return p.Fields[i], true
}

// TopLevel are the names of the policy's top-level fields.
func (p *Policy) TopLevel() []string {
	var out []string
	for _, f := range p.Fields {
		if !strings.ContainsAny(f.Name, ".[") {
			out = append(out, f.Name)
		}
	}
	return out
}

// Refusal is the message of a 400 for a top-level field the policy refuses whatever
// its value (one the request types do not even decode); ok is false for any other
// field.
func (p *Policy) Refusal(name string) (msg string, ok bool) {
	f, found := p.Lookup(name)
	if !found || f.Treatment != Refused {
		return "", false
	}
	return name + " is not supported: " + f.Does, true
}

// Hints are the top-level hint fields of a JSON object body that carry a value with
// an effect elsewhere (not null, not empty, not a neutral value), in the policy's
// order. A body that is not an object has none.
func (p *Policy) Hints(body []byte) []string {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return nil
	}
	var out []string
	for _, f := range p.Fields {
		if v, ok := top[f.Name]; ok && f.ignored(v) {
			out = append(out, f.Name)
		}
	}
	return out
}

// Ignored reports whether the field name (a row's name, nested ones included:
// "tools[].defer_loading"), carried with the JSON value v, is a hint to name in
// IgnoredHintsHeader: a hint whose value is not null, not empty and not neutral.
func (p *Policy) Ignored(name string, v json.RawMessage) bool {
	f, ok := p.Lookup(name)
	return ok && f.ignored(v)
}

func (f Field) ignored(v json.RawMessage) bool {
	return f.Treatment == Hint && !empty(v) && !neutral(f, v)
}

func empty(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	switch string(v) {
	case "", "null", `""`, "[]", "{}":
		return true
	}
	return false
}

func neutral(f Field, v json.RawMessage) bool {
	var buf bytes.Buffer
	if json.Compact(&buf, v) != nil {
		return false
	}
	return slices.Contains(f.Neutral, buf.String())
}

// HeaderValue joins hints for IgnoredHintsHeader, each once, in order.
func HeaderValue(hints []string) string {
	var seen []string
	for _, h := range hints {
		if !slices.Contains(seen, h) {
			seen = append(seen, h)
		}
	}
	return strings.Join(seen, ", ")
}

// Markdown renders the policy as a Markdown table: field, treatment, what macfleet
// does.
func (p *Policy) Markdown() string {
	var sb strings.Builder
	sb.WriteString("| field | treatment | what macfleet does |\n|---|---|---|\n")
	for _, f := range p.Fields {
		esc := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
		sb.WriteString("| `" + esc(f.Name) + "` | " + string(f.Treatment) + " | " + esc(f.Does) + " |\n")
	}
	return sb.String()
}

// Policies are the three APIs' tables, in the order docs/api.md shows them.
func Policies() []*Policy { return []*Policy{&Chat, &Responses, &Messages} }
