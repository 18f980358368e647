package main

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// measured is the counters' run on testdata/mod with testdata/limits.txt, whose
// files say in comments what each measure must find.
var measured = sync.OnceValues(func() (map[string]result, error) {
	cfg, err := readConfig("testdata/limits.txt")
	if err != nil {
		return nil, err
	}
	results, err := measure("testdata/mod", cfg)
	byName := map[string]result{}
	for _, r := range results {
		byName[r.name] = r
	}
	return byName, err
})

// check compares a measure of the test module with its expected offenders (and so
// its count).
func check(t *testing.T, name string, want []string) result {
	t.Helper()
	results, err := measured()
	if err != nil {
		t.Fatal(err)
	}
	r, ok := results[name]
	if !ok {
		t.Fatalf("no measure %s", name)
	}
	if r.count != len(want) {
		t.Errorf("%s = %d, want %d", name, r.count, len(want))
	}
	if diff := cmp.Diff(want, r.offenders); diff != "" {
		t.Errorf("%s offenders (-want +got):\n%s", name, diff)
	}
	return r
}

func TestPointerOnlyMethods(t *testing.T) {
	check(t, "pointer-only-methods", []string{
		"controllers/ctl/ctl.go:12 holder.acquire",
		"pool/load.go:9 loader.await",
		"pool/load.go:14 loader.start",
		"pool/load.go:16 loader.startLocked",
	})
}

func TestPoolLockSites(t *testing.T) {
	check(t, "pool-lock-sites", []string{
		"pool/load.go:18 loader.startLocked: mu.Lock()",
		"pool/pool.go:42 state.read: s.mu.RLock()",
		"pool/pool.go:49 Pool.Acquire: p.mu.Lock()",
		"pool/settle.go:19 guarded.inc: g.Lock()",
	})
}

func TestLockedHelpersOutsideState(t *testing.T) {
	check(t, "locked-helpers-outside-state", []string{
		"pool/load.go:16 loader.startLocked",
		"pool/settle.go:8 Pool.settleLocked",
		"pool/settle.go:10 helperLocked",
	})
}

// TestLockedHelpersStateType names another state type: its …Locked methods are the
// ones no longer counted.
func TestLockedHelpersStateType(t *testing.T) {
	m, err := scanModule("testdata/mod")
	if err != nil {
		t.Fatal(err)
	}
	pkgs, err := loadTyped(m, []string{"pool"})
	if err != nil {
		t.Fatal(err)
	}
	got := lockedHelpers(m, pkgs["pool"], "loader").offenders
	want := []string{"pool/pool.go:39 state.addLocked", "pool/settle.go:8 Pool.settleLocked", "pool/settle.go:10 helperLocked"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("…Locked helpers outside loader (-want +got):\n%s", diff)
	}
}

func TestAcquireWalk(t *testing.T) {
	stays := check(t, "acquire-stays", []string{
		"stay 1: pool/pool.go Pool.Acquire, state.addLocked",
		"stay 2: pool/load.go loader.await",
		"stay 3: pool/pool.go state.addLocked",
		"stay 4: pool/load.go ",
		"stay 5: pool/pool.go ",
		"stay 6: pool/settle.go Pool.settleLocked",
		"stay 7: pool/pool.go ",
		"stay 8: pool/load.go loader.start, loader.startLocked",
		"stay 9: pool/pool.go ",
		"stay 10: pool/settle.go wakeUp",
		"stay 11: pool/pool.go state.read",
	})
	tour := []string{"pool.go", "load.go", "pool.go", "load.go", "pool.go", "settle.go", "pool.go", "load.go", "pool.go", "settle.go", "pool.go"}
	if diff := cmp.Diff(tour, stays.tour); diff != "" {
		t.Errorf("acquire's tour (-want +got):\n%s", diff)
	}
	check(t, "acquire-returns", []string{
		"stay 3: pool/pool.go state.addLocked",
		"stay 4: pool/load.go ",
		"stay 5: pool/pool.go ",
		"stay 7: pool/pool.go ",
		"stay 8: pool/load.go loader.start, loader.startLocked",
		"stay 9: pool/pool.go ",
		"stay 10: pool/settle.go wakeUp",
		"stay 11: pool/pool.go state.read",
	})
}

