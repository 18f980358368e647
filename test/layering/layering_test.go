package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the depguard rules of .golangci.yml from the layer table")

// synthetic is a small table in the document's format.
const synthetic = `# Layers
<!-- layers:begin -->
| layer | name | packages | what |
|---|---|---|---|
| 0 | wire | ` + "`api/...`" + ` | wire types |
| 1 | ground | ` + "`lib/...`, `pool`" + ` | libraries |
| 2 | app | ` + "`app/...`" + ` | composition root |
| 3 | test | ` + "`test/...`, `app/x/xtest`" + ` | harnesses |
<!-- layers:end -->
| 9 | outside | ` + "`ignored`" + ` | not in the table |
`

func syntheticLayers(t *testing.T) []Layer {
	t.Helper()
	layers, err := ParseTable([]byte(synthetic))
	if err != nil {
		t.Fatal(err)
	}
	return layers
}

func TestParseTable(t *testing.T) {
	want := []Layer{
		{Rank: 0, Name: "wire", Patterns: []string{"api/..."}},
		{Rank: 1, Name: "ground", Patterns: []string{"lib/...", "pool"}},
		{Rank: 2, Name: "app", Patterns: []string{"app/..."}},
		{Rank: 3, Name: "test", Patterns: []string{"test/...", "app/x/xtest"}},
	}
	if diff := cmp.Diff(want, syntheticLayers(t)); diff != "" {
		t.Errorf("ParseTable (-want +got):\n%s", diff)
	}
}

func TestParseTableRejects(t *testing.T) {
	for name, doc := range map[string]string{
		"no table":         "# nothing here\n",
		"a pattern twice":  "<!-- layers:begin -->\n| 0 | a | `x` | |\n| 1 | b | `x` | |\n<!-- layers:end -->\n",
		"a rank skipped":   "<!-- layers:begin -->\n| 0 | a | `x` | |\n| 2 | b | `y` | |\n<!-- layers:end -->\n",
		"a layer unfilled": "<!-- layers:begin -->\n| 0 | a | none | |\n<!-- layers:end -->\n",
		"ranks not from 0": "<!-- layers:begin -->\n| 1 | a | `x` | |\n<!-- layers:end -->\n",
	} {
		if layers, err := ParseTable([]byte(doc)); err == nil {
			t.Errorf("%s: ParseTable = %+v, want an error", name, layers)
		}
	}
}

func TestLayerOfPicksTheMostSpecificPattern(t *testing.T) {
	layers := syntheticLayers(t)
	for path, want := range map[string]string{
		"api":              "wire",
		"api/v1":           "wire",
		"pool":             "ground",
		"lib/a/b":          "ground",
		"app/x":            "app",
		"app/x/xtest":      "test", // nested in app/... but named on its own
		"test/support/env": "test",
	} {
		got, ok := LayerOf(layers, path)
		if !ok || got.Name != want {
			t.Errorf("LayerOf(%s) = %q, %v; want %q", path, got.Name, ok, want)
		}
	}
	for _, path := range []string{"poolside", "pool/sub", "apis", "other"} {
		if got, ok := LayerOf(layers, path); ok {
			t.Errorf("LayerOf(%s) = %q, want no layer", path, got.Name)
		}
	}
}

