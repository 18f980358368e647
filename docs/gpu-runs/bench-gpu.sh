#!/usr/bin/env bash
# The benchmark call of docs/benchmarks.md ("On the card"): the CUDA backend, then
# macfleet serve beside the peer on the 8B-shaped q4_0 model (hack/test-gpu.sh bench,
# its default flags), then on the f16 model where time is left.
# Usage (device): bash docs/gpu-runs/bench-gpu.sh OUT
set -uo pipefail
out="$1"
pack=.cache/device
t0=$SECONDS
bash hack/test-gpu.sh "$pack" /tmp/gpu-build facts build >/dev/null 2>&1
echo "== backend ready at $((SECONDS - t0)) s"
bash hack/test-gpu.sh "$pack" "$out/q4" bench 2>&1 | grep -v '^$' | tail -25
echo "== q4_0 done at $((SECONDS - t0)) s"
if ((SECONDS - t0 < 400)); then
	BENCH_FLAGS="-model 8b-f16 -rounds 3 -tokens 64 -ctx 1024 -parallel 16 -streams 1,16 -long 2048 -long-ctx 2304 -timeout 150s" \
		bash hack/test-gpu.sh "$pack" "$out/f16" bench 2>&1 | grep -v '^$' | tail -16
fi
echo "== done at $((SECONDS - t0)) s"
