#!/usr/bin/env bash
# Usage: hack/build-macfleet-at.sh COMMIT
#
# Builds the pure-Go macfleet binary of COMMIT (once; cached in
# ~/.cache/macfleet/macfleet-at/SHA) from its files alone (git archive into a temporary
# directory: no worktree, nothing of this checkout), and prints its path. `make
# bench-abuse` runs the gateway of an earlier commit beside this tree's with it.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${MACFLEET_CACHE:-$HOME/.cache/macfleet}/macfleet-at"
if [[ $# -ne 1 ]]; then
	sed -n '2,7p' "$0" >&2
	exit 2
fi
sha="$(git -C "$root" rev-parse --short=12 "$1^{commit}")"
bin="$cache/$sha"
if [[ ! -x "$bin" ]]; then
	mkdir -p "$cache"
	src="$(mktemp -d)"
	trap 'rm -rf "$src"' EXIT
	git -C "$root" archive "$sha" | tar -x -C "$src"
	echo "building macfleet of $1 ($sha)" >&2
	(cd "$src" && CGO_ENABLED=0 go build -trimpath -o "$bin.tmp" ./cmd/macfleet)
	mv "$bin.tmp" "$bin"
fi
echo "$bin"