// TestCheckCatchesUpwardImports feeds Check a package graph with one import of each
// kind and expects exactly the upward ones.
func TestCheckCatchesUpwardImports(t *testing.T) {
	layers := syntheticLayers(t)
	pkgs := []Package{
		{Path: "api/v1", Imports: []string{"api/wire"}},                        // same layer
		{Path: "lib/estimate", Imports: []string{"api/v1", "pool", "app/mgr"}}, // down, same, up
		{Path: "pool", Imports: []string{"test/support/env"}},                  // up, two floors
		{Path: "app/mgr", Imports: []string{"lib/estimate", "app/x/xtest"}},    // down, up into a nested helper
		{Path: "app/x/xtest", Imports: []string{"test/support/env", "app/mgr"}},
		{Path: "test/support/env", Imports: []string{"api/v1", "github.com/elsewhere/pkg"}},
		{Path: "stray", Imports: []string{"app/mgr"}},
	}
	got, unassigned := Check(layers, pkgs)
	var gotS []string
	for _, v := range got {
		gotS = append(gotS, v.String())
	}
	want := []string{
		"app/mgr (layer 2 app) imports app/x/xtest (layer 3 test)",
		"lib/estimate (layer 1 ground) imports app/mgr (layer 2 app)",
		"pool (layer 1 ground) imports test/support/env (layer 3 test)",
	}
	if diff := cmp.Diff(want, gotS); diff != "" {
		t.Errorf("violations (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"stray"}, unassigned); diff != "" {
		t.Errorf("unassigned (-want +got):\n%s", diff)
	}
}

// TestReachingCatchesWhatLiftsAFolder feeds Reaching a folder with a package placed
// above its top and imports of each kind, and expects exactly what rises above it.
func TestReachingCatchesWhatLiftsAFolder(t *testing.T) {
	layers := syntheticLayers(t)
	pkgs := []Package{
		{Path: "lib/estimate", Imports: []string{"api/v1", "pool"}},                   // down and level: fine
		{Path: "lib/cache", Imports: []string{"app/mgr", "app/x/xtest", "elsewhere"}}, // two floors up
		{Path: "lib/root", Imports: []string{"lib/estimate"}},
		{Path: "libs", Imports: []string{"app/mgr"}},         // not under lib/
		{Path: "app/mgr", Imports: []string{"lib/estimate"}}, // not under lib/
	}
	// lib/root is placed above the folder's top by a more specific pattern.
	layers[2].Patterns = append(layers[2].Patterns, "lib/root")
	want := []string{
		"lib/cache imports app/mgr (layer 2 app)",
		"lib/cache imports app/x/xtest (layer 3 test)",
		"lib/root is in layer 2 app",
	}
	if diff := cmp.Diff(want, Reaching(layers, pkgs, "lib", 1)); diff != "" {
		t.Errorf("Reaching (-want +got):\n%s", diff)
	}
	if got := Reaching(layers, pkgs, "lib", 3); len(got) != 0 {
		t.Errorf("Reaching with the top layer as the bound = %q, want nothing", got)
	}
}

func TestDepguardRules(t *testing.T) {
	got := Depguard(syntheticLayers(t), "example.com/m", "")
	for _, want := range []string{
		"layer-0-wire:\n  list-mode: lax\n  files:\n    - \"${base-path}/api/**\"\n    - \"!$test\"\n",
		"layer-1-ground:\n  list-mode: lax\n  files:\n    - \"${base-path}/lib/**\"\n    - \"${base-path}/pool/*.go\"\n",
		// app/... holds a package of the test layer: its files are not the app's.
		"layer-2-app:\n  list-mode: lax\n  files:\n    - \"${base-path}/app/**\"\n    - \"!${base-path}/app/x/xtest/*.go\"\n",
		"    - pkg: \"example.com/m/app$\"\n      desc: \"layer 1 ground imports nothing of layer 2 app (docs/architecture.md)\"\n",
		"    - pkg: \"example.com/m/app/\"\n",
		"    - pkg: \"example.com/m/app/x/xtest$\"\n      desc: \"layer 2 app imports nothing of layer 3 test (docs/architecture.md)\"\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Depguard lacks\n%s\nin\n%s", want, got)
		}
	}
	if strings.Contains(got, "layer-3-test") {
		t.Errorf("the top layer has nothing to deny, but got a rule for it:\n%s", got)
	}
	if strings.Contains(got, `pkg: "example.com/m/api`) {
		t.Errorf("a rule denies the ground floor, which every layer may import:\n%s", got)
	}
}

// moduleRoot returns the module's directory and path.
func moduleRoot(t *testing.T) (dir, path string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}} {{.Path}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		t.Fatalf("go list -m printed %q", out)
	}
	return f[0], f[1]
}

func readTable(t *testing.T, root string) []Layer {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	layers, err := ParseTable(doc)
	if err != nil {
		t.Fatalf("docs/architecture.md: %v", err)
	}
	return layers
}

