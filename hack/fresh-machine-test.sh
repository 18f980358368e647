#!/usr/bin/env bash
# Usage: hack/fresh-machine-test.sh [--reinstall]
#
# Proves that the README's two commands set up a fresh machine themselves (`make
# fresh-machine-test`; .ci/run runs it first, with --reinstall):
#
#  1. Seen as a fresh machine by a user who cannot install anything — an empty dpkg
#     database (DPKG_ADMINDIR), running as nobody, no sudo — `make demo` and `make test`
#     each fail within 10 s, naming the apt-get command and the packages. (Before
#     hack/deps.sh they went straight into a 15-minute build and failed at its end.)
#  2. With --reinstall, as root: some of the build's Debian packages are really removed,
#     then `DEMO_EXIT=1 make demo` must install its own again and pass, and the first
#     step of `make test` (make deps for the test goal) the tests' own. On a machine
#     without the build caches this is the cold first run a newcomer makes; its time is
#     printed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
reinstall=false
[[ ${1:-} == --reinstall ]] && reinstall=true

fail() { echo "FAIL: $*" >&2; exit 1; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# 1. A user who cannot install: the command must fail fast and say what to run.
mkdir -p "$scratch/dpkg" "$scratch/home" "$scratch/tree"
: >"$scratch/dpkg/status"
# The checkout may sit where nobody cannot read it (under /root): the Makefile and hack/
# are what make reads before it fails, so nobody runs a copy of them.
cp -r Makefile hack "$scratch/tree/"
# No sudo either, whatever this machine's user may do.
mkdir -p "$scratch/bin"
printf '#!/bin/sh\necho "sudo: a password is required" >&2\nexit 1\n' >"$scratch/bin/sudo"
chmod -R a+rwX "$scratch"
chmod a+rx "$scratch"
as_nobody=(setpriv --reuid=nobody --regid=nogroup --clear-groups
	env -i PATH="$scratch/bin:$PATH" HOME="$scratch/home" DPKG_ADMINDIR="$scratch/dpkg" TERM=dumb)
if ((EUID != 0)); then
	# Not root: this user is already one who may not be able to install; check as it.
	as_nobody=(env PATH="$scratch/bin:$PATH" HOME="$scratch/home" DPKG_ADMINDIR="$scratch/dpkg")
fi
for goal in demo test; do
	start=$(date +%s%N)
	rc=0
	out=$(timeout 20 "${as_nobody[@]}" make -C "$scratch/tree" --no-print-directory "$goal" 2>&1) || rc=$?
	ms=$((($(date +%s%N) - start) / 1000000))
	echo "make $goal as a user who cannot install, on an empty package database: exit $rc after ${ms} ms"
	sed 's/^/    /' <<<"$out" | tail -8
	((rc != 0)) || fail "make $goal passed without its packages"
	((ms <= 10000)) || fail "make $goal took ${ms} ms to fail; it must fail within 10 s, before any build"
	grep -q 'apt-get install' <<<"$out" || fail "make $goal did not name the apt-get command"
	grep -q 'nlohmann-json3-dev' <<<"$out" || fail "make $goal did not name the missing nlohmann-json3-dev"
done
[[ $reinstall == true ]] || { echo "ok (without --reinstall: the installing half was not run)"; exit 0; }

# 2. As root, remove what the build needs and let make demo put it back.
installed() { dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q '^install ok installed$'; }
((EUID == 0)) || fail "--reinstall needs root"
# Of the demo's packages and the tests' own; the rest (a compiler, chromium) is too big
# to fetch again on every run.
demo_packages=(nlohmann-json3-dev pv)
test_packages=(python3-jinja2)
removable=("${demo_packages[@]}" "${test_packages[@]}")
echo "removing ${removable[*]}"
DEBIAN_FRONTEND=noninteractive apt-get remove -y -q "${removable[@]}" >/dev/null
for p in "${removable[@]}"; do
	! installed "$p" || fail "$p is still installed"
done
start=$SECONDS
DEMO_EXIT=1 make --no-print-directory demo
echo "DEMO_EXIT=1 make demo installed the packages and passed in $((SECONDS - start)) s"
for p in "${demo_packages[@]}"; do
	installed "$p" || fail "make demo did not install $p"
done
# make test's first step: the demo's packages and the tests' own (and the npm clients).
make --no-print-directory deps DEPS_GOALS=test
for p in "${test_packages[@]}"; do
	installed "$p" || fail "make test's deps step did not install $p"
done
echo ok
