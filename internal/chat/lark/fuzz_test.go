package lark

import (
	"regexp"
	"testing"
)

var (
	// quoted are GBNF literals and classes; refPattern the rule names outside them.
	quoted     = regexp.MustCompile(`"(\\.|[^"\\])*"|\[(\\.|[^\]\\])*\]`)
	refPattern = regexp.MustCompile(`p-[A-Za-z0-9-]+`)
)

// FuzzParse: any definition either parses or is an *Error (never a panic), and a
// grammar that parses is written as GBNF, in both forms, with every rule it refers to
// defined, and matched against a short text without a panic.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{patchGrammar, `start: "a" ~ 2..3`, "start: list\nlist: \"[\" [value (\",\" value)*] \"]\"\nvalue: list | /[0-9]/",
		"start: WORD\n%import common (WORD, WS)", `start: /(?i)[^"\\]{1,4}/s`, "start: (\"a\" | b)+\nb: \"b\".. \"c\""} {
		f.Add("lark", seed, "ab")
	}
	f.Add("regex", `^\d{3}-[A-Z]{2}$`, "123-AB")
	f.Fuzz(func(t *testing.T, syntax, def, text string) {
		g, err := Parse(syntax, def)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("error %T %v", err, err)
			}
			return
		}
		for _, rules := range []map[string]string{g.Rules("root", "p", false), g.ArgumentRules("p")} {
			for name, body := range rules {
				for _, ref := range refPattern.FindAllString(quoted.ReplaceAllString(body, ""), -1) {
					if _, ok := rules[ref]; !ok {
						t.Fatalf("rule %s refers to %s, which is not defined", name, ref)
					}
				}
			}
		}
		if len(text) <= 16 {
			g.Match(text)
		}
	})
}