// walkTestPool walks w in the test module's pool package.
func walkTestPool(t *testing.T, w walk, fields bool) (result, result, error) {
	t.Helper()
	m, err := scanModule("testdata/mod")
	if err != nil {
		t.Fatal(err)
	}
	pkgs, err := loadTyped(m, []string{"pool"})
	if err != nil {
		t.Fatal(err)
	}
	return walkCalls(m, pkgs["pool"], w, fields)
}

// TestAcquireWalkWithoutFields does not enter the functions stored in func-typed
// fields: the call of p.wake stays in pool.go.
func TestAcquireWalkWithoutFields(t *testing.T) {
	stays, returns, err := walkTestPool(t, walk{name: "acquire", pkg: "pool", root: "(*Pool).Acquire"}, false)
	if err != nil {
		t.Fatal(err)
	}
	tour := []string{"pool.go", "load.go", "pool.go", "load.go", "pool.go", "settle.go", "pool.go", "load.go", "pool.go"}
	if diff := cmp.Diff(tour, stays.tour); diff != "" {
		t.Errorf("acquire's tour without fields (-want +got):\n%s", diff)
	}
	if stays.count != 9 || returns.count != 6 {
		t.Errorf("stays, returns = %d, %d; want 9, 6", stays.count, returns.count)
	}
}

// TestFollowedWalk follows Route's model: only the calls passed it or a value made
// from it (testdata/mod/pool/route.go says the tour).
func TestFollowedWalk(t *testing.T) {
	stays, returns, err := walkTestPool(t, walk{name: "route", pkg: "pool", root: "(*Pool).Route", param: "model"}, true)
	if err != nil {
		t.Fatal(err)
	}
	tour := []string{"route.go", "admit.go", "route.go", "admit.go", "route.go"}
	if diff := cmp.Diff(tour, stays.tour); diff != "" {
		t.Errorf("route's tour (-want +got):\n%s", diff)
	}
	if stays.count != 5 || returns.count != 3 {
		t.Errorf("stays, returns = %d, %d; want 5, 3", stays.count, returns.count)
	}
	if _, _, err := walkTestPool(t, walk{name: "route", pkg: "pool", root: "(*Pool).Route", param: "nothing"}, true); err == nil {
		t.Error("a walk of a parameter the root does not have passed")
	}
}

func TestGatewayWideParams(t *testing.T) {
	check(t, "gateway-wide-params", []string{
		"gateway/gw.go:4 seven (7 parameters)",
		"gateway/gw.go:13 G.seven (7 parameters)",
		"gateway/sub/sub.go:4 eight (8 parameters)",
	})
}

func TestInternalUpwardImports(t *testing.T) {
	check(t, "internal-upward-imports", []string{
		"internal/app/app.go:7 internal/app (layer 4 app) imports internal/tool (layer 3 components)",
		"internal/app/app.go:8 internal/app (layer 4 app) imports pool (layer 2 engine)",
		"internal/lib/lib.go:4 internal/lib (layer 0 ground) imports internal/rules (layer 1 domain)",
		"internal/tool/tool.go:6 internal/tool (layer 3 components) imports controllers/ctl (layer 3 components)",
	})
}

func TestLongFunctions(t *testing.T) {
	check(t, "long-functions", []string{
		"controllers/ctl/long.go:4 long81 (81 lines)",
		"controllers/ctl/long.go:173 literal81 (func literal) (81 lines)",
	})
}

// TestWidestMethodSet counts value and pointer receivers together, over files and
// type parameters, in the folders of methods-under and below; the types at the widest
// count are its offenders (testdata/mod/wide/wide.go says what each has).
func TestWidestMethodSet(t *testing.T) {
	results, err := measured()
	if err != nil {
		t.Fatal(err)
	}
	r := results["widest-method-set"]
	want := []string{"wide/sub/sub.go:4 Deep (5 methods)", "wide/wide.go:7 Wide (5 methods)", "wide/wide.go:14 Box (5 methods)"}
	if r.count != 5 {
		t.Errorf("widest-method-set = %d, want 5", r.count)
	}
	if diff := cmp.Diff(want, r.offenders); diff != "" {
		t.Errorf("widest-method-set offenders (-want +got):\n%s", diff)
	}
	m, err := scanModule("testdata/mod")
	if err != nil {
		t.Fatal(err)
	}
	// wideout's Out (7 methods) counts once its folder is listed; wide/wide.go alone
	// (a folder of that name, not a prefix) does not take wideout in.
	if got := widestMethodSet(m, []string{"wide", "wideout"}); got.count != 7 ||
		!slices.Equal(got.offenders, []string{"wideout/out.go:4 Out (7 methods)"}) {
		t.Errorf("widest-method-set over wide and wideout = %d %v, want 7 [wideout/out.go:4 Out (7 methods)]", got.count, got.offenders)
	}
	if got := widestMethodSet(m, []string{"wide/sub"}); got.count != 5 || len(got.offenders) != 1 {
		t.Errorf("widest-method-set over wide/sub = %d %v, want 5 and Deep alone", got.count, got.offenders)
	}
}

