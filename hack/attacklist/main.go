// Command attacklist keeps `make attack` honest about which attacks it runs. The
// attack tests (TestAttack*, docs/security.md) are listed, per package and platform,
// in hack/attacks.txt; a test that is renamed, deleted, or moved behind a build
// constraint would otherwise drop out of `go test -run '^TestAttack'` silently.
//
//	attacklist -list hack/attacks.txt -goos linux,darwin
//
// reads the test files of the module as `go test` would build them for each GOOS
// (file suffixes and build constraints) and fails when a listed test is missing or a
// TestAttack test is not listed.
//
//	attacklist -list hack/attacks.txt -ran LOG
//
// fails when a test listed for this platform has no PASS or FAIL line in LOG (the
// output of `go test -v`): it did not run.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
)

func main() {
	list := flag.String("list", "hack/attacks.txt", "the list of expected attack tests")
	goos := flag.String("goos", runtime.GOOS, "comma-separated platforms whose test files are checked against the list")
	ran := flag.String("ran", "", "a `go test -v` log: check instead that every test listed for this platform ran")
	flag.Parse()
	problems, err := run(*list, *goos, *ran)
	if err != nil {
		fmt.Fprintln(os.Stderr, "attacklist:", err)
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, p)
	}
	if len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "%d problems with the attack tests of %s: fix the test or the list\n", len(problems), *list)
		os.Exit(1)
	}
}

func run(listFile, goos, ranLog string) ([]string, error) {
	f, err := os.Open(listFile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	want, err := parseList(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", listFile, err)
	}
	if ranLog != "" {
		b, err := os.ReadFile(ranLog)
		if err != nil {
			return nil, err
		}
		return notRun(want, runtime.GOOS, string(b)), nil
	}
	var problems []string
	for _, g := range strings.Split(goos, ",") {
		found, err := scan(".", g)
		if err != nil {
			return nil, err
		}
		problems = append(problems, check(want, g, found)...)
	}
	return problems, nil
}

// Expected is one line of the list: a test of a package, run on some platforms.
type Expected struct {
	Package string   // "./gateway"
	GOOS    []string // nil: every platform
	Test    string
}

func (e Expected) on(goos string) bool { return e.GOOS == nil || slices.Contains(e.GOOS, goos) }

// parseList reads lines "PACKAGE GOOS TEST" ("all", or platforms joined by commas),
// skipping blank lines and # comments. A test may be listed once.
func parseList(r io.Reader) ([]Expected, error) {
	var out []Expected
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 3 || !strings.HasPrefix(fields[0], "./") || !strings.HasPrefix(fields[2], "TestAttack") {
			return nil, fmt.Errorf("line %d: %q: want \"./PACKAGE GOOS TestAttack...\"", n, sc.Text())
		}
		e := Expected{Package: fields[0], Test: fields[2]}
		if fields[1] != "all" {
			e.GOOS = strings.Split(fields[1], ",")
		}
		if seen[e.Test] {
			return nil, fmt.Errorf("line %d: %s is listed twice (test names must be unique to be found in a log)", n, e.Test)
		}
		seen[e.Test] = true
		out = append(out, e)
	}
	return out, sc.Err()
}

// check compares the list with found (package → the TestAttack tests its test files
// hold for goos): a listed test that is not there, and a test there that is not
// listed, are each a problem.
func check(want []Expected, goos string, found map[string][]string) []string {
	var problems []string
	listed := map[string]bool{}
	for _, e := range want {
		if !e.on(goos) {
			continue
		}
		listed[e.Package+" "+e.Test] = true
		if !slices.Contains(found[e.Package], e.Test) {
			problems = append(problems, fmt.Sprintf("%s: %s %s is listed but no test file for %s defines it (renamed, deleted or behind a build constraint?)",
				goos, e.Package, e.Test, goos))
		}
	}
	for _, pkg := range sortedKeys(found) {
		for _, t := range found[pkg] {
			if !listed[pkg+" "+t] {
				problems = append(problems, fmt.Sprintf("%s: %s %s is an attack test missing from the list: add it", goos, pkg, t))
			}
		}
	}
	return problems
}

var resultLine = regexp.MustCompile(`^\s*--- (PASS|FAIL): (TestAttack\w+)`)

// notRun is each test listed for goos that has no top-level PASS or FAIL line in log.
func notRun(want []Expected, goos, log string) []string {
	ran := map[string]bool{}
	for _, l := range strings.Split(log, "\n") {
		if m := resultLine.FindStringSubmatch(l); m != nil {
			ran[m[2]] = true
		}
	}
	var problems []string
	for _, e := range want {
		if e.on(goos) && !ran[e.Test] {
			problems = append(problems, fmt.Sprintf("%s: %s %s did not run", goos, e.Package, e.Test))
		}
	}
	return problems
}

func sortedKeys(m map[string][]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
