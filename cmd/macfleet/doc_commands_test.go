package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/macfleet/macfleet/test/support/testenv"
)

// docCommand is one `macfleet …` command line of the documentation: where it is, its
// words, and whether it is a mention in prose (inline code, which may name a command
// or a flag without the rest of its line).
type docCommand struct {
	where   string
	args    []string
	mention bool
}

// snippet is a piece of code in a documented file; mention: inline code.
type snippet struct {
	text    string
	mention bool
}

// documented are the files whose command lines a user copies: the README, docs/, the
// Homebrew formula's caveats and the chart's NOTES.txt.
func documented(t *testing.T) []string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append(files, filepath.Join(root, "README.md"), filepath.Join(root, "hack", "homebrew", "macfleet.rb"),
		filepath.Join(root, "charts", "macfleet", "templates", "NOTES.txt"))
}

var (
	inlineCode = regexp.MustCompile("`([^`]+)`")
	// commandLine is a line of a text file that is a command: indented, or after a
	// label ("On one Mac:   macfleet serve …").
	commandLine = regexp.MustCompile(`^\s*(?:[A-Za-z][A-Za-z ,]*:\s{2,})?((?:\$ )?(?:sudo )?(?:\./|bin/|\./bin/)?macfleet .*)$`)
	// placeholders of templates (Helm's {{ }}, Ruby's #{ }) and of the docs (<mac>)
	// stand for one word.
	placeholder = regexp.MustCompile(`\{\{[^}]*\}\}|#\{[^}]*\}|<[A-Za-z][-A-Za-z0-9_ ]*>`)
	// shellFence opens a fenced block of shell commands (or one without a language);
	// the others (text, yaml, json…) hold output and manifests.
	shellFence = regexp.MustCompile("^```(sh|bash|shell|console|zsh)?$")
)

