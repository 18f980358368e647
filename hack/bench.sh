#!/usr/bin/env bash
# Runs the benchmarks named in docs/benchmarks.md, each against a baseline measured in
# the same run, and prints the results. Usage: hack/bench.sh [control-plane|engine|fleet|all]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
what=${1:-all}
run() { echo; echo "=== $*"; "$@"; }

if [[ $what == all || $what == control-plane ]]; then
	# Placement solver: 1,000 Macs x 10,000 pending replicas, against a reference
	# implementation and a naive first-fit measured in the same run.
	run go test -run '^$' -bench 'BenchmarkSolve' -benchmem -count 1 ./controllers/scheduler/
	# End to end on a real API server: 1,000 replicas bound on 100 MacNodes, against
	# creating the same objects with no scheduler running.
	run go test -run '^$' -bench 'BenchmarkBind' -benchtime 1x -timeout 20m ./test/bench/scheduling/
fi
if [[ $what == all || $what == engine ]]; then
	if compgen -G 'test/bench/engine/*_test.go' >/dev/null; then
		run hack/go-env.sh go test -run '^$' -bench . -benchtime 1x -timeout 30m ./test/bench/engine/
	fi
	# Prompt cache: TTFT of a 2,000-token conversation's second turn, hot and SSD vs none.
	run hack/go-env.sh go test -run '^$' -bench SecondTurn -benchtime 1x -timeout 30m ./test/bench/promptcache/
	# A prefix from a peer (issue 26): importing an 8 k-token prefix's state and answering
	# from it, against prefilling it, on the same runner.
	run hack/go-env.sh go test -run '^$' -bench PeerImport8k -benchtime 1x -timeout 60m ./test/bench/promptcache/
fi
if [[ $what == all || $what == fleet ]]; then
	# A whole local fleet (test/e2e): the gateway against calling the agent directly
	# (one-token completions of a trivial model, interleaved), and node-loss recovery
	# (an agent killed: Lease expiry to endpoint not ready and to a replacement Ready).
	run go test -run '^$' -bench GatewayOverhead -benchtime 400x -timeout 20m ./test/e2e/
	# Uninterrupted streams (issue 43): straight to the agent, through the gateway that
	# reads every event to be able to continue it, and through the gateway of the commit
	# before stream continuation beside it.
	run env MACFLEET_BENCH_BASELINE="$(hack/build-macfleet-at.sh c25ec48abefc)" \
		go test -run '^$' -bench StreamOverhead -benchtime 200x -timeout 20m ./test/e2e/
	# The fair queue: a light client's latency beside a heavy one, and throughput, with
	# and without the gateway's queue (short and longer heavy requests).
	for tokens in 64 256; do
		run env HEAVY_TOKENS=$tokens go test -run '^$' -bench FairQueue -benchtime 5x -timeout 20m ./test/e2e/
	done
	# A load step from one client to eight: autoscaled against a fixed single replica,
	# and scale from zero against a warm request.
	run go test -run '^$' -bench LoadStep -benchtime 3x -timeout 30m ./test/e2e/
	run go test -run '^$' -bench ColdStartFromZero -benchtime 3x -timeout 30m ./test/e2e/
	run bash -c "go test -run 'TestNodeLossMovesReplicas' -v -count 1 -timeout 20m ./test/e2e/ | grep -E 'node loss|^(ok|FAIL|---)'"
fi
