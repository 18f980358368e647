package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// The function-gemma format (the function-calling Gemma 3) writes a call as
// <start_function_call>call:NAME{KEY:VALUE,…}<end_function_call>: keys bare, strings
// between <escape> marks, numbers and booleans bare, arrays [V,…] and objects
// {KEY:VALUE,…}. Its arguments are not JSON, so the converter's JSON rules do not
// apply: gemmaWriter writes the rules of a tool's parameter schema in this syntax.
const (
	gemmaCallBegin = "<start_function_call>"
	gemmaCallEnd   = "<end_function_call>"
	gemmaEscape    = "<escape>"
)

// The rules any value of a schema that does not narrow it uses: strings hold no "<e"
// (the parser ends a string at the next <escape> and a call at <end_function_call>;
// other "<" are text), arrays at least one value (the parser reads "[]" as null).
var gemmaShared = map[string]string{
	"mf-gemma-string":  `"<escape>" ( [^<] | "<"+ [^<e] )* "<"* "<escape>"`,
	"mf-gemma-integer": `"-"? ( "0" | [1-9] [0-9]{0,15} )`,
	"mf-gemma-number":  `mf-gemma-integer ( "." [0-9]{1,16} )?`,
	"mf-gemma-key":     `[A-Za-z_] [A-Za-z0-9_]{0,63}`,
	"mf-gemma-members": `mf-gemma-key ":" mf-gemma-value ( "," mf-gemma-key ":" mf-gemma-value )*`,
	"mf-gemma-value": `mf-gemma-string | mf-gemma-number | "true" | "false" | ` +
		`"[" mf-gemma-value ( "," mf-gemma-value )* "]" | "{" mf-gemma-members? "}"`,
}

// gemmaKeywords are the schema keywords a function-gemma call enforces (annotations
// aside); a schema with any other is refused, naming it.
var gemmaKeywords = set("type", "properties", "required", "additionalProperties", "items", "enum", "const",
	"minLength", "maxLength")

// gemmaKey is a property name the format can write bare.
var gemmaKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// addGemmaCall adds the rule mf-call-i: a call of tool i in the function-gemma
// syntax, its arguments held to the tool's parameter schema.
func (s *Spec) addGemmaCall(t runnerapi.Tool, i int) *runnerapi.Error {
	param := fmt.Sprintf("tools[%d].function.parameters", i)
	if t.Function.InputGrammar != nil {
		return runnerapi.InvalidRequest(runnerapi.CodeUnsupportedParameter, fmt.Sprintf("tools[%d].function.input_grammar", i),
			"a forced call of a freeform tool is not supported yet for models that write the function-gemma format")
	}
	params := t.Function.Parameters
	if len(bytes.TrimSpace(params)) == 0 || string(params) == "null" {
		params = json.RawMessage(`{"type":"object"}`)
	}
	if e := checkSchema(s.b, params, param); e != nil {
		return e
	}
	w := gemmaWriter{rules: s.Rules, name: fmt.Sprintf("mf-args-%d", i)}
	members, err := w.members(params, "")
	if err != nil {
		return runnerapi.InvalidRequest(runnerapi.CodeUnsupportedParameter, param, "%s", err.Error())
	}
	maps.Copy(s.Rules, gemmaShared)
	s.Rules[w.name] = members
	s.Rules[fmt.Sprintf("mf-call-%d", i)] = fmt.Sprintf(`%s %s %s`, literal("call:"+t.Function.Name+"{"), w.name, literal("}"))
	return nil
}

// gemmaWriter writes the rules of one tool's arguments, named after name.
type gemmaWriter struct {
	rules map[string]string
	name  string
	n     int
}

// rule adds a rule with body and returns its name.
func (w *gemmaWriter) rule(body string) string {
	w.n++
	name := fmt.Sprintf("%s-%d", w.name, w.n)
	w.rules[name] = body
	return name
}

// schemaObject decodes a schema node: its keywords, in order where it matters.
func schemaObject(raw json.RawMessage, at string) (map[string]json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if string(raw) == "true" {
		return map[string]json.RawMessage{}, nil
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return nil, fmt.Errorf("the schema at %q must be an object (function-gemma calls)", pointer(at))
	}
	for k := range m {
		if !gemmaKeywords[k] && !annotations[k] {
			return nil, fmt.Errorf("the JSON Schema keyword %q (at %q) is not supported yet in calls of models that write "+
				"the function-gemma format; supported there: type, properties, required, additionalProperties, items, enum, "+
				"const, minLength, maxLength", k, pointer(at+"/"+k))
		}
	}
	return m, nil
}

// members is the rule body of an object's members (KEY:VALUE,…, no braces): the
// listed properties in their order, the required ones always, or any members where
// the schema lists none.
func (w *gemmaWriter) members(raw json.RawMessage, at string) (string, error) {
	m, err := schemaObject(raw, at)
	if err != nil {
		return "", err
	}
	if t, ok := m["type"]; ok && string(t) != `"object"` {
		return "", fmt.Errorf("the schema at %q must be of type object (function-gemma calls)", pointer(at))
	}
	names, err := orderedKeys(m["properties"])
	if err != nil {
		return "", fmt.Errorf("properties at %q: %v", pointer(at+"/properties"), err)
	}
	if len(names) == 0 {
		if string(m["additionalProperties"]) == "false" {
			return `""`, nil
		}
		return "mf-gemma-members?", nil
	}
	var props map[string]json.RawMessage
	_ = json.Unmarshal(m["properties"], &props)
	var required []string
	if r, ok := m["required"]; ok && json.Unmarshal(r, &required) != nil {
		return "", fmt.Errorf("required at %q must be a list of names", pointer(at+"/required"))
	}
	var must, may []string
	for _, k := range names {
		if !gemmaKey.MatchString(k) {
			return "", fmt.Errorf("the property %q (at %q) cannot be written bare in a function-gemma call", k, pointer(at+"/properties"))
		}
		v, err := w.value(props[k], at+"/properties/"+pointerEscape(k))
		if err != nil {
			return "", err
		}
		member := literal(k+":") + " " + v
		if slices.Contains(required, k) {
			must = append(must, member)
		} else {
			may = append(may, member)
		}
	}
	return joinMembers(must, may), nil
}

