package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// formulaURL is a url line of a formula and the sha256 line after it.
var formulaURL = regexp.MustCompile(`(?m)^\s+url "([^"]+)"\n\s+sha256 "([0-9a-f]{64})"$`)

// formulaSums are the archives a formula downloads, by name, with the sha256 it
// expects of each.
func formulaSums(formula string) map[string]string {
	out := map[string]string{}
	for _, m := range formulaURL.FindAllStringSubmatch(formula, -1) {
		out[m[1][strings.LastIndex(m[1], "/")+1:]] = m[2]
	}
	return out
}

// checkFormulaSums says which archive of dir a formula names with another sha256 than
// the file's, or lacks.
func checkFormulaSums(t *testing.T, formula string, archives []string) {
	t.Helper()
	got := formulaSums(formula)
	if len(got) != len(archives) {
		t.Errorf("the formula downloads %d archives (%v); want %d", len(got), got, len(archives))
	}
	for _, a := range archives {
		b, err := os.ReadFile(a)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		if got[filepath.Base(a)] != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: the formula's sha256 %q; the file's %x", filepath.Base(a), got[filepath.Base(a)], sum)
		}
	}
}

// tapVersion is the version of the test's release.
const tapVersion = "v1.2.3"

// writeTestTap writes archives of every platform (and the runner's) as `make release`
// writes them and renders the tap from hack/homebrew/macfleet.rb; it returns the tap's
// directory and the archives.
func writeTestTap(t *testing.T) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	var archives []string
	write := func(binary, platform string, data []byte) {
		name := filepath.Join(dir, archiveName(binary, tapVersion, platform))
		f := archiveFile{Name: binary, Mode: 0o755, Data: data}
		b, err := writeArchive(strings.TrimSuffix(filepath.Base(name), ".tar.gz"), []archiveFile{f}, time.Unix(1_700_000_000, 0))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
		archives = append(archives, name)
	}
	for _, p := range CLIPlatforms {
		write("macfleet", p, []byte("macfleet for "+p))
	}
	write("macfleet-runner", RunnerPlatform, []byte("runner"))

	source := filepath.Join(repoRoot(t), "hack", "homebrew", "macfleet.rb")
	tap := filepath.Join(dir, "homebrew-tap")
	args := append([]string{"-version", tapVersion, "-formula", source, "-o", tap}, archives...)
	if err := runTap(args); err != nil {
		t.Fatal(err)
	}
	return tap, archives
}

// TestTapFormula renders the tap's formula from hack/homebrew/macfleet.rb and archives
// written as `make release` writes them: each url is the release's, with the sha256 of
// that archive; the runner is Apple Silicon's resource; only the marker line changed,
// so the caveats cmd/macfleet's TestDocumentedCommands parses are the tap's.
func TestTapFormula(t *testing.T) {
	const version = tapVersion
	tap, archives := writeTestTap(t)
	source := filepath.Join(repoRoot(t), "hack", "homebrew", "macfleet.rb")
	b, err := os.ReadFile(filepath.Join(tap, "Formula", "macfleet.rb"))
	if err != nil {
		t.Fatal(err)
	}
	formula := string(b)
	checkFormulaSums(t, formula, archives)
	for name := range formulaSums(formula) {
		if want := "https://github.com/macfleet/macfleet/releases/download/" + version + "/" + name; !strings.Contains(formula, `"`+want+`"`) {
			t.Errorf("%s is not downloaded from %s", name, want)
		}
	}
	if !strings.Contains(formula, "  version \"1.2.3\"\n") {
		t.Error("the formula does not say version 1.2.3")
	}
	// The runner is the resource of Apple Silicon Macs only.
	arm := formula[strings.Index(formula, "on_macos do"):strings.Index(formula, "on_intel do")]
	if !strings.Contains(arm, `resource "runner" do`) || strings.Count(formula, `resource "runner"`) != 1 {
		t.Errorf("the runner is not Apple Silicon's one resource:\n%s", formula)
	}
	src, err := os.ReadFile(source)
	if err != nil {
		t.Fatal(err)
	}
	if before, after, _ := strings.Cut(string(src), releaseMarker+"\n"); !strings.HasPrefix(formula, before) || !strings.HasSuffix(formula, after) {
		t.Error("rendering changed more of the formula than its release marker")
	}
	rubySyntax(t, filepath.Join(tap, "Formula", "macfleet.rb"))
}

