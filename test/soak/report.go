package soak

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// formatReport is the soak's report in markdown.
func formatReport(seed uint64, d, elapsed, converged time.Duration, kinds map[string]Counts, total Counts, scales int,
	faults, violations []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Soak of %s (seed %d): traffic for %s.\n\n", d, seed, elapsed.Round(time.Second))
	b.WriteString("| requests | sent | succeeded | failed before first byte | broken mid-stream | retries |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|\n")
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	slices.Sort(names)
	row := func(name string, c Counts) {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d |\n", name, c.Sent, c.Succeeded, c.FailedBeforeFirstByte, c.BrokenMidStream, c.Retries)
	}
	for _, k := range names {
		row(k, kinds[k])
	}
	row("**total**", total)
	fmt.Fprintf(&b, "\n%d faults, and chat scaled %d times:\n\n", len(faults), scales)
	for _, f := range faults {
		fmt.Fprintf(&b, "- %s\n", f)
	}
	if violations == nil {
		fmt.Fprintf(&b, "\nConverged %s after the traffic: every deployment Ready, no orphan runners, no leaked "+
			"reservations, each MacNode's committed memory equal to its Loaded replicas' reservations.\n", converged.Round(100*time.Millisecond))
	} else {
		fmt.Fprintf(&b, "\nNOT converged:\n\n- %s\n", strings.Join(violations, "\n- "))
	}
	return b.String()
}
