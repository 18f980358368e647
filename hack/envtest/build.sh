#!/usr/bin/env bash
# Build the kube-apiserver, etcd and kubectl that envtest suites and `make dev-cluster`
# run, from the Go modules pinned in hack/envtest/go.mod and hack/envtest/etcd/go.mod
# (nothing can be downloaded from release buckets here, and a fresh machine needs only
# the Go module proxy).
#
#   hack/envtest/build.sh DIR K8S_VERSION ETCD_VERSION
#
# DIR is a per-version cache directory (the Makefile passes
# ~/.cache/macfleet/k8s/<k8s>-etcd<etcd>). The binaries are built into a sibling
# temporary directory and renamed into place only when all three run, so an interrupted
# build never leaves a half-filled cache. A complete DIR is left alone. Concurrent
# invocations for the same DIR serialise on a lock file.
set -euo pipefail

if [[ $# -ne 3 ]]; then
	echo "usage: $0 DIR K8S_VERSION ETCD_VERSION" >&2
	exit 2
fi
dir=${1%/}
k8s=${2#v}
etcd=${3#v}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bins=(kube-apiserver etcd kubectl)

log() { printf 'envtest: %s\n' "$*" >&2; }
die() {
	log "$*"
	exit 1
}

complete() {
	local b
	for b in "${bins[@]}"; do
		[[ -x "$dir/$b" ]] || return 1
	done
}

if complete; then
	log "$dir is up to date"
	exit 0
fi

# The pinned modules decide what gets built; refuse a version that disagrees with them
# rather than caching binaries under the wrong name.
export GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0
pinned_k8s=$(go -C "$here" list -m -f '{{.Version}}' k8s.io/kubernetes)
pinned_etcd=$(go -C "$here/etcd" list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
[[ $pinned_k8s == "v$k8s" ]] ||
	die "asked for kubernetes v$k8s but hack/envtest/go.mod pins $pinned_k8s"
[[ $pinned_etcd == "v$etcd" ]] ||
	die "asked for etcd v$etcd but hack/envtest/etcd/go.mod pins $pinned_etcd"

mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
if ! flock -n 9; then
	log "another build of $dir is running; waiting for it"
	flock 9
fi
if complete; then
	log "$dir was built by another process"
	exit 0
fi

tmp=$(mktemp -d "$dir.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The version stamps Kubernetes' own release build sets (hack/lib/version.sh there), so
# `kube-apiserver --version` and `kubectl version` report v$k8s instead of v0.0.0-master.
# The build date is the module's publication time, which keeps the binaries reproducible.
major=${k8s%%.*}
minor=${k8s#*.}
minor=${minor%%.*}
build_date=$(go -C "$here" list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=v$k8s -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
	ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit= -X $pkg.buildDate=$build_date"
done

build() { # build NAME MODULE_DIR PACKAGE
	"$here/../step.sh" "$1" go -C "$2" build -trimpath -p "${ENVTEST_BUILD_P:-2}" -ldflags "$ldflags" -o "$tmp/$1" "$3"
	log "$1: $(du -m "$tmp/$1" | cut -f1) MB"
}

total=$SECONDS
build etcd "$here/etcd" go.etcd.io/etcd/server/v3
build kube-apiserver "$here" k8s.io/kubernetes/cmd/kube-apiserver
build kubectl "$here" k8s.io/kubernetes/cmd/kubectl

# Prove they run and report the versions the cache directory is named after. Their
# output is read whole first: `grep -q` stops reading at its match, and under pipefail
# a binary still writing its next line would fail the pipe with SIGPIPE.
reports() { # reports WANT BINARY ARGS...
	local want=$1 out
	shift
	out=$("$@") || die "$* failed: $out"
	grep -qx "$want" <<<"$out" || die "$(basename "$1") reports $out"
}
reports "Kubernetes v$k8s" "$tmp/kube-apiserver" --version
reports "Client Version: v$k8s" "$tmp/kubectl" version --client
reports "etcd Version: $etcd" "$tmp/etcd" --version

chmod 755 "$tmp"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
log "built ${bins[*]} into $dir in $((SECONDS - total))s"
