package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseList(t *testing.T) {
	got, err := parseList(strings.NewReader("# comment\n\n./gateway all TestAttackA # why\n./metal/x linux,darwin TestAttackB\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Expected{{Package: "./gateway", Test: "TestAttackA"}, {Package: "./metal/x", GOOS: []string{"linux", "darwin"}, Test: "TestAttackB"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("parseList (-want +got):\n%s", d)
	}
	for _, bad := range []string{"./gateway TestAttackA\n", "gateway all TestAttackA\n", "./gateway all TestOther\n",
		"./a all TestAttackA\n./b all TestAttackA\n"} {
		if _, err := parseList(strings.NewReader(bad)); err == nil {
			t.Errorf("parseList(%q): no error", bad)
		}
	}
}

// TestCheck: a listed test no file defines fails the check, and so does an attack
// test the list misses; a test listed for another platform is not expected here.
func TestCheck(t *testing.T) {
	list := []Expected{{Package: "./a", Test: "TestAttackA"}, {Package: "./b", GOOS: []string{"linux"}, Test: "TestAttackLinux"}}
	for _, tc := range []struct {
		name  string
		goos  string
		found map[string][]string
		want  []string // substrings of the problems, in order
	}{
		{"all there", "linux", map[string][]string{"./a": {"TestAttackA"}, "./b": {"TestAttackLinux"}}, nil},
		{"a platform without the linux one", "darwin", map[string][]string{"./a": {"TestAttackA"}}, nil},
		{"a listed test that does not exist", "linux", map[string][]string{"./a": {"TestAttackA"}},
			[]string{"linux: ./b TestAttackLinux is listed but no test file for linux defines it"}},
		{"a renamed test", "darwin", map[string][]string{"./a": {"TestAttackRenamed"}},
			[]string{"./a TestAttackA is listed but", "./a TestAttackRenamed is an attack test missing from the list"}},
		{"a test moved to another package", "darwin", map[string][]string{"./c": {"TestAttackA"}},
			[]string{"./a TestAttackA is listed but", "./c TestAttackA is an attack test missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := check(list, tc.goos, tc.found)
			if len(got) != len(tc.want) {
				t.Fatalf("check = %q, want %d problems", got, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

func TestNotRun(t *testing.T) {
	list := []Expected{{Package: "./a", Test: "TestAttackA"}, {Package: "./a", Test: "TestAttackB"},
		{Package: "./b", GOOS: []string{"darwin"}, Test: "TestAttackMac"}}
	log := "=== RUN   TestAttackA\n--- PASS: TestAttackA (0.01s)\n=== RUN   TestAttackB\n    --- SKIP: TestAttackB/x\n"
	got := notRun(list, "linux", log)
	if d := cmp.Diff([]string{"linux: ./a TestAttackB did not run"}, got); d != "" {
		t.Errorf("notRun (-want +got):\n%s", d)
	}
}

// TestTheListMatchesTheModule: hack/attacks.txt names exactly the attack tests of
// this module, on each platform the fleet runs on (and one it does not), and a list
// naming a test that does not exist fails the command as `make attack` runs it.
func TestTheListMatchesTheModule(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(root)
	problems, err := run("hack/attacks.txt", "linux,darwin,windows", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}

	b, err := os.ReadFile("hack/attacks.txt")
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "attacks.txt")
	if err := os.WriteFile(bad, append(b, "./gateway all TestAttackThatDoesNotExist\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	problems, err = run(bad, "linux", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != 1 || !strings.Contains(problems[0], "./gateway TestAttackThatDoesNotExist is listed but no test file") {
		t.Errorf("a list naming a test that does not exist: problems %q, want that one", problems)
	}
}
