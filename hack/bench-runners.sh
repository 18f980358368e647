#!/usr/bin/env bash
# Usage: [RUNNERS_FLAGS="-rounds 5 ..."] hack/bench-runners.sh COMMIT...
#
# Builds the runner of each COMMIT (once; cached in ~/.cache/macfleet/runners/SHA) with
# this tree's cgo flags (hack/go-env.sh), so only the runner's own code differs between
# them, and compares them side by side with test/bench/runners: interleaved rounds of one
# stream's decode and four streams' aggregate, on the same synthesized model. The last
# commit is the baseline of the ratios. RUNNERS_FLAGS go to test/bench/runners (-rounds,
# -threads, …; `go run ./test/bench/runners -h`).
#
#	RUNNERS_FLAGS='-rounds 5' hack/bench-runners.sh 6959d71 9e0d756 HEAD
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${MACFLEET_CACHE:-$HOME/.cache/macfleet}/runners"
read -r -a flags <<<"${RUNNERS_FLAGS:-}"
if [[ $# -eq 0 ]]; then
	sed -n '2,10p' "$0" >&2
	exit 2
fi

mkdir -p "$cache"
bins=()
for c in "$@"; do
	sha="$(git -C "$root" rev-parse --short=12 "$c^{commit}")"
	bin="$cache/$sha"
	if [[ ! -x "$bin" ]]; then
		wt="$(mktemp -d)"
		git -C "$root" worktree add --detach "$wt" "$sha" >/dev/null
		echo "building the runner of $c ($sha)" >&2
		if ! (cd "$wt" && "$root/hack/go-env.sh" go build -o "$bin.tmp" ./cmd/macfleet-runner); then
			git -C "$root" worktree remove --force "$wt"
			exit 1
		fi
		git -C "$root" worktree remove --force "$wt"
		mv "$bin.tmp" "$bin"
	fi
	bins+=("$bin")
done
cd "$root"
exec go run ./test/bench/runners ${flags[@]+"${flags[@]}"} "${bins[@]}"
