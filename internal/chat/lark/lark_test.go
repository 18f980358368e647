package lark

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A patch that adds a file, deletes one, and moves and changes a third.
const goodPatch = "*** Begin Patch\n" +
	"*** Add File: docs/new.md\n+# New\n+\n" +
	"*** Delete File: old.txt\n" +
	"*** Update File: src/app.go\n*** Move to: src/main.go\n@@ func main() {\n-\tprintln(\"hi\")\n+\tprintln(\"hello\")\n }\n" +
	"*** End Patch\n"

func TestMatchPatchGrammar(t *testing.T) {
	g, err := Parse("lark", patchGrammar)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		text string
		want bool
	}{
		{goodPatch, true},
		{strings.TrimSuffix(goodPatch, "\n"), true}, // the end line's newline is optional
		{"*** Begin Patch\n*** Delete File: a\n*** End Patch", true},
		{"*** Begin Patch\n*** End Patch\n", false},                             // no operation
		{"*** Begin Patch\n*** Add File: a\n*** End Patch\n", false},            // an added file has lines
		{"*** Begin Patch\n*** Delete File: \n*** End Patch\n", false},          // an empty path
		{"*** Begin Patch\n*** Update File: a\n@@\n*x\n*** End Patch\n", false}, // a line that is no change
		{"*** Begin Patch\n*** Update File: a\n@@\n+x\n*** End Patch\nmore", false},
		{strings.Replace(goodPatch, "*** Begin Patch", "*** begin patch", 1), false},
		{"", false},
	} {
		if got := g.Match(tc.text); got != tc.want {
			t.Errorf("Match(%q) = %v, want %v", tc.text, got, tc.want)
		}
	}
}