// snippets are the pieces of code in text: shell blocks' lines (continuations
// joined) and inline code in Markdown, and command lines and inline code elsewhere.
func snippets(text string, markdown bool) []snippet {
	var out []snippet
	fenced, shell := false, false
	var cont string
	for line := range strings.SplitSeq(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if markdown && strings.HasPrefix(trimmed, "```") {
			fenced, shell = !fenced, !fenced && shellFence.MatchString(trimmed)
			continue
		}
		code := ""
		switch m := commandLine.FindStringSubmatch(line); {
		case fenced && shell:
			code = line
		case fenced:
			continue
		case !markdown && m != nil:
			code = m[1]
		}
		if code != "" || cont != "" {
			if l, ok := strings.CutSuffix(strings.TrimRight(code, " "), `\`); ok {
				cont += l + " "
				continue
			}
			out = append(out, snippet{text: cont + code})
			cont = ""
			continue
		}
		for _, m := range inlineCode.FindAllStringSubmatch(line, -1) {
			out = append(out, snippet{text: m[1], mention: true})
		}
	}
	return out
}

// commandsIn are the macfleet command lines of a snippet: each command of it (split at
// &&, ||, ;, |) that runs macfleet, up to a comment or a redirection.
func commandsIn(snippet string) [][]string {
	var out [][]string
	words := shellWords(placeholder.ReplaceAllString(snippet, "X"))
	var cur []string
	flush := func() {
		// A placeholder where the subcommand goes is a version in prose, not a command.
		if i := macfleetAt(cur); i >= 0 && len(cur) > i+1 && cur[i+1] != "X" {
			out = append(out, cur[i+1:])
		}
		cur = nil
	}
	for _, w := range words {
		switch {
		case w == "&&" || w == "||" || w == ";" || w == "|" || w == "&":
			flush()
			continue
		case strings.HasPrefix(w, "#") || strings.HasPrefix(w, "<") || strings.HasPrefix(w, ">") || strings.HasPrefix(w, "2>"):
			flush()
			return out
		}
		if strings.HasPrefix(w, "[-") && strings.HasSuffix(w, "]") { // a usage line's optional flag
			w = w[1 : len(w)-1]
		}
		cur = append(cur, w)
	}
	flush()
	return out
}

// macfleetAt is the index of the macfleet word that starts cmd (after a prompt, sudo
// and environment assignments), or -1.
func macfleetAt(cmd []string) int {
	for i, w := range cmd {
		switch {
		case w == "$" || w == "sudo" || (strings.Contains(w, "=") && !strings.HasPrefix(w, "-")):
		case w == "macfleet" || strings.HasSuffix(w, "/macfleet"):
			return i
		default:
			return -1
		}
	}
	return -1
}

// shellWords splits a command line as a POSIX shell does for what documentation
// holds: words, single and double quotes, backslash escapes, and ; | && || as words
// of their own.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	in, quote, esc := false, rune(0), false
	end := func() {
		if in {
			words = append(words, w.String())
			w.Reset()
			in = false
		}
	}
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case esc:
			w.WriteRune(r)
			esc = false
		case quote != 0 && r == quote:
			quote = 0
		case quote == '\'':
			w.WriteRune(r)
		case r == '\\':
			esc, in = true, true
		case quote == 0 && (r == '\'' || r == '"'):
			quote, in = r, true
		case quote == 0 && (r == ' ' || r == '\t'):
			end()
		case quote == 0 && (r == ';' || r == '|' || r == '&'):
			end()
			op := string(r)
			if i+1 < len(rs) && (rs[i+1] == '&' || rs[i+1] == '|') {
				op += string(rs[i+1])
				i++
			}
			words = append(words, op)
		default:
			w.WriteRune(r)
			in = true
		}
	}
	end()
	return words
}

// docCommands are every macfleet command line of the documented files.
func docCommands(t *testing.T) []docCommand {
	t.Helper()
	var out []docCommand
	for _, f := range documented(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(filepath.Dir(f)) + "/" + filepath.Base(f)
		for _, s := range snippets(string(b), strings.HasSuffix(f, ".md")) {
			for _, args := range commandsIn(s.text) {
				out = append(out, docCommand{where: name + ": " + strings.TrimSpace(s.text), args: args, mention: s.mention})
			}
		}
	}
	return out
}

// elided reports whether a word stands for more of the command left out ("…").
func elided(w string) bool { return w == "…" || w == "..." || w == "[...]" }

// checkCommand parses args through the real command tree: the subcommand must exist,
// every flag must be one it has (with its value where it takes one), its positional
// arguments must be what it accepts, and for `agent install` and `serve install` the
// words after -- must be flags of the agent or serve command they install. A mention
// may leave out arguments and the value of its last flag.
func checkCommand(args []string, mention bool) error {
	if i := indexFunc(args, elided); i >= 0 {
		args = args[:i]
	}
	cmd, rest, err := root.Find(args)
	if err != nil {
		return err
	}
	if cmd == root && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		return fmt.Errorf("no such command: macfleet %s", strings.Join(args, " "))
	}
	fs := shadowFlags(cmd)
	if err := fs.Parse(rest); err != nil && !(mention && strings.Contains(err.Error(), "flag needs an argument")) {
		return fmt.Errorf("macfleet %s: %w", cmd.CommandPath(), err)
	}
	positional, after := fs.Args(), []string(nil)
	if d := fs.ArgsLenAtDash(); d >= 0 {
		positional, after = fs.Args()[:d], fs.Args()[d:]
	}
	if cmd.Name() == "install" && cmd.HasParent() && (cmd.Parent().Name() == "agent" || cmd.Parent().Name() == "serve") {
		if len(positional) > 0 {
			return fmt.Errorf("%s: %q before --: the %s flags go after --", cmd.CommandPath(), positional[0], cmd.Parent().Name())
		}
		if err := shadowFlags(cmd.Parent()).Parse(after); err != nil && !(mention && strings.Contains(err.Error(), "flag needs an argument")) {
			return fmt.Errorf("%s -- …: %w", cmd.CommandPath(), err)
		}
		return nil
	}
	if err := cmd.ValidateArgs(append(positional, after...)); err != nil && !mention {
		return fmt.Errorf("%s: %w", cmd.CommandPath(), err)
	}
	return nil
}

// shadowFlags is a flag set with cmd's flags (its own, its parents' persistent ones
// and help) that records nothing: parsing it checks names and values without setting
// the command's variables.
func shadowFlags(cmd *cobra.Command) *pflag.FlagSet {
	fs := pflag.NewFlagSet(cmd.CommandPath(), pflag.ContinueOnError)
	fs.SetOutput(discard{})
	add := func(f *pflag.Flag) {
		if fs.Lookup(f.Name) != nil {
			return
		}
		shadow := fs.VarPF(&anyValue{typ: f.Value.Type()}, f.Name, f.Shorthand, "")
		shadow.NoOptDefVal = f.NoOptDefVal
	}
	cmd.InitDefaultHelpFlag()
	cmd.InitDefaultVersionFlag()
	cmd.LocalFlags().VisitAll(add)
	cmd.InheritedFlags().VisitAll(add)
	return fs
}

// anyValue takes any value of a flag (placeholders such as NAME or <mac> included),
// except where its type is a number or a boolean and the value is neither.
type anyValue struct{ typ string }

func (v *anyValue) String() string { return "" }
func (v *anyValue) Type() string   { return v.typ }
func (v *anyValue) Set(s string) error {
	if v.typ == "bool" && s != "true" && s != "false" {
		return fmt.Errorf("not a boolean: %q", s)
	}
	return nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func indexFunc(s []string, f func(string) bool) int {
	for i, w := range s {
		if f(w) {
			return i
		}
	}
	return -1
}

// TestDocumentedCommands: every `macfleet …` command line of the README, docs/, the
// formula's caveats and the chart's NOTES.txt parses through the real command tree.
func TestDocumentedCommands(t *testing.T) {
	cmds := docCommands(t)
	if len(cmds) < 40 {
		t.Fatalf("found %d documented command lines; the extraction lost them", len(cmds))
	}
	for _, c := range cmds {
		if err := checkCommand(c.args, c.mention); err != nil {
			t.Errorf("%s\n\t%v", c.where, err)
		}
	}
	t.Logf("%d documented command lines checked", len(cmds))
}

// TestDocumentedCommandsCatchARename: the check fails on a documented flag renamed,
// a command renamed, a flag of the installed command before --, and a positional
// argument a command does not take; and passes what the docs write.
func TestDocumentedCommandsCatchARename(t *testing.T) {
	for _, tc := range []struct {
		line string
		ok   bool
	}{
		{"macfleet serve --model tiny=hf://o/r/f.gguf", true},
		{"macfleet serve --modle tiny=hf://o/r/f.gguf", false},
		{"macfleet serv --model x", false},
		{"macfleet agent install -- --kubeconfig node.kubeconfig --node-name mac-1", true},
		{"macfleet agent install --kubeconfig node.kubeconfig", false},
		{"macfleet agent install -- --kubeconfig-file node.kubeconfig", false},
		{"macfleet version extra", false},
		{"sudo macfleet serve install --system -- --model NAME=…", true},
		{"macfleet gateway --stream-keepalive 5s", true},
	} {
		cmds := commandsIn(tc.line)
		if len(cmds) != 1 {
			t.Fatalf("%q: %d commands", tc.line, len(cmds))
		}
		if err := checkCommand(cmds[0], false); (err == nil) != tc.ok {
			t.Errorf("%q: %v, want ok %v", tc.line, err, tc.ok)
		}
	}
	// serve's --model renamed in the command tree: the documented lines that use it
	// fail, and only those.
	f := commandFlag(t, "serve", "model")
	f.Name = "source"
	t.Cleanup(func() { f.Name = "model" })
	failed, naming := 0, 0
	for _, c := range docCommands(t) {
		if checkCommand(c.args, c.mention) != nil {
			failed++
			if slices.Contains(c.args, "--model") || slices.ContainsFunc(c.args, func(w string) bool { return strings.HasPrefix(w, "--model=") }) {
				naming++
			}
		}
	}
	if failed == 0 || failed != naming {
		t.Errorf("with serve's --model renamed, %d documented lines fail, %d of them naming --model; want some, all naming it", failed, naming)
	}
}

// commandFlag is the flag name of the command at path.
func commandFlag(t *testing.T, path, name string) *pflag.Flag {
	t.Helper()
	cmd, _, err := root.Find(strings.Fields(path))
	if err != nil {
		t.Fatal(err)
	}
	f := cmd.Flags().Lookup(name)
	if f == nil {
		t.Fatalf("%s has no --%s", path, name)
	}
	return f
}

// TestSnippets: what is taken as a command line, and what is not.
func TestSnippets(t *testing.T) {
	md := "The macfleet agent runs on `macfleet agent --node-name X`.\n```sh\nmacfleet nodes credentials mac-1 \\\n  -o mac-1.kubeconfig && echo ok # done\n```\n"
	var got []string
	for _, s := range snippets(md, true) {
		for _, c := range commandsIn(s.text) {
			got = append(got, strings.Join(c, " "))
		}
	}
	want := []string{"agent --node-name X", "nodes credentials mac-1 -o mac-1.kubeconfig"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("got %q, want %q", got, want)
	}
	rb := "      On one Mac:        macfleet serve --model hf://OWNER/REPO/FILE.gguf\n  macfleet {{ .Chart.AppVersion }} is installed\n"
	got = nil
	for _, s := range snippets(rb, false) {
		for _, c := range commandsIn(s.text) {
			got = append(got, strings.Join(c, " "))
		}
	}
	want = []string{"serve --model hf://OWNER/REPO/FILE.gguf"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("got %q, want %q", got, want)
	}
}
