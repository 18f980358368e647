#!/usr/bin/env bash
# The CPU call of docs/gpu-runs/perf-notes.txt: no GPU backend anywhere (the binaries
# unpacked to /tmp/c with no lib/ beside them, so neither the runner nor the peer finds
# one). Short-chat TTFT of the runner alone and behind `macfleet serve` at several
# thread counts and slot counts, the pin-slot probe on the CPU, then the harness.
# Usage (device): bash docs/gpu-runs/perf-cpu.sh OUT
set -uo pipefail
out="$1"
t0=$SECONDS
mkdir -p /tmp/c && tar -C /tmp/c -xJf .cache/device/bin.tar.xz
b=/tmp/c/bin
ls /tmp/c
nproc; grep -m1 'model name' /proc/cpuinfo; uname -r; lscpu | grep -E '^(Thread|Core|Socket|CPU\(s\))'
"$b/macfleet" synth-model --preset mid -o /tmp/mid.gguf | tail -1
log="$out/cpu-probes.txt"

runner() { # $1 name $2 threads $3 parallel [$4 probe: ttft|slots]
	local port=18700 pid
	"$b/macfleet-runner" --model /tmp/mid.gguf --addr 127.0.0.1:$port --threads "$2" --parallel "$3" --ctx $((1024 * $3)) \
		>/dev/null 2>"/tmp/r-$1.err" &
	pid=$!
	for _ in $(seq 200); do curl -sf 127.0.0.1:$port/health | grep -q ready && break; sleep 0.1; done
	echo "== runner alone: $1 (threads $2, parallel $3), load $(cut -d' ' -f1-3 /proc/loadavg)"
	if [[ ${4:-ttft} == slots ]]; then
		timeout 120 python3 docs/gpu-runs/perf-probe.py slots http://127.0.0.1:$port "$3" 2
	else
		python3 docs/gpu-runs/perf-probe.py ttft http://127.0.0.1:$port 15 4
	fi
	kill "$pid"; wait "$pid" 2>/dev/null
}

serve() { # $1 name $2 threads $3 parallel
	local port=18800 pid
	"$b/macfleet" serve --listen 127.0.0.1:$port --runner "$b/macfleet-runner" --idle-timeout 1h --runner-threads "$2" \
		--prompt-cache-hot-bytes 0 --prompt-cache-ssd-bytes 0 --prompt-cache-dir /tmp/pc-$1 \
		--model "mid=/tmp/mid.gguf:ctx=$((1024 * $3)),parallel=$3,cache=off" >"/tmp/serve-$1.log" 2>&1 &
	pid=$!
	for _ in $(seq 100); do curl -sf 127.0.0.1:$port/readyz >/dev/null && break; sleep 0.1; done
	curl -s -X POST 127.0.0.1:$port/api/models/mid/load >/dev/null
	echo "== behind macfleet serve: $1 (threads $2, parallel $3), load $(cut -d' ' -f1-3 /proc/loadavg)"
	python3 docs/gpu-runs/perf-probe.py ttft http://127.0.0.1:$port 15 4
	curl -s 127.0.0.1:$port/api/status | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps(d)[:1500])'
	kill "$pid"; wait "$pid" 2>/dev/null
}

{
	runner t16p4 16 4
	runner t15p4 15 4
	runner t8p4 8 4
	runner t16p16 16 16
	serve s16p4 16 4
	serve s15p4 15 4
	runner slots16 15 16 slots
	echo "== probes done at $((SECONDS - t0)) s"
} 2>&1 | tee "$log"
cd /tmp/c && timeout "${HARNESS_TIMEOUT:-330}" "$b/peers" -macfleet "$b/macfleet" -runner "$b/macfleet-runner" -peer "$b/ollama" \
	-peer-version v0.17.4 -model mid -rounds 3 -parallel 4 -threads 16 -streams 4 -long 512 -defaults=false \
	-timeout 5m -out "$out/peers-cpu.md" >"$out/peers-cpu.log" 2>&1
echo "harness rc $? at $((SECONDS - t0)) s"
tail -25 "$out/peers-cpu.log"
tar -C /tmp -czf "$out/cpu-logs.tgz" $(cd /tmp && ls -d r-*.err serve-*.log 2>/dev/null)
