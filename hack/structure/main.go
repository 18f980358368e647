// Command structure counts the shapes of the code that the house style and
// docs/architecture.md ask to keep small (one owner per piece of state, short
// functions, narrow signatures, layers that only look down), and fails
// when a count is over its limit in limits.txt beside it:
//
//   - pointer-only-methods: methods of a type whose struct holds one field, a pointer
//     to another named type of the module (the owner under another name);
//   - pool-lock-sites: calls of Lock or RLock on a sync.Mutex or RWMutex in the pool
//     package;
//   - locked-helpers-outside-state: functions of the pool package named …Locked whose
//     receiver is not the pool's state type;
//   - NAME-stays and NAME-returns, for each `walk` of the limits file: the static call
//     walk from a root function through the functions of its package, as the files
//     control passes through (a stay is a run of one file; a return is a stay in a
//     file that had one before); with a PARAM, the walk follows that parameter of the
//     root (the calls passed it, or a value made from it: follow.go), without one it
//     enters every call and counts the way back to each caller too (walk.go);
//   - gateway-wide-params: functions under gateway/ with more than 6 parameters;
//   - internal-upward-imports: imports from internal/ above the layer the library
//     folder may reach (docs/architecture.md's table, read by test/layering);
//   - long-functions: functions whose body runs over 80 lines, outside hack/;
//   - widest-method-set: the most methods (value and pointer receivers together) on
//     one named type of the folders that methods-under lists (metal/runner/server).
//
// Test files and generated files are not counted. Usage, from the repository root:
//
//	go run ./hack/structure [-v] [-root DIR] [-limits FILE] [-state-type NAME]
//
// It prints one line per measure (name, count, limit, ok or FAILED) and under a failed
// one its offenders (file:line name); -v prints every walk's files and every offender.
// It exits 1 when a count is over its limit, 2 when it cannot count.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// result is one measure's count and what makes it up.
type result struct {
	name      string
	count     int
	offenders []string
	tour      []string // a walk's files, one per stay
}

func main() {
	root := flag.String("root", ".", "the module's root directory")
	limits := flag.String("limits", "", "the limits file (default ROOT/hack/structure/limits.txt)")
	verbose := flag.Bool("v", false, "print each walk's files and every measure's offenders")
	stateType := flag.String("state-type", "", "the pool's state type (overrides the limits file's state-type)")
	flag.Parse()
	if *limits == "" {
		*limits = filepath.Join(*root, "hack", "structure", "limits.txt")
	}
	cfg, err := readConfig(*limits)
	if err != nil {
		fmt.Fprintln(os.Stderr, "structure:", err)
		os.Exit(2)
	}
	if *stateType != "" {
		cfg.stateType = *stateType
	}
	results, err := measure(*root, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "structure:", err)
		os.Exit(2)
	}
	ok, err := report(os.Stdout, cfg, results, *verbose)
	if err != nil {
		fmt.Fprintln(os.Stderr, "structure:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// measure runs every measure of cfg on the module at root.
func measure(root string, cfg config) ([]result, error) {
	m, err := scanModule(root)
	if err != nil {
		return nil, err
	}
	results := []result{pointerOnlyMethods(m)}
	pool, err := measurePool(m, cfg)
	if err != nil {
		return nil, err
	}
	results = append(results, pool...)
	results = append(results, wideParams(m, cfg.paramsUnder, cfg.paramsMax))
	up, err := internalUpwardImports(m, cfg)
	if err != nil {
		return nil, err
	}
	results = append(results, up, longFunctions(m, cfg.bodyMax), widestMethodSet(m, cfg.methodsUnder))
	return results, nil
}

// report prints results against the limits of cfg and reports whether all are within
// them. A measure without a limit, or a limit without a measure, is an error.
func report(w io.Writer, cfg config, results []result, verbose bool) (bool, error) {
	ok, seen := true, map[string]bool{}
	for _, r := range results {
		seen[r.name] = true
		limit, found := cfg.limits[r.name]
		if !found {
			return false, fmt.Errorf("%s has no limit in the limits file", r.name)
		}
		verdict := "ok"
		if r.count > limit {
			verdict, ok = "FAILED", false
		}
		fmt.Fprintf(w, "%-30s %5d  limit %5d  %s\n", r.name, r.count, limit, verdict)
		if verbose && len(r.tour) > 0 {
			fmt.Fprintf(w, "    %s\n", strings.Join(r.tour, " → "))
		}
		if verdict == "FAILED" || verbose {
			for _, o := range r.offenders {
				fmt.Fprintf(w, "    %s\n", o)
			}
		}
	}
	for _, name := range cfg.order {
		if !seen[name] {
			return false, fmt.Errorf("the limits file names %s, which is no measure", name)
		}
	}
	return ok, nil
}
