package grammar

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
)

func nested(depth int) string {
	return strings.Repeat(`{"type":"array","items":`, depth) + `{"type":"string"}` + strings.Repeat("}", depth)
}

func enum(n int) string {
	vals := make([]string, n)
	for i := range vals {
		vals[i] = fmt.Sprintf("%q", fmt.Sprint("v", i))
	}
	return `{"enum":[` + strings.Join(vals, ",") + `]}`
}

func manyProps(n int, leaf string) string {
	props := make([]string, n)
	for i := range props {
		props[i] = fmt.Sprintf(`"p%d":%s`, i, leaf)
	}
	return `{"type":"object","properties":{` + strings.Join(props, ",") + `}}`
}

func TestCheckSchemaLimits(t *testing.T) {
	for _, tc := range []struct {
		name, schema, limit string
	}{
		{"deep nesting", nested(MaxSchemaDepth + 1), "schema depth"},
		{"nesting at the limit", nested(MaxSchemaDepth), ""},
		{"huge enum", enum(MaxSchemaWeight + 1), "schema weight"},
		{"an enum of countries", enum(300), ""},
		{"long maxLength", `{"type":"string","maxLength":1000000000}`, "schema weight"},
		{"long maxItems", `{"type":"array","maxItems":1e300}`, "schema weight"},
		{"negative minItems", `{"type":"array","minItems":-5}`, "schema weight"},
		{"deep enum value", `{"enum":[` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `]}`, "JSON nesting"},
		{"pattern repetition", `{"type":"string","pattern":"^a{0,99999999}$"}`, "schema weight"},
		{"many bounded fields", manyProps(100, `{"type":"string","maxLength":500}`), "schema weight"},
		{"size", manyProps(20000, `{"type":"string","description":"`+strings.Repeat("d", 20)+`"}`), "schema size"},
		{"a real tool", `{"type":"object","properties":{"city":{"type":"string","maxLength":100},"unit":{"enum":["c","f"]}},"required":["city"]}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := CheckSchema(json.RawMessage(tc.schema), "response_format.json_schema.schema")
			if tc.limit == "" {
				if e != nil {
					t.Fatalf("CheckSchema: %v", e)
				}
				return
			}
			if e == nil || e.Status != 400 || e.Param != "response_format.json_schema.schema" ||
				!strings.Contains(e.Message, "exceeds the "+tc.limit+" limit") {
				t.Fatalf("CheckSchema: %+v, want a 400 on the param naming the %s limit", e, tc.limit)
			}
		})
	}
}

// The schemas of one request share the weight: many tools each under the limit
// cannot add up past it.
func TestToolSchemasShareTheWeight(t *testing.T) {
	var ts []runnerapi.Tool
	for i := range 50 {
		ts = append(ts, runnerapi.Tool{Type: "function", Function: runnerapi.Function{Name: fmt.Sprint("t", i),
			Parameters: json.RawMessage(`{"type":"object","properties":{"s":{"type":"string","maxLength":1000}}}`)}})
	}
	_, e := ForChat(Input{Tools: ts, ToolChoice: &runnerapi.ToolChoice{Mode: "required"}})
	if e == nil || !strings.Contains(e.Message, "schema weight limit") || !strings.HasPrefix(e.Param, "tools[") {
		t.Fatalf("ForChat: %+v, want a 400 on a tool's parameters naming the weight limit", e)
	}
}

func TestCheckGrammarSize(t *testing.T) {
	if err := CheckGrammarSize(strings.Repeat("x", MaxGrammarBytes)); err != nil {
		t.Fatal(err)
	}
	if err := CheckGrammarSize(strings.Repeat("x", MaxGrammarBytes+1)); err == nil || !strings.Contains(err.Error(), "grammar size limit") {
		t.Fatalf("CheckGrammarSize: %v", err)
	}
}

// FuzzCheckSchema: whatever the schema, CheckSchema answers (a 400 or nil) without
// a panic, and a schema it accepts is within the limits: its JSON within
// MaxSchemaBytes and MaxJSONDepth.
func FuzzCheckSchema(f *testing.F) {
	f.Add(`{"type":"object","properties":{"city":{"type":"string","maxLength":20}},"required":["city"]}`)
	f.Add(nested(40))
	f.Add(`{"anyOf":[{"enum":[1,2,3]},{"type":"string","pattern":"a{2,5}"}],"$defs":{"x":{"items":true}}}`)
	f.Add(`{"type":"array","maxItems":1e9}`)
	f.Fuzz(func(t *testing.T, schema string) {
		e := CheckSchema(json.RawMessage(schema), "p")
		if e != nil {
			if e.Status != 400 || e.Param != "p" || e.Message == "" {
				t.Fatalf("CheckSchema: %+v, want a 400 on p with a message", e)
			}
			return
		}
		if len(schema) > MaxSchemaBytes {
			t.Fatalf("accepted a %d-byte schema", len(schema))
		}
		if d := depthOf(t, schema); d > MaxJSONDepth+1 {
			t.Fatalf("accepted a schema nested %d deep", d)
		}
	})
}

// depthOf is the JSON nesting of s.
func depthOf(t *testing.T, s string) int {
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("CheckSchema accepted invalid JSON: %v", err)
	}
	var walk func(any) int
	walk = func(v any) int {
		d := 0
		switch v := v.(type) {
		case map[string]any:
			for _, x := range v {
				d = max(d, walk(x))
			}
			return d + 1
		case []any:
			for _, x := range v {
				d = max(d, walk(x))
			}
			return d + 1
		}
		return 0
	}
	return walk(v)
}
