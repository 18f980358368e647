package jinja

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/test/support/testassets"
)

type oracleCase struct {
	Name     string          `json:"-"`
	Template string          `json:"template"`
	Context  json.RawMessage `json:"context"`
}

type oracleResult struct {
	Out   *string `json:"out"`
	Error string  `json:"error"`
}

// runOracle renders cases with Python's Jinja2 (testdata/oracle.py). Without python3
// and jinja2 the test is skipped, except in CI where it fails.
func runOracle(t *testing.T, cases []oracleCase) []oracleResult {
	t.Helper()
	if err := exec.Command("python3", "-c", "import jinja2").Run(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("python3 with jinja2 is required in CI (Debian python3-jinja2): %v", err)
		}
		t.Skipf("python3 with jinja2 not available: %v", err)
	}
	in, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("python3", "testdata/oracle.py")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("oracle: %v\n%s", err, stderr.String())
	}
	var res []oracleResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("oracle output: %v", err)
	}
	if len(res) != len(cases) {
		t.Fatalf("oracle answered %d cases of %d", len(res), len(cases))
	}
	return res
}

// render parses and renders a case with this package.
func render(c oracleCase) (string, error) {
	tmpl, err := Parse(c.Template)
	if err != nil {
		return "", err
	}
	ctx, err := FromJSON(c.Context)
	if err != nil {
		return "", err
	}
	vars := map[string]any{}
	d := ctx.(*Dict)
	for _, k := range d.Keys() {
		v, _ := d.Get(k)
		vars[k] = v
	}
	return tmpl.Render(vars)
}

func compareWithOracle(t *testing.T, cases []oracleCase) {
	t.Helper()
	old := Now
	Now = func() time.Time { return time.Date(2026, 11, 22, 9, 30, 0, 0, time.UTC) }
	defer func() { Now = old }()
	want := runOracle(t, cases)
	for i, c := range cases {
		got, err := render(c)
		w := want[i]
		switch {
		case w.Out == nil && err == nil:
			t.Errorf("%s: Jinja2 fails (%s) but we rendered %q", c.Name, w.Error, got)
		case w.Out != nil && err != nil:
			t.Errorf("%s: Jinja2 renders %q but we fail: %v", c.Name, *w.Out, err)
		case w.Out != nil && got != *w.Out:
			t.Errorf("%s: rendering differs from Jinja2\n got: %q\nwant: %q", c.Name, got, *w.Out)
		case w.Out == nil && strings.HasPrefix(w.Error, "raised: "):
			var raised *RaisedError
			if !asRaised(err, &raised) || raised.Message != strings.TrimPrefix(w.Error, "raised: ") {
				t.Errorf("%s: Jinja2 raises %q, we fail with %v", c.Name, w.Error, err)
			}
		}
	}
}

