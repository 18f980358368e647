#!/usr/bin/env bash
# Usage: hack/bench-hotpaths.sh BASE [NEW [ROUNDS]]
#
# The gateway's request path (gateway's BenchmarkOverhead and the other Overhead
# benchmarks: each p50 against the same request without the part measured) and the
# agent's relay path (agent/server's BenchmarkCopyStream: a runner's SSE event
# relayed to the client) of BASE against NEW (default HEAD), each commit's own test
# binaries built in a temporary git worktree, ROUNDS rounds (default 3) alternating
# the two, the order swapped every round. Prints each run's benchmark lines under a
# "== <path> <base|new> round <i> (load ...)" header.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $# -lt 1 || $# -gt 3 ]]; then
	sed -n '2,10p' "$0" >&2
	exit 2
fi
declare -A commit=([base]="$(git -C "$root" rev-parse --short=12 "$1^{commit}")"
	[new]="$(git -C "$root" rev-parse --short=12 "${2:-HEAD}^{commit}")")
rounds="${3:-3}"
work="$(mktemp -d)"
cleanup() {
	for w in base new; do git -C "$root" worktree remove --force "$work/$w-tree" >/dev/null 2>&1 || true; done
	rm -rf "$work"
}
trap cleanup EXIT
for w in base new; do
	echo "building the test binaries of $w (${commit[$w]})" >&2
	git -C "$root" worktree add --detach "$work/$w-tree" "${commit[$w]}" >/dev/null 2>&1
	(cd "$work/$w-tree" && go test -c -o "$work/$w-gw.test" ./gateway &&
		go test -c -o "$work/$w-agent.test" ./agent/server)
done

run() { # run PATH base|new: one run of PATH's benchmarks with that commit's binary, in its package
	case "$1" in
	gateway) (cd "$work/$2-tree/gateway" && "$work/$2-gw.test" -test.run '^$' -test.bench 'Overhead' -test.benchtime 3000x) ;;
	agent) (cd "$work/$2-tree/agent/server" && "$work/$2-agent.test" -test.run '^$' -test.bench 'CopyStream' \
		-test.benchtime 300000x -test.benchmem) ;;
	esac
}
for path in gateway agent; do
	for ((i = 1; i <= rounds; i++)); do
		order="base new"
		if ((i % 2 == 0)); then order="new base"; fi
		for w in $order; do
			echo "== $path $w round $i (load $(cut -d' ' -f1-3 /proc/loadavg))"
			run "$path" "$w" 2>&1 | grep -E '^Benchmark'
		done
	done
done
