#!/usr/bin/env bash
# Usage: hack/deps.sh GOAL...        GOAL: demo, test, peers
#
# Installs what GOAL needs before any slow build starts, so a fresh machine fails in
# seconds or not at all, never after a 15-minute build:
#   - the Debian packages of hack/deps/debian.txt for GOAL, when missing: as root, or
#     through sudo without a password; where neither works (or there is no apt-get) it
#     exits 1 at once naming the command to run;
#   - for test, the npm clients pinned in hack/npm/package-lock.json, `npm ci`-ed into
#     $CACHE_DIR/npm (default ~/.cache/macfleet/npm), where test/e2e finds them.
# `make demo` and `make test` run it first; .ci/run relies on them doing so.
#
# DPKG_ADMINDIR (dpkg's own variable) points the check at another package database:
# hack/fresh-machine-test.sh uses an empty one to see the machine as a fresh one would.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${CACHE_DIR:-$HOME/.cache/macfleet}
(($# > 0)) || { echo "usage: $0 GOAL... (demo, test, peers)" >&2; exit 2; }

say() { printf 'deps: %s\n' "$*" >&2; }

# wanted GOAL...: the packages any GOAL names, skipping those whose command is on PATH.
wanted() {
	local pkg goals cmd rest g want
	while read -r pkg goals cmd rest; do
		[[ -z $pkg || $pkg == \#* ]] && continue
		for want in "$@"; do
			for g in ${goals//,/ }; do
				if [[ $g == "$want" ]]; then
					[[ $cmd != - ]] && command -v "$cmd" >/dev/null && continue 3
					echo "$pkg"
					continue 3
				fi
			done
		done
	done <"$root/hack/deps/debian.txt"
}

installed() { dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q '^install ok installed$'; }

debian() {
	if ! command -v dpkg-query >/dev/null; then
		# Not Debian (a Mac, another distribution): nothing to ask, so say what is needed.
		say "not a Debian system; make sure you have the equivalents of: $(wanted "$@" | xargs)"
		[[ $(uname -s) == Darwin ]] && say "on macOS: xcode-select --install; brew install nlohmann-json node"
		return 0
	fi
	local missing=() p
	while read -r p; do
		installed "$p" || missing+=("$p")
	done < <(wanted "$@")
	((${#missing[@]} == 0)) && return 0
	local cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" sudo=()
	if ((EUID != 0)); then
		if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
			sudo=(sudo -n)
		else
			say "missing Debian packages: ${missing[*]}"
			say "this user cannot install them (not root, no sudo without a password); run:"
			echo "    sudo sh -c '$cmd'" >&2
			exit 1
		fi
	fi
	if ! command -v apt-get >/dev/null; then
		say "missing Debian packages: ${missing[*]}, and apt-get is not here to install them; run:"
		echo "    $cmd" >&2
		exit 1
	fi
	say "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	"${sudo[@]}" apt-get update -q >&2 || say "apt-get update failed; trying the install anyway"
	if ! "${sudo[@]}" apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 "${missing[@]}" >&2; then
		say "installing failed; run:"
		echo "    ${sudo[*]:+sudo }sh -c '$cmd'" >&2
		exit 1
	fi
}

npm_clients() {
	local dir=$cache/npm lock=$root/hack/npm/package-lock.json
	if [[ -d $dir/node_modules ]] && cmp -s "$lock" "$dir/package-lock.json"; then
		return 0
	fi
	say "installing the npm clients of hack/npm/package-lock.json into $dir"
	mkdir -p "$dir"
	cp "$root/hack/npm/package.json" "$lock" "$dir/"
	# npm ci needs the lock beside package.json; a failed install removes the copy so
	# the next run does not take it for a complete one.
	(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2) || {
		rm -f "$dir/package-lock.json"
		say "npm ci failed in $dir"
		exit 1
	}
}

debian "$@"
for g in "$@"; do
	[[ $g == test ]] && npm_clients
done
exit 0
