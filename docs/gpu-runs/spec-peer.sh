#!/usr/bin/env bash
# Speculative decoding beside the peer server on the same card (issue 57):
# BenchmarkSpeculation's requests asked of the runner (off, on, auto) and of the peer
# server serving the same trained model, one after the other on one card.
#   PACK=DIR bash docs/gpu-runs/spec-peer.sh OUT [RUNS]
# The pack is spec-bench.sh's (bin.tar.xz with the runner and runner.test, and the
# peer server as bin/ollama, built by `make peer`; ggml-src.tar.xz; testassets.tar.xz);
# its build step must have run (the CUDA backend in PACK/run/bin/lib, copied for the
# peer into PACK/run/lib/ollama). The peer keeps ggml's own rule for recorded graphs
# (one-token batches: MACFLEET_CUDA_GRAPH_MAX_TOKENS=1), and is asked through its
# OpenAI-compatible API, the request's body as the runner gets it (MACFLEET_BENCH_PEER).
set -uo pipefail
out=$1
runs=${2:-2}
pack=${PACK:-.cache/dspec}
run=$pack/run
bin=$run/bin
model=$PWD/test/models/tiny-chat-trained.gguf
home=$run/peer-home
port=11491
mkdir -p "$home"
[[ -x $bin/ollama && -f $run/lib/ollama/libggml-cuda.so ]] || {
	echo "no peer server or no CUDA backend for it in $run (make peer, and spec-bench.sh's build step)"
	exit 1
}
MACFLEET_CUDA_GRAPH_MAX_TOKENS=1 HOME=$home OLLAMA_HOST=127.0.0.1:$port OLLAMA_MODELS=$home/models \
	OLLAMA_NO_CLOUD=1 OLLAMA_KEEP_ALIVE=1h OLLAMA_NUM_PARALLEL=1 "$bin/ollama" serve >"$out/peer.log" 2>&1 &
peer=$!
trap 'kill $peer 2>/dev/null' EXIT
base=http://127.0.0.1:$port
for _ in $(seq 60); do curl -sf "$base/api/version" >/dev/null && break; sleep 1; done
digest=sha256:$(sha256sum "$model" | cut -d' ' -f1)
curl -sf -X POST "$base/api/blobs/$digest" --data-binary "@$model" || { echo "blob upload failed"; exit 1; }
curl -sf "$base/api/create" -d "{\"model\":\"m\",\"files\":{\"$(basename "$model")\":\"$digest\"},\"stream\":false}" || {
	echo "create failed"
	exit 1
}
echo
curl -sf "$base/api/generate" -d '{"model":"m"}' >/dev/null || { echo "load failed"; tail -20 "$out/peer.log"; exit 1; }
curl -s "$base/api/ps"
echo
grep -iE 'offload|CUDA0|compute capability' "$out/peer.log" | head -8
for i in $(seq "$runs"); do
	echo "=== run $i $(date -u +%T)"
	MACFLEET_BENCH_PEER=$base MACFLEET_RUNNER="$bin/macfleet-runner" MACFLEET_TRAINED_MODEL="$model" \
		MACFLEET_DRAFT_MODEL="$PWD/test/models/tiny-chat-draft.gguf.zst" MACFLEET_TESTASSETS_DIR="$PWD/$run/assets" \
		"$bin/runner.test" -test.run '^$' -test.v -test.bench 'Speculation$' -test.benchtime "${SPEC_ROUNDS:-8}x" 2>&1 |
		grep -E '^Benchmark.*-[0-9]+ |peer|FAIL'
done
