// Package promptcache holds the prompt cache benchmark: time to first token of the
// second turn of a 2,000-token conversation on the mid model, served by a real
// macfleet-runner (llama.cpp) with the prompt cache, restoring the first turn's state
// from the hot tier and from the SSD tier after a hot clear, against the same turn
// prefilled in full by a runner without the cache, measured in the same run.
//
// The benchmark skips unless $MACFLEET_RUNNER names the runner binary (`make runner`).
// Reproduce:
//
//	MACFLEET_RUNNER=$PWD/bin/macfleet-runner \
//	  hack/go-env.sh go test -run '^$' -bench . -benchtime 1x -timeout 30m ./test/bench/promptcache/
package promptcache
