#!/usr/bin/env bash
# Runs every Go fuzz target of the module for $FUZZTIME each (default 10000x, inputs
# rather than seconds): the parsers of untrusted input (request bodies, model
# sources, GGUF headers, plists, model output). A failure leaves the crashing input
# under the package's testdata/fuzz/<Target>/, which `go test` then replays as a
# regular test. A count, not a duration, by default: with a duration, Go 1.26's fuzz
# coordinator can fail a target at the deadline with "context deadline exceeded"
# having found nothing (seen in CI on a loaded machine).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fuzztime=${FUZZTIME:-10000x}
# The targets of test/runner drive real runner and worker processes (a second or so an
# input): FUZZTIME_PROCESS inputs each (they skip without $MACFLEET_RUNNER).
fuzztime_process=${FUZZTIME_PROCESS:-50x}
failed=()
while IFS= read -r file; do
	pkg=./$(dirname "$file")
	n=$fuzztime
	[[ $pkg == ./test/runner ]] && n=$fuzztime_process
	for target in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(f \*testing\.F).*/\1/p' "$file"); do
		echo "=== $pkg $target ($n)"
		if ! hack/go-env.sh go test -run '^$' -fuzz "^${target}\$" -fuzztime "$n" "$pkg"; then
			failed+=("$pkg $target")
		fi
	done
done < <(grep -rl --include='*_test.go' '^func Fuzz' . | sed 's|^\./||' | sort)
# FUZZ_ASAN=1: the split worker's target again, against a runner built with
# AddressSanitizer (go build -asan instruments the C and C++ of ggml and the worker),
# FUZZTIME_ASAN inputs (default 200x): a read or write outside an allocation ends the
# worker with ASan's report rather than one of ggml's assertions, which the target
# fails on, printing the report.
if [[ ${FUZZ_ASAN:-} == 1 ]]; then
	asan_runner="${TMPDIR:-/tmp}/macfleet-fuzz-asan/macfleet-runner"
	echo "=== ./test/runner FuzzWorkerProtocol (AddressSanitizer, ${FUZZTIME_ASAN:-200x})"
	if ! GOFLAGS="${GOFLAGS:+$GOFLAGS }-asan" hack/build-runner.sh "$asan_runner" ||
		! ASAN_OPTIONS=detect_leaks=0 MACFLEET_RUNNER="$asan_runner" hack/go-env.sh go test -run '^$' \
			-fuzz '^FuzzWorkerProtocol$' -fuzztime "${FUZZTIME_ASAN:-200x}" ./test/runner; then
		failed+=("./test/runner FuzzWorkerProtocol (AddressSanitizer)")
	fi
fi
if ((${#failed[@]})); then
	printf 'fuzz target failed: %s\n' "${failed[@]}"
	exit 1
fi
