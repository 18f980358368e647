#!/usr/bin/env bash
# The curves call of docs/gpu-runs/profile-notes.md: the CUDA backend (built, or taken
# from /tmp/macfleet-cuda on a machine still warm), then the step-time curve of the
# runner alone as shipped and with ggml's concurrent-stream graph optimisation
# (GGML_CUDA_GRAPH_OPT=1), then the short-chat TTFT distribution on the card.
# Usage (device): bash docs/gpu-runs/curves-gpu.sh OUT
set -uo pipefail
out="$1"
pack=.cache/device
bin="$pack/run/bin"
t0=$SECONDS
say() { echo "== $* at $((SECONDS - t0)) s"; }
bash hack/test-gpu.sh "$pack" "$out/build" facts build >/dev/null 2>&1
say "backend: $(ls "$bin/lib" | tr '\n' ' ')"
[[ -f /tmp/8b.gguf ]] || "$bin/macfleet" synth-model --preset 8b-q4_0 -o /tmp/8b.gguf | tail -1
say synth
port=18600
ready() { for _ in $(seq 480); do curl -sf 127.0.0.1:$port/health | grep -q ready && return 0; sleep 0.25; done; return 1; }
curve() { # $1 name, rest: env
	local name=$1
	shift
	env "$@" "$bin/macfleet-runner" --model /tmp/8b.gguf --addr 127.0.0.1:$port --parallel 64 --ctx 65536 \
		>"/tmp/runner-$name.out" 2>"/tmp/runner-$name.err" &
	local pid=$!
	ready && say "curve $name: runner ready"
	timeout 120 python3 docs/gpu-runs/perf-probe.py curve http://127.0.0.1:$port 64 1,2,4,8,16,32,64 0,0.8 64 2>&1 |
		tee "$out/curve-$name.txt"
	PROBE_MODEL=x timeout 60 python3 docs/gpu-runs/perf-probe.py ttft http://127.0.0.1:$port 20 4 2>&1 | tail -1
	kill "$pid"; wait "$pid" 2>/dev/null
}
curve shipped A=1
curve graphopt GGML_CUDA_GRAPH_OPT=1
curve shipped2 A=1
say done
