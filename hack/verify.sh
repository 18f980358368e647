#!/usr/bin/env bash
# Checks CI runs before the tests (`make verify`):
#   - `make generate manifests` leaves api/, config/ and charts/ unchanged (generated
#     code, manifests and the chart's copies of them are committed and reproducible);
#   - `helm lint --strict` is clean on the chart;
#   - the chart's alert rules and dashboard queries parse with Prometheus's own parsers
#     (hack/promcheck: what `promtool check rules` runs), alerts with a test of their own
#     there fire on the series they should and no other (hack/promcheck's go test), and
#     every metric they use is one a component registers (test/chart TestMonitoringMetricsExported);
#   - go.mod/go.sum of the module and of the tool modules are tidy;
#   - gofmt and `go vet` (pure Go, CGO_ENABLED=0) are clean;
#   - golangci-lint (.golangci.yml: function length, duplication, the import layers of
#     docs/architecture.md) is clean, built into the cache first if missing;
#   - hack/structure's counts (pointer-only helper types, the pool's locks and its
#     acquire walk, wide gateway functions, upward imports from internal/, long
#     functions) are within hack/structure/limits.txt, its own tests passing first;
#   - cmd/macfleet cross-compiles for darwin/arm64 without cgo.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

failed=()
step() { # step NAME COMMAND...
	local name=$1 start=$SECONDS
	shift
	echo "==> $name"
	if "$@"; then
		echo "<== $name: ok ($((SECONDS - start))s)"
	else
		echo "<== $name: FAILED ($((SECONDS - start))s)"
		failed+=("$name")
	fi
}

generated_unchanged() {
	${MAKE:-make} --no-print-directory generate manifests || return
	local changes
	changes=$(git status --porcelain --untracked-files=all -- api config charts)
	[[ -z $changes ]] && return
	echo "generation changed files under api/, config/ or charts/; run \`make generate manifests\` and commit:"
	echo "$changes"
	git --no-pager diff -- api config charts
	return 1
}

tidy() {
	local dir rc=0
	for dir in . hack/tools hack/envtest hack/envtest/etcd hack/promcheck; do
		if ! (cd "$dir" && go mod tidy -diff); then
			echo "$dir/go.mod is not tidy (diff above)"
			rc=1
		fi
	done
	return $rc
}

# The chart rendered with its dashboards and PrometheusRule, through hack/promcheck.
prometheus_rules() {
	${MAKE:-make} --no-print-directory helm || return
	local rendered rc=0
	rendered=$(mktemp)
	bin/helm template macfleet charts/macfleet \
		--set monitoring.dashboards.enabled=true,monitoring.prometheusRule.enabled=true >"$rendered" &&
		(cd hack/promcheck && go test -count=1 ./... && go run . "$rendered") &&
		MACFLEET_HELM=$PWD/bin/helm go test -count=1 -run '^TestMonitoringMetricsExported$' ./test/chart/ || rc=$?
	rm -f "$rendered"
	return $rc
}

# hack/structure's tests on its test module, then its counts on this one.
structure() {
	go test -count=1 ./hack/structure && go run ./hack/structure
}

gofmt_clean() {
	local files unformatted
	mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.go')
	unformatted=$(gofmt -l "${files[@]}")
	[[ -z $unformatted ]] && return
	echo "not gofmt'ed:"
	echo "$unformatted"
	return 1
}

step "generate manifests" generated_unchanged
step "helm lint" ${MAKE:-make} --no-print-directory chart-verify
step "prometheus rules and dashboards" prometheus_rules
step "go mod tidy" tidy
step "gofmt" gofmt_clean
step "go vet" env CGO_ENABLED=0 go vet ./...
step "golangci-lint" ${MAKE:-make} --no-print-directory lint
step "structure" structure
step "build darwin/arm64" env GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 go build -trimpath -o /dev/null ./cmd/macfleet

if ((${#failed[@]})); then
	echo "verify failed: ${failed[*]}"
	exit 1
fi
echo "verify: ok"
