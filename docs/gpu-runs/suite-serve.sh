#!/usr/bin/env bash
# The suite call: facts, the CUDA backend build (kept in /tmp/macfleet-cuda for the next
# call on the same machine), the GPU suite and `macfleet serve` as shipped.
# Usage (device): bash docs/gpu-runs/suite-serve.sh OUT
set -uo pipefail
out="$1"
SUITE_TIMEOUT=5m bash hack/test-gpu.sh .cache/device "$out" facts build suite serve >"$out/all.log" 2>&1
echo "exit $?"
grep -E '^=== (facts|build|suite|serve)|^--- |^(ok|FAIL|PASS)|built in|device|freed|Seccomp' "$out/all.log" | cut -c1-300 | head -80
