// Package engine holds the engine-pool benchmarks: a real `macfleet serve` process in
// front of real macfleet-runner processes (llama.cpp) serving synthesized models, each
// figure measured against a baseline taken in the same run — the agent path against
// the runner's own socket, decode throughput against this machine's memory bandwidth,
// four concurrent streams against one, an unload against its target, and inter-token
// latency while another model is unloaded against the same streams without it.
//
// The benchmarks skip unless $MACFLEET_RUNNER names the runner binary (`make runner`).
// Reproduce:
//
//	MACFLEET_RUNNER=$PWD/bin/macfleet-runner \
//	  hack/go-env.sh go test -run '^$' -bench . -benchtime 1x -timeout 30m ./test/bench/engine/
package engine
