#!/usr/bin/env bash
# Usage: hack/build-runner.sh OUT
#
# Builds the cgo runner (./cmd/macfleet-runner: llama.cpp through cgo; Metal on
# darwin/arm64, CPU elsewhere) into OUT, with the flags of hack/go-env.sh. A cold build
# compiles llama.cpp and ggml (about 3 minutes on 2 cores); later builds are cached.
set -euo pipefail

if [[ $# -ne 1 ]]; then
	echo "usage: $0 OUT" >&2
	exit 2
fi
out="$1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
cd "$root"
# GO_LDFLAGS: the version stamp of the Makefile (-X …/internal/version.version=…).
exec hack/go-env.sh go build ${GO_LDFLAGS:+-ldflags "$GO_LDFLAGS"} -o "$out" ./cmd/macfleet-runner