// TestReport fails a measure over its limit, with its offenders, and passes one at it.
func TestReport(t *testing.T) {
	cfg := config{limits: map[string]int{"a": 1, "b": 2}, order: []string{"a", "b"}}
	results := []result{{name: "a", count: 2, offenders: []string{"x.go:1 f", "x.go:2 g"}}, {name: "b", count: 2, offenders: []string{"y.go:1 h"}}}
	var out bytes.Buffer
	ok, err := report(&out, cfg, results, false)
	if err != nil || ok {
		t.Fatalf("report = %v, %v; want false, nil", ok, err)
	}
	want := "a                                  2  limit     1  FAILED\n    x.go:1 f\n    x.go:2 g\n" +
		"b                                  2  limit     2  ok\n"
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	results[0].count = 1
	if ok, err := report(&bytes.Buffer{}, cfg, results, false); err != nil || !ok {
		t.Errorf("report at the limits = %v, %v; want true, nil", ok, err)
	}
}

// TestReportNeedsEveryLimit refuses a measure without a limit and a limit without a
// measure.
func TestReportNeedsEveryLimit(t *testing.T) {
	cfg := config{limits: map[string]int{"a": 1}, order: []string{"a"}}
	if _, err := report(&bytes.Buffer{}, cfg, []result{{name: "b"}}, false); err == nil {
		t.Error("a measure without a limit passed")
	}
	if _, err := report(&bytes.Buffer{}, cfg, nil, false); err == nil {
		t.Error("a limit without a measure passed")
	}
}

func TestReadConfigRejects(t *testing.T) {
	for _, line := range []string{"a -1", "a x", "a 1 2", "a 1\na 2", "walk acquire pool", "params-max six", "walk-fields maybe", "methods-under"} {
		path := filepath.Join(t.TempDir(), "limits.txt")
		if err := os.WriteFile(path, []byte(line+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readConfig(path); err == nil {
			t.Errorf("readConfig accepted %q", line)
		}
	}
}

// TestRepositoryLimits checks that the repository's limits file sets a limit for each
// measure, each with a comment that names the target.
func TestRepositoryLimits(t *testing.T) {
	cfg, err := readConfig("limits.txt")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"pointer-only-methods", "pool-lock-sites", "locked-helpers-outside-state",
		"acquire-stays", "acquire-returns", "gateway-wide-params", "internal-upward-imports", "long-functions",
		"widest-method-set"}
	// The measures, each with its target, and beside them two walks counted
	// the other way (every call of an acquire; a request through the gateway).
	all := slices.Insert(slices.Clone(want), 5, "acquire-calls-stays", "acquire-calls-returns", "request-stays", "request-returns")
	if diff := cmp.Diff(all, cfg.order); diff != "" {
		t.Errorf("limits.txt's measures (-want +got):\n%s", diff)
	}
	data, _ := os.ReadFile("limits.txt")
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 0 && slices.Contains(want, f[0]) && !strings.Contains(line, "# target") {
			t.Errorf("limits.txt: %q names no target", line)
		}
	}
}

// TestTestModuleAtItsLimits passes the test module at testdata/limits.txt and fails it
// with any limit one lower.
func TestTestModuleAtItsLimits(t *testing.T) {
	results, err := measured()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := readConfig("testdata/limits.txt")
	if err != nil {
		t.Fatal(err)
	}
	var list []result
	for _, name := range cfg.order {
		list = append(list, results[name])
	}
	if ok, err := report(&bytes.Buffer{}, cfg, list, false); err != nil || !ok {
		t.Fatalf("report at testdata/limits.txt = %v, %v; want true, nil", ok, err)
	}
	for _, name := range cfg.order {
		lower := config{limits: maps.Clone(cfg.limits), order: cfg.order}
		lower.limits[name]--
		if ok, _ := report(&bytes.Buffer{}, lower, list, false); ok {
			t.Errorf("%s one under its count passed", name)
		}
	}
}
