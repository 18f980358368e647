#!/usr/bin/env bash
# Usage: hack/step.sh NAME COMMAND...
#
# Runs one component's build (kube-apiserver, etcd, kubectl, helm, macfleet, the runner)
# and says where the first build is: "[N/M] NAME", N and M from $MACFLEET_STEPS (the
# components this make run builds from nothing, set by the Makefile), and the time since
# make started ($MACFLEET_STEPS_START). On a terminal with pv, the packages `go build -v`
# compiles drive pv's counter and timer; elsewhere (CI logs) one line when the step
# starts and one when it ends. A failing build's output is printed whole.
set -euo pipefail
name=$1
shift
start=$SECONDS
now=$(date +%s)
since=${MACFLEET_STEPS_START:-$now}
clock() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

label=$name
read -r -a steps <<<"${MACFLEET_STEPS:-}"
for i in "${!steps[@]}"; do
	[[ ${steps[$i]} == "$name" ]] && label="[$((i + 1))/${#steps[@]}] $name"
done
echo "==> $label: building ($(clock $((now - since))) since make started)" >&2

if [[ -t 2 ]] && command -v pv >/dev/null; then
	log=$(mktemp)
	trap 'rm -f "$log"' EXIT
	rc=0
	{ GOFLAGS="-v${GOFLAGS:+ $GOFLAGS}" "$@" 2>&1 1>&3 | tee "$log" | pv -l -t -b -N "$label (packages)" >/dev/null; } 3>&1 || rc=$?
	if ((rc != 0)); then
		cat "$log" >&2
		echo "==> $label: FAILED after $(clock $((SECONDS - start)))" >&2
		exit "$rc"
	fi
else
	"$@"
fi
echo "==> $label: built in $(clock $((SECONDS - start))), $(clock $(($(date +%s) - since))) since make started" >&2
