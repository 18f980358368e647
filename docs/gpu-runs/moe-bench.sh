#!/usr/bin/env bash
# The card bench of the 30B-A3B mixture of experts beside the peer. Two calls back to
# back on one warm machine (the tree and both packs do not fit one call's 64 MiB):
#   run(command="bash docs/gpu-runs/moe-bench.sh build $OUT", carry=[".cache/dev4"])  # hack/device-pack.sh's bin.tar.xz and ggml-src.tar.xz
#   run(command="bash docs/gpu-runs/moe-bench.sh bench $OUT", carry=[".cache/dev2"])  # the peer: xz of bin/ollama
set -uo pipefail
step=$1 out=$2
pack=.cache/dev4
bin=$pack/run/bin
case $step in
build) bash hack/test-gpu.sh "$pack" "$out" facts build 2>&1 | tail -5 ;;
bench)
	[[ -x $bin/ollama ]] || { xz -dc .cache/dev2/ollama.xz >"$bin/ollama" && chmod +x "$bin/ollama"; }
	BENCH_FLAGS="-model ${MODEL:-qwen3moe-30b-a3b-q4_0} -rounds 3 -tokens 128 -ctx 1024 -parallel 16 -streams 1,4,16 -defaults=false -timeout 7m" \
		bash hack/test-gpu.sh "$pack" "$out" bench 2>&1 | grep -v '^$' | tail -45 ;;
esac
