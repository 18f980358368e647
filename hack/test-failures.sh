#!/usr/bin/env bash
# Usage: hack/test-failures.sh GO_TEST_OUTPUT
#
# Prints what a reader of a failed run needs from go test's output, in a few dozen
# lines: each "--- FAIL" line with the indented lines the test logged under it (at most
# 40 a test), each failed package's line, and the races the race detector found (the
# first 60 lines of each report). Exits 0; prints nothing for a run without failures.
set -euo pipefail
log=${1:?usage: hack/test-failures.sh GO_TEST_OUTPUT}
[[ -f $log ]] || exit 0
out=$(awk '
	/^WARNING: DATA RACE/ { race = 60; races++ }
	race > 0 { print; race = /^==================$/ ? 0 : race - 1; next }
	/^ *--- FAIL/ { print; keep = 40; next }
	keep > 0 && /^    / { print; keep--; next }
	{ keep = 0 }
	/^(FAIL|panic:)/ { print }
	END { if (races) printf "%d data race report(s) above\n", races }
' "$log")
[[ -z $out ]] || printf '\n=== the failed tests, again\n%s\n' "$out"
