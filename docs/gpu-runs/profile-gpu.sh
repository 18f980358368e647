#!/usr/bin/env bash
# The profiling call of docs/gpu-runs/profile-notes.md, on a machine where an earlier call
# of hack/test-gpu.sh built the CUDA backend (kept in /tmp/macfleet-cuda):
#   1. step time against the number of streams (1..64, contiguous slots), greedy and
#      sampled, on the runner alone: where batching stops paying, and sampling's share;
#   2. Nsight Compute on the runner: every graph launch and kernel of one greedy stream
#      and of 16 streams, with CUDA graphs (as shipped) and without (one row a kernel).
# Usage (device): bash docs/gpu-runs/profile-gpu.sh OUT
set -uo pipefail
out="$1"
pack=.cache/device
bin="$pack/run/bin"
t0=$SECONDS
say() { echo "== $* at $((SECONDS - t0)) s"; }
bash hack/test-gpu.sh "$pack" "$out/build" build >/dev/null 2>&1
say "backend: $(ls "$bin/lib" | tr '\n' ' ')"
[[ -f /tmp/8b.gguf ]] || "$bin/macfleet" synth-model --preset 8b-q4_0 -o /tmp/8b.gguf | tail -1
say synth
port=18600
ready() { for _ in $(seq 480); do curl -sf 127.0.0.1:$port/health | grep -q ready && return 0; sleep 0.25; done; return 1; }

"$bin/macfleet-runner" --model /tmp/8b.gguf --addr 127.0.0.1:$port --parallel 64 --ctx 65536 \
	>/tmp/runner-curve.out 2>/tmp/runner-curve.err &
pid=$!
ready && say "curve runner ready"
timeout 150 python3 docs/gpu-runs/perf-probe.py curve http://127.0.0.1:$port 64 1,2,4,8,9,12,16,24,32,48,64 0,0.8 64 2>&1 |
	tee "$out/curve.txt"
kill "$pid"; wait "$pid" 2>/dev/null
say curve

ncu_run() { # $1 name, $2 graph-profiling mode, rest: env
	local name=$1 mode=$2
	shift 2
	env "$@" timeout 160 ncu --clock-control none --target-processes all --graph-profiling "$mode" \
		--metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --launch-count 40000 \
		-f -o "/tmp/ncu-$name" "$bin/macfleet-runner" --model /tmp/8b.gguf --addr 127.0.0.1:$port \
		--parallel 16 --ctx 16384 >"/tmp/ncu-$name.out" 2>"/tmp/ncu-$name.err" &
	local p=$!
	if ready; then
		say "ncu $name: runner ready"
		timeout 120 python3 docs/gpu-runs/perf-probe.py profile http://127.0.0.1:$port 24 16 8 2>&1
	else
		echo "ncu $name: runner not ready"; tail -5 "/tmp/ncu-$name.err"
	fi
	pkill -TERM -f "^$bin/macfleet-runner --model"
	wait "$p"
	tail -3 "/tmp/ncu-$name.out"
	ncu --import "/tmp/ncu-$name.ncu-rep" --csv --page raw >"/tmp/ncu-$name.csv" 2>&1
	wc -l "/tmp/ncu-$name.csv"
	xz -T0 -c "/tmp/ncu-$name.csv" >"$out/ncu-$name.csv.xz"
	say "ncu $name"
}
ncu_run graphs graph
ncu_run kernels node GGML_CUDA_DISABLE_GRAPHS=1
ls -l "$out"