func asRaised(err error, target **RaisedError) bool {
	for err != nil {
		if r, ok := err.(*RaisedError); ok {
			*target = r
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}

// Conversations rendered with every real template. Arguments of tool calls are
// objects, as templates expect them (the chat layer decodes the OpenAI string).
var conversations = map[string]string{
	"system-multi-turn": `{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"What is 2+2?"},{"role":"assistant","content":"4"},{"role":"user","content":"And 3+3?"}]}`,
	"user-only":         `{"messages":[{"role":"user","content":"  Hello there!  "}]}`,
	"no-system":         `{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello! How can I help?"},{"role":"user","content":"Tell me a joke about \"quotes\" and {braces} — ünïcode ✓"}]}`,
	"tools": `{"tools":[{"type":"function","function":{"name":"get_weather","description":"Current weather for a city","parameters":{"type":"object","properties":{"city":{"type":"string","description":"City name"},"unit":{"type":"string","enum":["c","f"]}},"required":["city"]}}}],
	  "messages":[{"role":"system","content":"You can call tools."},{"role":"user","content":"Weather in Paris?"},
	  {"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris","unit":"c"}}}]},
	  {"role":"tool","tool_call_id":"call_1","name":"get_weather","content":"{\"temp\": 21, \"sky\": \"clear\"}"},
	  {"role":"user","content":"Thanks"}]}`,
}

func TestRealTemplatesMatchJinja2(t *testing.T) {
	templates, err := testassets.ChatTemplates()
	if err != nil {
		t.Fatal(err)
	}
	if len(templates) < 30 {
		t.Fatalf("found %d real templates, want the module's 37", len(templates))
	}
	var cases []oracleCase
	for _, tmpl := range templates {
		for name, conv := range conversations {
			for _, gen := range []bool{true, false} {
				// The conversation's own key order is kept.
				b := append([]byte(`{"add_generation_prompt":`+map[bool]string{true: "true", false: "false"}[gen]+
					`,"bos_token":"<s>","eos_token":"</s>",`), []byte(strings.TrimPrefix(strings.TrimSpace(conv), "{"))...)
				cases = append(cases, oracleCase{Name: tmpl.ID() + "/" + name + map[bool]string{true: "/gen", false: ""}[gen],
					Template: tmpl.Source, Context: b})
			}
		}
	}
	compareWithOracle(t, cases)
}

func TestLanguageMatchesJinja2(t *testing.T) {
	ctx := `{"s":"  Hello, World  ","n":7,"f":2.5,"l":[3,1,2],"d":{"b":1,"a":{"x":[1,"two",null,true]}},"e":"","t":"a\nb\n"}`
	templates := map[string]string{
		"cond-in-parens": `{{ 'x' + ('a' if n > 3 else 'b') + ("" if e else 'empty') }}`,
		"cond-no-else":   `[{{ 'y' if n < 0 }}]`,
		"string-methods": `{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' H') }}|{{ s.upper() }}|{{ s.lower() }}|{{ s.replace('l', 'L') }}|{{ s.replace('l','L',1) }}|{{ s.startswith('  H') }}|{{ s.endswith(('x','  ')) }}|{{ s.split(',') }}|{{ s.split() }}|{{ s.split(None, 1) }}|{{ s.find('o') }}|{{ s.title() }}`,
		"slices":         `{{ l[1:] }}{{ l[:-1] }}{{ l[::-1] }}{{ l[-1] }}{{ s[2:7] }}{{ s[::-1] }}{{ l[5:] }}`,
		"filters":        `{{ l|length }}{{ l|first }}{{ l|last }}{{ l|sort }}{{ l|join('-') }}{{ s|trim }}{{ d|tojson }}{{ d|tojson(indent=2) }}{{ l|reverse|list }}{{ s|lower }}{{ n|string }}{{ f|int }}{{ '3'|int + 1 }}{{ l|sum }}{{ l|max }}{{ l|min }}{{ d|list }}{{ 'abc'|upper }}{{ s|wordcount }}{{ t|indent(2) }}{{ l|unique|list }}`,
		"items-order":    `{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d|items %}{{ k }}{% endfor %}{% for k in d %}{{ k }}{% endfor %}{{ d.keys()|list }}{{ d.values()|list }}`,
		"tests":          `{{ n is defined }}{{ zz is defined }}{{ zz is undefined }}{{ none is none }}{{ s is string }}{{ n is number }}{{ n is integer }}{{ f is float }}{{ d is mapping }}{{ l is iterable }}{{ s is iterable }}{{ n is odd }}{{ n is even }}{{ n is divisibleby 7 }}{{ n is not none }}{{ true is sameas true }}{{ l is sequence }}{{ n is equalto 7 }}`,
		"operators":      `{{ 7 // 2 }}{{ -7 // 2 }}{{ 7 % 3 }}{{ -7 % 3 }}{{ 2 ** 10 }}{{ 7 / 2 }}{{ 1 + 2.5 }}{{ 'a' ~ 1 ~ none }}{{ [1] + [2] }}{{ 'ab' * 3 }}{{ 1 == 1.0 }}{{ 'a' in 'cat' }}{{ 3 not in l }}{{ 'b' in d }}{{ not e }}{{ n > 3 and f < 3 }}{{ e or 'default' }}{{ 1 < n < 10 }}`,
		"loops":          `{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}:{% endfor %}{% for x in [] %}no{% else %}empty{% endfor %}{% for x in l if x > 1 %}{{ x }}{{ loop.length }}{% endfor %}{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}`,
		"namespace":      `{% set ns = namespace(found=false, count=0) %}{% for x in l %}{% if x > 1 %}{% set ns.found = true %}{% set ns.count = ns.count + 1 %}{% endif %}{% endfor %}{{ ns.found }}{{ ns.count }}`,
		"scoping":        `{% set x = 1 %}{% for i in l %}{% set x = i %}{% endfor %}{{ x }}`,
		"macro":          `{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }}{{ greet('b', '?') }}{{ greet(name='c') }}`,
		"whitespace":     "a\n  {% if true %}\n    b\n  {% endif %}\nc\n{%- if true %} d {% endif -%}\n e {{- ' f ' -}} g\n  {#- comment -#}  h\n{% for x in l %}\n[{{ x }}]\n{% endfor %}\n",
		"lstrip-plus":    "x\n    {%+ if true %}y{% endif %}\n",
		"block-set":      `{% set body %}inner {{ n }}{% endset %}[{{ body }}]`,
		"dict-literal":   `{% set m = {'k': 'v', 'n': n} %}{{ m.k }}{{ m['n'] }}{{ m|tojson }}{{ m.get('zz', 'dflt') }}`,
		"escapes":        `{{ "tab\there" }}{{ 'it\'s' }}{{ "line\nbreak" }}`,
		"attr-undefined": `[{{ d.zz }}][{{ d.a.zz }}][{{ undefinedvar }}]`,
		"tojson-strings": `{{ "quote\" back\\ nl\n tab\t ü ✓"|tojson }}{{ [1.0, 2.5e-7, 1e20, -0.5]|tojson }}`,
		"raise":          `{% if n > 3 %}{{ raise_exception('n is too big: ' ~ n) }}{% endif %}`,
		"strftime":       `{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d %H:%M') }}`,
		"select-map":     `{{ l|select('odd')|list }}{{ l|reject('odd')|list }}{{ [{'a':1},{'a':2}]|map(attribute='a')|list }}{{ [{'a':1},{'a':2},{'b':3}]|selectattr('a','defined')|list|length }}{{ ['a','b']|map('upper')|list }}`,
		"range":          `{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(1, 10, 4) %}{{ i }}{% endfor %}`,
		"nested-cond":    `{{ 'a' if n > 10 else 'b' if n > 5 else 'c' }}`,
		"not-precedence": `{{ not zz is defined }}{{ not n == 7 }}{{ -n|abs }}`,
		"unicode-length": `{{ 'héllo ✓'|length }}{{ 'héllo'[1] }}`,
		"filter-block":   `{% filter upper %}shout {{ n }}{% endfilter %}`,
		// Long strings are indexed and sliced through a rune index (work.go).
		"long-unicode": `{% set u = ('aé✓😀' * 100) ~ 'end' %}{% set a = 'xyz' * 200 %}{{ u|length }}{{ u[0] }}{{ u[63] }}{{ u[64] }}{{ u[129] }}{{ u[-1] }}{{ u[-5] }}{{ u[399] }}{{ u[400] }}{{ u[403] is defined }}` +
			`{{ u[60:70] }}|{{ u[390:] }}|{{ u[-10:-3] }}|{{ u[1:300:37] }}|{{ u[300:10:-41] }}|{{ u[::-97] }}|{{ u[5:5] }}|{{ u[10:2] }}|{{ a[599] }}{{ a[-600] }}{{ a[100:105] }}{{ a[::-150] }}{{ a|length }}`,
	}
	var cases []oracleCase
	for name, src := range templates {
		cases = append(cases, oracleCase{Name: name, Template: src, Context: json.RawMessage(ctx)})
	}
	compareWithOracle(t, cases)
}