// listPackages runs `go list` over the module for one platform and returns its
// packages with their non-test imports inside the module.
func listPackages(t *testing.T, root, module, goos, goarch string) []Package {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,Error", "./...")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list (%s/%s): %v\n%s", goos, goarch, err, stderr.String())
	}
	var pkgs []Package
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
			Error      *struct{ Err string }
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list (%s/%s) %s: %s", goos, goarch, p.ImportPath, p.Error.Err)
		}
		pkg := Package{Path: relative(module, p.ImportPath)}
		for _, imp := range p.Imports {
			if rel := relative(module, imp); rel != imp {
				pkg.Imports = append(pkg.Imports, rel)
			}
		}
		pkgs = append(pkgs, pkg)
	}
	if len(pkgs) == 0 {
		t.Fatalf("go list (%s/%s) listed no package", goos, goarch)
	}
	return pkgs
}

func relative(module, path string) string {
	if rel, ok := strings.CutPrefix(path, module+"/"); ok {
		return rel
	}
	return path
}

// TestNoUpwardImports checks every non-test import of the module, on Linux and on
// macOS (files with build constraints import differently), against the layer table.
func TestNoUpwardImports(t *testing.T) {
	root, module := moduleRoot(t)
	layers := readTable(t, root)
	violations, unassigned := Check(layers, modulePackages(t, root, module))
	seen := map[string]bool{}
	for _, v := range violations {
		if s := v.String(); !seen[s] {
			seen[s] = true
			t.Errorf("upward import: %s", s)
		}
	}
	for _, p := range slices.Compact(unassigned) {
		t.Errorf("package %s is in no layer of docs/architecture.md: add it to the table", p)
	}
}

// modulePackages lists the module's packages on Linux and on macOS (files with build
// constraints import differently), each platform's listing after the other.
func modulePackages(t *testing.T, root, module string) []Package {
	t.Helper()
	var all []Package
	for _, p := range [][2]string{{"linux", "amd64"}, {"darwin", "arm64"}} {
		all = append(all, listPackages(t, root, module, p[0], p[1])...)
	}
	if !slices.ContainsFunc(all, func(p Package) bool { return p.Path == "test/layering" }) {
		t.Fatalf("go list did not list this package; the listing is not of the module")
	}
	return all
}

// libraryTop is the highest layer a package under internal/ may be in or import.
const libraryTop = "domain"

// TestInternalHoldsOnlyLibraries keeps internal/ to the libraries of layers 1 ground
// and 2 domain: no package there is placed higher, and none imports the engine pool,
// a component, a composition root or a main. Composition roots and commands live
// beside their main under cmd/.
func TestInternalHoldsOnlyLibraries(t *testing.T) {
	root, module := moduleRoot(t)
	layers := readTable(t, root)
	top := slices.IndexFunc(layers, func(l Layer) bool { return l.Name == libraryTop })
	if top < 0 {
		t.Fatalf("docs/architecture.md has no layer %q", libraryTop)
	}
	for _, r := range Reaching(layers, modulePackages(t, root, module), "internal", layers[top].Rank) {
		t.Errorf("internal/ reaches above layer %d %s: %s", layers[top].Rank, libraryTop, r)
	}
}

const (
	yamlBegin = "# layers:begin"
	yamlEnd   = "# layers:end"
)

// TestDepguardMirrorsLayers keeps the depguard rules of .golangci.yml equal to the
// layer table (go test ./test/layering -run DepguardMirrors -update rewrites them).
func TestDepguardMirrorsLayers(t *testing.T) {
	root, module := moduleRoot(t)
	layers := readTable(t, root)
	path := filepath.Join(root, ".golangci.yml")
	cfg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(cfg)
	b, e := strings.Index(s, yamlBegin), strings.Index(s, yamlEnd)
	if b < 0 || e < b {
		t.Fatalf(".golangci.yml has no %q ... %q block", yamlBegin, yamlEnd)
	}
	b += strings.Index(s[b:], "\n") + 1
	lineStart := strings.LastIndex(s[:e], "\n") + 1
	indent := s[lineStart:e]
	want := Depguard(layers, module, indent)
	if got := s[b:lineStart]; got != want {
		if *update {
			if err := os.WriteFile(path, []byte(s[:b]+want+s[lineStart:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("the depguard rules of .golangci.yml differ from docs/architecture.md's layers; run\n"+
			"  go test ./test/layering -run DepguardMirrors -update\n%s", fmt.Sprintf("want:\n%s", want))
	}
}
