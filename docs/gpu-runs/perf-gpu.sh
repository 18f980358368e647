#!/usr/bin/env bash
# The GPU call of docs/gpu-runs/perf-notes.txt: build the CUDA backend, pin-slot probe
# on the runner alone (CUDA graphs on, then off), then the harness on the card.
# Usage (device): bash docs/gpu-runs/perf-gpu.sh OUT
set -uo pipefail
out="$1"
pack=.cache/device
bin="$pack/run/bin"
t0=$SECONDS
bash hack/test-gpu.sh "$pack" "$out" build >/dev/null 2>&1
echo "build done at $((SECONDS - t0)) s; $(ls "$bin/lib")"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nproc; grep -m1 'model name' /proc/cpuinfo; uname -r
"$bin/macfleet" synth-model --preset 8b-q4_0 -o /tmp/8b.gguf | tail -1
echo "synth done at $((SECONDS - t0)) s"

probe() { # $1 name, rest: env for the runner
	local name=$1 port=18600
	shift
	env "$@" "$bin/macfleet-runner" --model /tmp/8b.gguf --addr 127.0.0.1:$port --parallel 64 --ctx 65536 --verbose \
		>"/tmp/runner-$name.out" 2>"/tmp/runner-$name.err" &
	local pid=$!
	for _ in $(seq 240); do curl -sf 127.0.0.1:$port/health | grep -q ready && break; sleep 0.25; done
	echo "== probe $name (runner ready at $((SECONDS - t0)) s)"
	timeout 150 python3 docs/gpu-runs/perf-probe.py slots http://127.0.0.1:$port 64 "${REPS:-3}" 2>&1 | tee "$out/probe-$name.txt"
	kill "$pid"; wait "$pid" 2>/dev/null
	grep -E 'kv_unified|n_ubatch|n_batch|graph|CUDA0|flash' "/tmp/runner-$name.err" | grep -v create_tensor | head -40 >"$out/runner-$name-ctx.txt"
}
probe graphs A=1
REPS=1 probe nographs GGML_CUDA_DISABLE_GRAPHS=1
echo "== bench at $((SECONDS - t0)) s"
BENCH_FLAGS="-model 8b-q4_0 -rounds 5 -tokens 128 -ctx 1024 -parallel 64 -streams 8,16,32 -long 2048 -long-ctx 2304 -defaults=false -timeout ${BENCH_TIMEOUT:-3m30s}" \
	bash hack/test-gpu.sh "$pack" "$out" bench 2>&1 | grep -v '^$' | tail -40
echo "== done at $((SECONDS - t0)) s"