// joinMembers is the rule body of required members, all in order, then optional
// ones, each in order or left out, commas between.
func joinMembers(must, may []string) string {
	if len(must) > 0 {
		body := strings.Join(must, ` "," `)
		for _, m := range may {
			body += ` ( "," ` + m + ` )?`
		}
		return body
	}
	// None required: any in order, maybe none. Each alternative starts at one of them.
	var alts []string
	for i, first := range may {
		alt := first
		for _, m := range may[i+1:] {
			alt += ` ( "," ` + m + ` )?`
		}
		alts = append(alts, alt)
	}
	return "( " + strings.Join(alts, " | ") + " )?"
}

// value is a GBNF expression for a value of the schema at at.
func (w *gemmaWriter) value(raw json.RawMessage, at string) (string, error) {
	m, err := schemaObject(raw, at)
	if err != nil {
		return "", err
	}
	if c, ok := m["const"]; ok {
		return gemmaLiteral(c, at+"/const")
	}
	if e, ok := m["enum"]; ok {
		var vals []json.RawMessage
		if json.Unmarshal(e, &vals) != nil || len(vals) == 0 {
			return "", fmt.Errorf("enum at %q must be a list of values", pointer(at+"/enum"))
		}
		var alts []string
		for i, v := range vals {
			l, err := gemmaLiteral(v, fmt.Sprintf("%s/enum/%d", at, i))
			if err != nil {
				return "", err
			}
			alts = append(alts, l)
		}
		return "( " + strings.Join(alts, " | ") + " )", nil
	}
	var typ string
	if t, ok := m["type"]; ok && json.Unmarshal(t, &typ) != nil {
		return "", fmt.Errorf("type at %q: only one type is supported in function-gemma calls", pointer(at+"/type"))
	}
	if typ == "" && m["properties"] != nil {
		typ = "object"
	}
	return w.typed(typ, m, raw, at)
}

// typed is a GBNF expression for a value of type typ ("" for any).
func (w *gemmaWriter) typed(typ string, m map[string]json.RawMessage, raw json.RawMessage, at string) (string, error) {
	switch typ {
	case "":
		return "mf-gemma-value", nil
	case "string":
		return stringRule(m, at)
	case "integer", "number":
		return "mf-gemma-" + typ, nil
	case "boolean":
		return `( "true" | "false" )`, nil
	case "object":
		members, err := w.members(raw, at)
		if err != nil {
			return "", err
		}
		return w.rule(`"{" ` + members + ` "}"`), nil
	case "array":
		item := "mf-gemma-value"
		if it, ok := m["items"]; ok {
			var err error
			if item, err = w.value(it, at+"/items"); err != nil {
				return "", err
			}
		}
		return w.rule(`"[" ` + item + ` ( "," ` + item + ` )* "]"`), nil
	}
	return "", fmt.Errorf("type %s at %q is not supported yet in function-gemma calls", typ, pointer(at+"/type"))
}

// stringRule is the expression of a string between <escape> marks, its length
// bounded by minLength and maxLength (then without "<").
func stringRule(m map[string]json.RawMessage, at string) (string, error) {
	lo, hi := 0, -1
	for k, dst := range map[string]*int{"minLength": &lo, "maxLength": &hi} {
		if v, ok := m[k]; ok {
			n, err := strconv.Atoi(string(v))
			if err != nil || n < 0 {
				return "", fmt.Errorf("%s at %q must be a non-negative integer", k, pointer(at+"/"+k))
			}
			*dst = n
		}
	}
	switch {
	case lo == 0 && hi < 0:
		return "mf-gemma-string", nil
	case hi < 0:
		return fmt.Sprintf(`"<escape>" [^<]{%d,} "<escape>"`, lo), nil
	case hi < lo:
		return "", fmt.Errorf("maxLength at %q is below minLength: no string fits", pointer(at+"/maxLength"))
	}
	return fmt.Sprintf(`"<escape>" [^<]{%d,%d} "<escape>"`, lo, hi), nil
}

// gemmaLiteral is the expression of one JSON value (an enum's or a const) as the
// format writes it: a string between <escape> marks, a number or boolean bare.
func gemmaLiteral(v json.RawMessage, at string) (string, error) {
	var x any
	if json.Unmarshal(v, &x) != nil {
		return "", fmt.Errorf("the value at %q is not JSON", pointer(at))
	}
	switch x := x.(type) {
	case string:
		if strings.Contains(x, gemmaEscape) {
			return "", fmt.Errorf("the value at %q holds %s, which function-gemma strings cannot", pointer(at), gemmaEscape)
		}
		return literal(gemmaEscape + x + gemmaEscape), nil
	case bool, float64:
		var b bytes.Buffer
		_ = json.Compact(&b, v)
		return literal(b.String()), nil
	}
	return "", fmt.Errorf("the value at %q: only strings, numbers and booleans are supported in function-gemma calls", pointer(at))
}

// orderedKeys are the keys of a JSON object in the order written.
func orderedKeys(raw json.RawMessage) ([]string, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("must be an object of schemas")
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, err
		}
	}
	return keys, nil
}
