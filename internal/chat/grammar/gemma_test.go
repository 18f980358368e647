package grammar

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat"
)

// TestGemmaArguments: a tool's parameter schema as function-gemma arguments
// (KEY:VALUE,… with strings between <escape> marks): the rules written for it, or
// a 400 on the tool's parameters naming what the format cannot hold.
func TestGemmaArguments(t *testing.T) {
	cases := []struct {
		name, schema string
		// want are the tool's own rules (mf-args-0 and its sub-rules); err a
		// substring of the error.
		want map[string]string
		err  string
	}{
		{name: "no schema: any members", schema: `{"type":"object"}`,
			want: map[string]string{"mf-args-0": "mf-gemma-members?"}},
		{name: "no properties allowed", schema: `{"type":"object","additionalProperties":false}`,
			want: map[string]string{"mf-args-0": `""`}},
		{name: "required in order, optional after", schema: `{"type":"object","properties":{
			"zone":{"enum":["UTC","CET"]},"days":{"type":"integer"},"city":{"type":"string","maxLength":20,"description":"d"}},
			"required":["zone","city"]}`,
			want: map[string]string{"mf-args-0": `"zone:" ( "<escape>UTC<escape>" | "<escape>CET<escape>" ) "," ` +
				`"city:" "<escape>" [^<]{0,20} "<escape>" ( "," "days:" mf-gemma-integer )?`}},
		{name: "none required: any in order, maybe none", schema: `{"properties":{"a":{"type":"boolean"},"b":{"const":2.5}}}`,
			want: map[string]string{"mf-args-0": `( "a:" ( "true" | "false" ) ( "," "b:" "2.5" )? | "b:" "2.5" )?`}},
		{name: "nested object and array", schema: `{"properties":{"p":{"properties":{"x":{"type":"number"}},"required":["x"]},
			"l":{"type":"array","items":{"type":"string","minLength":1}}},"required":["p","l"]}`,
			want: map[string]string{
				"mf-args-0":   `"p:" mf-args-0-1 "," "l:" mf-args-0-2`,
				"mf-args-0-1": `"{" "x:" mf-gemma-number "}"`,
				"mf-args-0-2": `"[" "<escape>" [^<]{1,} "<escape>" ( "," "<escape>" [^<]{1,} "<escape>" )* "]"`,
			}},
		{name: "any value", schema: `{"properties":{"v":{}},"required":["v"]}`,
			want: map[string]string{"mf-args-0": `"v:" mf-gemma-value`}},
		{name: "format", schema: `{"properties":{"d":{"type":"string","format":"date"}}}`, err: `keyword "format" (at "/properties/d/format")`},
		{name: "anyOf", schema: `{"properties":{"d":{"anyOf":[{"type":"string"}]}}}`, err: `keyword "anyOf"`},
		{name: "type list", schema: `{"properties":{"d":{"type":["string","null"]}}}`, err: "only one type"},
		{name: "null", schema: `{"properties":{"d":{"type":"null"}}}`, err: "type null"},
		{name: "a key the format cannot write", schema: `{"properties":{"a b":{"type":"string"}}}`, err: `property "a b"`},
		{name: "an enum of objects", schema: `{"properties":{"e":{"enum":[{"a":1}]}}}`, err: "only strings, numbers and booleans"},
		{name: "a string holding the escape mark", schema: `{"properties":{"e":{"const":"x<escape>"}}}`, err: "holds <escape>"},
		{name: "lengths that no string fits", schema: `{"properties":{"s":{"type":"string","minLength":3,"maxLength":2}}}`, err: "below minLength"},
		{name: "parameters not an object", schema: `{"type":"string"}`, err: "must be of type object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, e := ForChat(Input{Format: chat.FormatFunctionGemma, ToolChoice: &runnerapi.ToolChoice{Mode: "required"},
				Tools: []runnerapi.Tool{{Type: "function", Function: runnerapi.Function{Name: "f", Parameters: json.RawMessage(tc.schema)}}}})
			if tc.err != "" {
				if e == nil || e.Param != "tools[0].function.parameters" || !strings.Contains(e.Message, tc.err) {
					t.Fatalf("error %+v, want one on tools[0].function.parameters containing %q", e, tc.err)
				}
				return
			}
			if e != nil {
				t.Fatal(e)
			}
			got := map[string]string{}
			for k, v := range s.Rules {
				if strings.HasPrefix(k, "mf-args-0") {
					got[k] = v
				}
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("rules (-want +got):\n%s", d)
			}
			for k, v := range gemmaShared {
				if s.Rules[k] != v {
					t.Errorf("shared rule %s missing", k)
				}
			}
		})
	}
}
