package grammar

import (
	"fmt"
	"regexp"
	"strconv"
)

// The limits of the schemas one request constrains its output with
// (response_format and every tool's parameters together). The converter that
// turns them into a grammar (llama.cpp's, in the runner's process) recurses once per
// nesting level and writes a repetition {m,n} as n copies of a rule, each an
// alternative of an enum as one: a schema nested ten thousand deep, a maxLength of a
// billion or an enum of a million values would take the runner's stack or memory.
const (
	// MaxSchemaBytes bounds the JSON of one schema.
	MaxSchemaBytes = 256 << 10
	// MaxSchemaDepth bounds how deep subschemas nest (properties, items, anyOf, ...).
	MaxSchemaDepth = 32
	// MaxJSONDepth bounds the nesting of the schema's JSON, values of enum, const
	// and default included (a subschema level is two or three JSON levels).
	MaxJSONDepth = 4 * MaxSchemaDepth
	// MaxSchemaWeight bounds what the schemas of one request cost the grammar:
	// one per subschema, plus every enum value and every bound of a repetition
	// (minItems, maxItems, minLength, maxLength, the counts of a pattern's {m,n}).
	MaxSchemaWeight = 20_000
	// MaxGrammarBytes bounds the grammar the converter writes from them.
	MaxGrammarBytes = 1 << 20
)

// LimitError is a schema over one of the limits above.
type LimitError struct {
	// Limit names it: "schema size", "schema depth", "JSON nesting", "schema
	// weight" or "grammar size".
	Limit string
	// At is the JSON pointer where it was exceeded (for depth and weight).
	At        string
	Size, Max int
}

func (e *LimitError) Error() string {
	where := ""
	if e.At != "" {
		where = fmt.Sprintf(" at %q", e.At)
	}
	return fmt.Sprintf("the schema exceeds the %s limit%s (%d, over %d): constrained output compiles it into a grammar whose size grows with it",
		e.Limit, where, e.Size, e.Max)
}

// budget is the weight the schemas of one request have used so far.
type budget struct{ weight int }

// spend adds n to the weight, refusing more than MaxSchemaWeight.
func (b *budget) spend(n int, at string) error {
	if n > MaxSchemaWeight-b.weight {
		return &LimitError{Limit: "schema weight", At: pointer(at), Size: b.weight + n, Max: MaxSchemaWeight}
	}
	b.weight += n
	return nil
}

// saturated is what a repetition bound of f weighs: f, or an amount over any
// budget for one beyond the int range (negative bounds too: no grammar has them).
func saturated(f float64) int {
	if f < 0 || f > 1e15 || f != f {
		return 1e15
	}
	return int(f)
}

// repetitionKeywords repeat a rule by their value.
var repetitionKeywords = set("minItems", "maxItems", "minLength", "maxLength")

// quantifier is a regular expression's {m}, {m,} or {m,n}.
var quantifier = regexp.MustCompile(`\{(\d+)(?:,(\d*))?\}`)

// leafWeight is what the leaf keyword k with value v adds to the grammar.
func leafWeight(k string, v any) int {
	switch {
	case k == "enum":
		if l, ok := v.([]any); ok {
			return len(l)
		}
	case repetitionKeywords[k]:
		if f, ok := v.(float64); ok {
			return saturated(f)
		}
	case k == "pattern":
		s, _ := v.(string)
		w := 0
		for _, m := range quantifier.FindAllStringSubmatch(s, -1) {
			for _, n := range m[1:] {
				if n == "" {
					continue
				}
				c, err := strconv.ParseFloat(n, 64)
				if err != nil {
					c = 1e15
				}
				w += saturated(c)
			}
		}
		return w
	}
	return 0
}

// CheckGrammarSize refuses a grammar over MaxGrammarBytes.
func CheckGrammarSize(g string) error {
	if len(g) > MaxGrammarBytes {
		return &LimitError{Limit: "grammar size", Size: len(g), Max: MaxGrammarBytes}
	}
	return nil
}
