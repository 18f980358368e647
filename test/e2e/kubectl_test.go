package e2e

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/test/support/testenv"
)

// kubectl runs the real kubectl as the fleet's admin in namespace ns ("" for none) and
// returns its output.
func kubectl(t *testing.T, ns string, args ...string) string {
	t.Helper()
	assets, err := testenv.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"--kubeconfig", fleet.AdminKubeconfig}
	if ns != "" {
		base = append(base, "-n", ns)
	}
	out, err := exec.CommandContext(t.Context(), filepath.Join(assets, "kubectl"), append(base, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// columns reads kubectl's table output into one map per row, keyed by header.
func columns(out string) []map[string]string {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) < 2 {
		return nil
	}
	// Headers are single words; each column starts where its header does.
	header := lines[0]
	var starts []int
	var names []string
	for _, m := range regexp.MustCompile(`\S+`).FindAllStringIndex(header, -1) {
		starts, names = append(starts, m[0]), append(names, header[m[0]:m[1]])
	}
	var rows []map[string]string
	for _, line := range lines[1:] {
		row := map[string]string{}
		for i, s := range starts {
			end := len(line)
			if i+1 < len(starts) && starts[i+1] < end {
				end = starts[i+1]
			}
			if s < len(line) {
				row[names[i]] = strings.TrimSpace(line[s:end])
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// TestKubectlShowsMemoryInOneUnit: `kubectl get md,mr,mn` prints every memory column
// for people, one decimal in MiB or GiB, where it printed raw quantities ("131Mi"
// beside "102488Ki") before.
func TestKubectlShowsMemoryInOneUnit(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "columns", 1))
	waitReady(t, ns, "columns", 1, 3*time.Minute)

	human := regexp.MustCompile(`^(0 B|\d+\.\d [KMGT]iB)$`) // an idle Mac commits 0 B
	check := func(what string, rows []map[string]string, cols ...string) (bool, string) {
		if len(rows) == 0 {
			return false, what + ": no rows"
		}
		for _, row := range rows {
			for _, c := range cols {
				if !human.MatchString(row[c]) {
					return false, what + " " + c + " is " + `"` + row[c] + `"`
				}
			}
		}
		return true, ""
	}
	// MEASURED appears once the replica's peak has reached the deployment's status.
	testenv.Eventually(t, time.Minute, 250*time.Millisecond, func() (bool, string) {
		return check("kubectl get md -o wide", columns(kubectl(t, ns, "get", "md", "-o", "wide")), "MEMORY", "MEASURED")
	})
	testenv.Eventually(t, time.Minute, 250*time.Millisecond, func() (bool, string) {
		return check("kubectl get mr", columns(kubectl(t, ns, "get", "mr")), "RESERVED", "RESIDENT")
	})
	testenv.Eventually(t, time.Minute, 250*time.Millisecond, func() (bool, string) {
		return check("kubectl get mn", columns(kubectl(t, "", "get", "mn")), "CEILING", "REPORTED", "USED", "COMMITTED")
	})
}