// rubySyntax checks a formula's Ruby syntax where this machine has ruby.
func rubySyntax(t *testing.T, formula string) {
	t.Helper()
	ruby, err := exec.LookPath("ruby")
	if err != nil {
		t.Log("no ruby on this machine: the formula's syntax is not checked")
		return
	}
	if out, err := exec.CommandContext(t.Context(), ruby, "-c", formula).CombinedOutput(); err != nil {
		t.Errorf("ruby -c %s: %v\n%s", formula, err, out)
	}
}

// TestTapFormulaInstallsPerPlatform evaluates the tap's formula, with a stand-in for the
// part of Homebrew's DSL it uses (testdata/brew.rb), as an Apple Silicon Mac, an Intel
// Mac and Linux on either CPU would: each downloads its own archive with its sha256 and
// installs macfleet; only Apple Silicon gets the runner.
func TestTapFormulaInstallsPerPlatform(t *testing.T) {
	ruby, err := exec.LookPath("ruby")
	if err != nil {
		t.Skip("no ruby on this machine")
	}
	tap, archives := writeTestTap(t)
	sum := func(name string) string {
		for _, a := range archives {
			if filepath.Base(a) == name {
				b, err := os.ReadFile(a)
				if err != nil {
					t.Fatal(err)
				}
				return fmt.Sprintf("%x", sha256.Sum256(b))
			}
		}
		t.Fatalf("no archive %s", name)
		return ""
	}
	base := "https://github.com/macfleet/macfleet/releases/download/" + tapVersion + "/"
	for _, p := range CLIPlatforms {
		goos, goarch, _ := strings.Cut(p, "/")
		name := archiveName("macfleet", tapVersion, p)
		want := []string{"version 1.2.3", "url " + base + name, "sha256 " + sum(name)}
		if p == RunnerPlatform {
			runner := archiveName("macfleet-runner", tapVersion, p)
			want = append(want, "resource runner url "+base+runner, "resource runner sha256 "+sum(runner))
		}
		want = append(want, "bin macfleet")
		if p == RunnerPlatform {
			want = append(want, "bin macfleet-runner")
		}
		out, err := exec.CommandContext(t.Context(), ruby, filepath.Join("testdata", "brew.rb"),
			filepath.Join(tap, "Formula", "macfleet.rb"), goos, goarch).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", p, err, out)
		}
		if diff := cmp.Diff(want, strings.Split(strings.TrimSpace(string(out)), "\n")); diff != "" {
			t.Errorf("%s: what the formula does (-want +got):\n%s", p, diff)
		}
	}
}

// TestTapFormulaRefuses: a release missing one platform's archive, or a formula without
// its marker, writes no tap; a release without the runner still does (Linux's `make
// release`), with no runner resource.
func TestTapFormulaRefuses(t *testing.T) {
	sums := map[string]string{}
	for _, p := range CLIPlatforms {
		sums[archiveName("macfleet", "v1.0.0", p)] = strings.Repeat("a", 64)
	}
	release, err := formulaRelease("v1.0.0", "https://example.com/r/", sums)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(release, "resource") || !strings.Contains(release, `url "https://example.com/r/macfleet-v1.0.0-linux-arm64.tar.gz"`) {
		t.Errorf("release without the runner:\n%s", release)
	}
	delete(sums, archiveName("macfleet", "v1.0.0", "darwin/amd64"))
	if _, err := formulaRelease("v1.0.0", "https://example.com/r", sums); err == nil ||
		!strings.Contains(err.Error(), "macfleet-v1.0.0-darwin-amd64.tar.gz") {
		t.Errorf("a release without darwin/amd64: %v; want it named", err)
	}
	if _, err := renderFormula("class Macfleet < Formula\nend\n", release); err == nil {
		t.Error("a formula without the marker was rendered")
	}
}
