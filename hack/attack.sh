#!/usr/bin/env bash
# Runs every TestAttack* test of the module: each tries one exploit of
# docs/security.md against real components (the local fleet, real runners, real
# HTTP clients) and passes only if the attack gets the answer it must now get.
# Prints one line per attack at the end; exits non-zero if any failed.
#
# hack/attacks.txt lists the attack tests per package and platform: before the run,
# hack/attacklist checks it against the test files as each platform builds them (a
# renamed, deleted or platform-bound test fails here, as does one not listed), and
# after it, that every test listed for this platform ran.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
hack/go-env.sh go test -count=1 ./hack/attacklist/
hack/go-env.sh go run ./hack/attacklist -list hack/attacks.txt -goos linux,darwin
hack/go-env.sh go test -race -p 1 -count=1 -timeout 30m -run '^TestAttack' -v ./... 2>&1 | tee "$log" || status=$?
echo
echo "== attacks (docs/security.md)"
if ! grep -E -- '^\s*--- (PASS|FAIL|SKIP): TestAttack' "$log"; then
	echo "no TestAttack test ran"
	exit 1
fi
if grep -qE -- '^\s*--- SKIP: TestAttack' "$log"; then
	echo "an attack was skipped: every attack must run"
	status=1
fi
if ! hack/go-env.sh go run ./hack/attacklist -list hack/attacks.txt -ran "$log"; then
	status=1
fi
exit "$status"
