#!/usr/bin/env bash
# The mixture of experts at 16 streams on the card (issue 54): the runner alone with the
# 30B-A3B shape, its curve (1 and 16 streams) with the CPU threads it is given and with
# CUDA graphs off, to find where the 16-stream step goes.
# Usage (device): bash docs/gpu-runs/moe-probe.sh OUT
set -uo pipefail
out="$1"
pack=.cache/device
bin="$pack/run/bin"
t0=$SECONDS
bash hack/test-gpu.sh "$pack" "$out" build >/dev/null 2>&1
echo "build done at $((SECONDS - t0)) s; $(ls "$bin/lib")"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nproc; grep -m1 'model name' /proc/cpuinfo
[[ -f /tmp/moe.gguf ]] || "$bin/macfleet" synth-model --preset qwen3moe-30b-a3b-q4_0 -o /tmp/moe.gguf | tail -1
echo "synth done at $((SECONDS - t0)) s"

probe() { # $1 name, $2 runner flags, rest: env for the runner
	local name=$1 flags=$2 port=18600
	shift 2
	env "$@" "$bin/macfleet-runner" --model /tmp/moe.gguf --addr 127.0.0.1:$port --parallel 16 --ctx 16384 $flags --verbose \
		>"/tmp/runner-$name.out" 2>"/tmp/runner-$name.err" &
	local pid=$!
	for _ in $(seq 480); do curl -sf 127.0.0.1:$port/health | grep -q ready && break; sleep 0.25; done
	echo "== probe $name ($flags $*) ready at $((SECONDS - t0)) s"
	for rep in 1 2; do
		PROBE_MODEL=moe timeout 120 python3 docs/gpu-runs/perf-probe.py curve http://127.0.0.1:$port 16 1,16 0,0.8 128 2>&1 | sed "s/^/rep $rep: /"
	done | tee "$out/moe-probe-$name.txt"
	kill "$pid"; wait "$pid" 2>/dev/null
	grep -E 'n_ubatch|n_batch|kv_unified|flash|graph' "/tmp/runner-$name.err" | grep -v create_tensor | head -20 >"$out/moe-runner-$name.txt"
}
probe threads15 "--threads 15"
probe threads2 "--threads 2"
probe nographs "--threads 15" GGML_CUDA_DISABLE_GRAPHS=1
echo "== done at $((SECONDS - t0)) s"
