#!/usr/bin/env bash
# Run a local kube-apiserver and etcd with the macfleet CRDs installed until Ctrl-C.
#
#   hack/dev-cluster.sh DIR
#
# DIR holds kube-apiserver, etcd and kubectl (`make envtest` builds them; `make
# dev-cluster` passes the cache directory). The kubeconfig goes to
# .cache/dev-cluster/kubeconfig under the repository.
set -euo pipefail

if [[ $# -ne 1 ]]; then
	echo "usage: $0 DIR" >&2
	exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export KUBEBUILDER_ASSETS=$1
# Build first and exec the binary, so Ctrl-C and SIGTERM reach the program itself
# rather than `go run`.
mkdir -p .cache/dev-cluster
CGO_ENABLED=0 go build -o .cache/dev-cluster/devcluster ./hack/devcluster
exec .cache/dev-cluster/devcluster -write-kubeconfig .cache/dev-cluster/kubeconfig
