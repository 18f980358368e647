#!/usr/bin/env bash
# Usage: hack/test-gpu.sh PACK OUT [STEP...]
#
# The GPU suite, run on a machine with an NVIDIA GPU from a copy of this repository and
# the pack hack/device-pack.sh made (PACK, default .cache/device). Writes every log under
# OUT. Steps (default: facts build suite serve):
#   facts  the machine: GPUs, driver, cores, the device nodes and CUDA libraries
#   build  ggml's CUDA backend into PACK/run/bin/lib (hack/build-cuda.sh; kept while the
#          machine is)
#   suite  the runner's tests with every runner on the GPU (MACFLEET_TEST_GPU=1):
#          offload, greedy against the CPU, parallel slots, prompt-cache states saved
#          from device memory and exported to a second runner, a split replica
#   bench  macfleet serve beside the peer server on the card (not in the default steps)
#   matrix the model matrix of every family on the GPU (test/models; not in the default steps)
#   serve  `macfleet serve`, sandboxed as shipped: the GPU in /api/status, the
#          runner's memory in nvidia-smi, and an unload's freed bytes against the drop
#          nvidia-smi shows
# docs/gpu.md has the commands and the output of each run.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
pack="${1:-.cache/device}"
out="${2:-/tmp/gpu-out}"
shift 2 || true
steps=("$@")
((${#steps[@]})) || steps=(facts build suite serve)
mkdir -p "$out"
run="$pack/run"
mkdir -p "$run"
[[ -x $run/bin/macfleet ]] || tar -C "$run" -xJf "$pack/bin.tar.xz"
[[ -d $run/src ]] || { mkdir -p "$run/src" && tar -C "$run/src" -xJf "$pack/ggml-src.tar.xz"; }
[[ -d $run/assets ]] || { mkdir -p "$run/assets" && tar -C "$run/assets" -xJf "$pack/testassets.tar.xz"; }
bin="$(cd "$run/bin" && pwd)"
smi() { nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader,nounits; }

step_facts() {
	nvidia-smi
	smi
	nproc
	uname -r
	grep -m1 'model name' /proc/cpuinfo
	ls -l /dev/nvidia* /dev/nvidia-caps 2>&1
	ldconfig -p | grep -E 'libcuda|libcudart|libcublas' | head
	ls /usr/local/cuda*/lib64 2>/dev/null | grep -E 'cudart|cublas' | head
	nvcc --version | tail -2
	cat /sys/kernel/security/lsm 2>/dev/null; echo
}

step_build() {
	# A copy outside the repository outlives the next call's fresh copy of the pack on a
	# machine still warm (CUDA_CACHE, default /tmp/macfleet-cuda).
	local keep="${CUDA_CACHE:-/tmp/macfleet-cuda}"
	if [[ -f $bin/lib/libggml-cuda.so ]]; then
		echo "CUDA backend already built"
	elif [[ -f $keep/libggml-cuda.so ]]; then
		mkdir -p "$bin/lib" && cp -a "$keep"/libggml-* "$bin/lib/"
		echo "CUDA backend taken from $keep (built earlier on this machine)"
	else
		local t0=$SECONDS
		BUILD_DIR="$run/cuda-build" hack/build-cuda.sh "$bin/lib" "$run/src" || return 1
		echo "CUDA backend built in $((SECONDS - t0)) s"
		mkdir -p "$keep" && cp -a "$bin"/lib/libggml-* "$keep/"
	fi
	ldd "$bin/lib/libggml-cuda.so" | grep -E 'ggml|cuda|cublas|not found'
	# The peer finds the same libraries in lib/ollama beside its bin/.
	mkdir -p "$run/lib/ollama"
	cp -a "$bin"/lib/libggml-* "$run/lib/ollama/"
}

step_suite() {
	mkdir -p "$out/stderr"
	MACFLEET_RUNNER="$bin/macfleet-runner" MACFLEET_TEST_GPU=1 MACFLEET_TESTASSETS_DIR="$run/assets" \
		MACFLEET_TEST_STDERR_DIR="$out/stderr" \
		"$bin/runner.test" -test.v -test.count=1 -test.timeout "${SUITE_TIMEOUT:-5m}" \
		-test.run "${SUITE_RUN:-TestGPU|TestBackendDir|TestConcurrentStreamsMatchAlone|TestPromptCache|TestPeerState|TestSplitModelWorkerToWorker$|TestSplitWorkerReportsItsDevice}"
}

# The model matrix (test/models: every family's paths, tool calls, the split, vision)
# with every runner on the GPU; the pack carries its test binary as bin/models.test.
step_matrix() {
	[[ -x $bin/models.test ]] || { echo "no models.test in the pack (go test -c ./test/models)"; return 1; }
	MACFLEET_RUNNER="$bin/macfleet-runner" MACFLEET_TESTASSETS_DIR="$run/assets" \
		"$bin/models.test" -test.v -test.count=1 -test.timeout "${MATRIX_TIMEOUT:-8m}" ${MATRIX_RUN:+-test.run "$MATRIX_RUN"}
}

step_serve() {
	local models="$run/models" port=18080 log="$out/macfleet-serve.log"
	mkdir -p "$models"
	local preset="${SERVE_PRESET:-8b-q4_0}"
	[[ -f $models/$preset.gguf ]] || "$bin/macfleet" synth-model --preset "$preset" -o "$models/$preset.gguf"
	smi >"$out/smi-before-load.csv"
	"$bin/macfleet" serve --model "chat=$models/$preset.gguf:ctx=4096,parallel=4" --memory-ceiling 64Gi \
		--listen "127.0.0.1:$port" --runner "$bin/macfleet-runner" >"$log" 2>&1 &
	local pid=$!
	for _ in $(seq 60); do curl -sf "localhost:$port/readyz" >/dev/null && break; sleep 0.5; done
	curl -sS "localhost:$port/v1/chat/completions" \
		-d '{"model":"chat","max_tokens":16,"messages":[{"role":"user","content":"Hello"}]}'
	echo
	curl -sS "localhost:$port/api/status" >"$out/serve-status.json"
	smi >"$out/smi-loaded.csv"
	nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >"$out/smi-apps.csv"
	cat "$out/smi-apps.csv"
	# The runner as shipped: confined (Seccomp 2 is a filter; Landlock shows in the
	# agent's log) and on the GPU.
	local rpid
	rpid=$(pgrep -f 'macfleet-runner --model' | head -1)
	grep -E '^(Name|Seccomp|NoNewPrivs)' "/proc/$rpid/status"
	tr '\0' ' ' <"/proc/$rpid/cmdline"; echo
	curl -sS -X POST "localhost:$port/api/models/chat/unload?wait=true" >"$out/unload.json"
	# The driver releases a process's memory once it is reaped; read until it stops falling.
	local prev=-1 used
	for _ in $(seq 20); do
		used=$(smi | awk -F', ' '{s += $4} END {print s}')
		[[ $used == "$prev" ]] && break
		prev=$used
		sleep 0.25
	done
	smi >"$out/smi-unloaded.csv"
	cat "$out/unload.json"; echo
	paste -d' ' "$out/smi-loaded.csv" "$out/smi-unloaded.csv"
	kill "$pid"; wait "$pid" 2>/dev/null
	grep -iE 'sandbox|backend|accelerat' "$log" | cut -c1-400 | head -20 || true
}

# bench: macfleet serve beside the peer server on the card (test/bench/peers -gpu),
# matched slots, interleaved rounds; BENCH_FLAGS replaces the defaults below.
step_bench() {
	[[ -x $bin/ollama ]] || { echo "no peer server in the pack (make peer before hack/device-pack.sh)"; return 1; }
	local flags=(${BENCH_FLAGS:--model 8b-q4_0 -rounds 3 -tokens 128 -ctx 1024 -parallel 64 -streams 1,4,16,64 -long 2048,8192 -long-ctx 8448 -timeout 6m})
	(cd "$run" && "$bin/peers" -gpu -macfleet "$bin/macfleet" -runner "$bin/macfleet-runner" -peer "$bin/ollama" \
		-peer-version "${PEER_VERSION:-v0.17.4}" -out "$out/peers-card.md" "${flags[@]}")
}

# Everything in one archive, also when a time limit stops the script: the device tool
# brings back a few files only.
trap 'tar -C "$out" -czf "$out/logs.tgz" --exclude logs.tgz . 2>/dev/null' EXIT
trap 'exit 143' TERM
rc=0
for s in "${steps[@]}"; do
	echo "=== $s"
	t0=$SECONDS
	"step_$s" 2>&1 | tee "$out/$s.log"
	st=${PIPESTATUS[0]}
	echo "=== $s: exit $st in $((SECONDS - t0)) s"
	((st == 0)) || rc=1
done
exit $rc