func TestMatchConstructs(t *testing.T) {
	for _, tc := range []struct {
		syntax, def string
		yes, no     []string
	}{
		{"lark", `start: "a" ~ 2..3`, []string{"aa", "aaa"}, []string{"a", "aaaa"}},
		{"lark", `start: "a".."c"+ ["!"]`, []string{"abc", "cab!"}, []string{"d", "!"}},
		{"lark", `start: "select"i WS_INLINE CNAME
%import common (WS_INLINE, CNAME)`, []string{"SELECT x1", "sElEcT  _y"}, []string{"select 1x", "selectx"}},
		{"lark", `start: NUM -> number
NUM: /[0-9]+/ | /0x[0-9a-f]+/i`, []string{"42", "0XfF"}, []string{"0x", "4 2"}},
		{"lark", `?start: item ("," item)*
!item: WORD
%import common.WORD`, []string{"a,bc,d"}, []string{"a,", ",a"}},
		{"lark", `start: list
list: "[" [value ("," value)*] "]"
value: list | /[0-9]/`, []string{"[]", "[1,[2,[]],3]"}, []string{"[1,]", "[[1]"}},
		{"lark", `start: /.+/s`, []string{"a\nb"}, []string{""}},
		{"lark", `start: /a\/b/`, []string{"a/b"}, []string{"a\\/b"}},
		{"regex", `^\d{3}-[A-Z]{2}$`, []string{"123-AB"}, []string{"12-AB", "123-ab", "123-ABC"}},
		{"regex", `(?i)yes|no`, []string{"YES", "no"}, []string{"maybe"}},
		{"regex", `[^"\\]*`, []string{"", `it's`}, []string{`"`, `\`}},
	} {
		g, err := Parse(tc.syntax, tc.def)
		if err != nil {
			t.Errorf("%s: %v", tc.def, err)
			continue
		}
		for _, s := range tc.yes {
			if !g.Match(s) {
				t.Errorf("%s: does not match %q", tc.def, s)
			}
		}
		for _, s := range tc.no {
			if g.Match(s) {
				t.Errorf("%s: matches %q", tc.def, s)
			}
		}
	}
}

// TestParseRefusals: what cannot be translated is an error naming the construct.
func TestParseRefusals(t *testing.T) {
	for _, tc := range []struct{ syntax, def, construct, msg string }{
		{"lark", "start: \"a\"\n%ignore \" \"", "%ignore", "line 2: %ignore is not supported"},
		{"lark", "start: x\n%declare x", "%declare", "%declare is not supported"},
		{"lark", "start: sep{\"a\", \",\"}", "template", "rule templates"},
		{"lark", "start: list\nlist: list \",\" \"a\" | \"a\"", "left recursion", "rule list is left-recursive (list → list)"},
		{"lark", "start: a\na: b? c\nb: \"b\"\nc: a \"c\" | \"c\"", "left recursion", "rule a is left-recursive (a → c → a)"},
		{"lark", "start: item", "undefined name", "item (used in start) is not defined"},
		{"lark", "begin: \"a\"", "start", `no "start" rule`},
		{"lark", "start: FOO\n%import common.FOO", "%import", "common.FOO is not supported"},
		{"lark", "start: X\n%import other.X", "%import", "only %import common.NAME"},
		{"lark", `start: /a(?=b)/`, "regex", "does not parse"},
		{"lark", `start: /\bx/`, "word boundary", `\b`},
		{"lark", `start: /x/x`, "regex flag", `flag 'x'`},
		{"lark", `start: /a^b/`, "anchor", "anchors"},
		{"lark", `start: "a" ~ 500`, "repetition", "at most 64"},
		{"lark", "start: (\"a\"?)*", "repetition of an empty match", "can match the empty string"},
		{"lark", `start: "a" "b`, "syntax", "not closed"},
		{"lark", `start "a"`, "syntax", `expected ":"`},
		{"lark", "start: \"a\"\nstart: \"b\"", "syntax", "start is defined twice"},
		{"lark", "  \n", "definition", "empty"},
		{"lark", "start: " + strings.Repeat("(\"a\" ", MaxNesting+1) + strings.Repeat(")", MaxNesting+1), "nesting", "more than 64 deep"},
		{"regex", `(a)\1`, "regex", "does not parse"},
		{"regex", `x{1001}`, "regex", "does not parse"},
		{"regex", `x{70}`, "repetition", "at most 64"},
		{"pcre", `x`, "syntax", "lark or regex"},
	} {
		_, err := Parse(tc.syntax, tc.def)
		le, ok := err.(*Error)
		if !ok || le.Construct != tc.construct || !strings.Contains(le.Error(), tc.msg) {
			t.Errorf("Parse(%s, %q) = %v, want an error on %q saying %q", tc.syntax, tc.def, err, tc.construct, tc.msg)
		}
	}
	if _, err := Parse("lark", "start: \"a\"\n"+strings.Repeat("// x\n", MaxDefinitionBytes/5)); err == nil {
		t.Error("a definition over MaxDefinitionBytes was accepted")
	}
}

func TestGBNF(t *testing.T) {
	g, err := Parse("lark", "start: greeting+ (\"!\" | \"?\")\ngreeting: \"hi\\\"\" LETTER\n%import common.LETTER")
	if err != nil {
		t.Fatal(err)
	}
	want := `lark-Cc0 ::= [A-Za-z]
lark-LETTER ::= lark-Cc0
lark-greeting ::= "hi\x22" lark-LETTER
lark-start ::= (lark-greeting)+ ("!" | "?")
root ::= lark-start
`
	if diff := cmp.Diff(want, g.GBNF()); diff != "" {
		t.Errorf("GBNF (-want +got):\n%s", diff)
	}
}

// TestArgumentRules: in a call's arguments, the text is written as a JSON string
// would hold it: the characters JSON escapes are their escapes, and a class keeps its
// other characters.
func TestArgumentRules(t *testing.T) {
	g, err := Parse("lark", "start: \"say \\\"\" /[^\\n]/ LF\n%import common.LF")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"mf-args-0":       `"{\"input\": \"" mf-args-0-Text "\"}"`,
		"mf-args-0-Text":  "mf-args-0-start",
		"mf-args-0-start": `"say \x5C\x22" mf-args-0-Cc0 mf-args-0-LF`,
		"mf-args-0-LF":    `"\x5Cn"`,
		"mf-args-0-Cc0":   `[ -!#-\x5B\x5D-\U0010FFFF] | "\x5C" ([\x22\x5Cbfrt] | "u00" ("0" [1-7be-f] | "1" [0-9a-f]))`,
	}
	if diff := cmp.Diff(want, g.ArgumentRules("mf-args-0")); diff != "" {
		t.Errorf("ArgumentRules (-want +got):\n%s", diff)
	}
	// Each escape the rules allow decodes, in JSON, to a character of the class.
	for _, esc := range []string{`\u0001`, `\b`, `\t`, `\u000b`, `\f`, `\r`, `\u000e`, `\u0010`, `\u001f`, `\"`, `\\`} {
		var s string
		if err := json.Unmarshal([]byte(`"`+esc+`"`), &s); err != nil || s == "\n" || len([]rune(s)) != 1 {
			t.Errorf("escape %s decodes to %q (%v)", esc, s, err)
		}
	}
}
