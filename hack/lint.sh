#!/usr/bin/env bash
# Usage: hack/lint.sh [golangci-lint run flags...]
#
# Runs golangci-lint (.golangci.yml) over the whole module with the cgo environment of
# hack/go-env.sh, so the runner's cgo packages type-check like the rest. The binary is
# $GOLANGCI_LINT (the Makefile's, built by `make golangci-lint` into the cache at the
# version hack/tools/go.mod pins).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

lint=${GOLANGCI_LINT:-}
if [[ -z $lint || ! -x $lint ]]; then
	echo "lint.sh: golangci-lint not found at '${lint}': run \`make golangci-lint\` (or \`make lint\`)" >&2
	exit 1
fi
exec hack/go-env.sh "$lint" run "$@" ./...
