#!/usr/bin/env bash
# Speculative decoding on the card (issue 57), and the draft model's training, in one
# call. The pack (.cache/dspec, carried) holds xz archives made here:
#   bin.tar.xz        bin/macfleet-runner, bin/runner.test (go test -c ./test/runner),
#                     bin/trainmodel (./test/trainmodel/cmd/trainmodel)
#   ggml-src.tar.xz   the ollama module's CMakeLists.txt and ml/backend/ggml/ggml
#   testassets.tar.xz the module's tokenizer/testdata/llama3.2 and template
# Steps (bash docs/gpu-runs/spec-bench.sh OUT STEP...):
#   build  ggml's CUDA backend (hack/test-gpu.sh's build step)
#   train  the draft's corpus (seed 45, 11.7 M tokens with quotes; held out:
#          seed 46) and the draft trained on it (DRAFT_ARGS), converted to a GGUF
#          (the repository's draft was made by train-target.sh: docs/testing.md)
#   both   build and train side by side (the build on the cores, training on the GPU)
#   spec   BenchmarkSpeculation (one stream, with its draft row: the repository's
#          draft model) and BenchmarkSpeculationStreams (16) with the trained model on
#          the card, off, on and auto in turn
#   fillers  BenchmarkSlotLayouts: one block of slots against every fourth slot, with
#          the runner's fillers and without
#   draft  BenchmarkSpeculation's draft row alone, its --draft-device DRAFT_DEVICE (default:
#          left to the runner, which times the draft on the card and on the CPU)
#   draftgpu  the draft row with the draft on the card (--draft-device gpu)
#   stock  spec with ggml's own rule for recorded CUDA graphs (one-token batches only;
#          MACFLEET_CUDA_GRAPH_MAX_TOKENS=1), each shape still keeping its own graph
#   verify the speculation and draft-model tests with every runner on the card (the last VERIFY_TAIL lines, 40)
#          (VERIFY_RUN), the same answers with and without drafts
#   verifystock  verify with ggml's own rule for recorded graphs
# PACK names another pack folder (a bench-only pack: bin.tar.xz with the runner and
# runner.test, and ggml-src.tar.xz; the repository and a pack must fit 64 MiB).
set -uo pipefail
out=$1
shift
pack=${PACK:-.cache/dspec}
run=$pack/run
bin=$run/bin
logs=$out/logs # every log, archived into $out/logs.tgz at the end (the tool brings back 8 files)
mkdir -p "$logs" "$run"
[[ -x $bin/runner.test ]] || tar -C "$run" -xJf "$pack/bin.tar.xz"
[[ -d $run/assets || ! -f $pack/testassets.tar.xz ]] || { mkdir -p "$run/assets" && tar -C "$run/assets" -xJf "$pack/testassets.tar.xz"; }
# hack/test-gpu.sh unpacks what it misses; it finds bin/macfleet absent and unpacks
# bin.tar.xz again, which holds the same files.
export MACFLEET_TESTASSETS_DIR=$PWD/$run/assets
draft=$run/draft

step_build() { bash hack/test-gpu.sh "$pack" "$logs/build" facts build 2>&1 | tail -4; }

step_train() {
	local t0=$SECONDS c=$run/corpus
	[[ -f $c/train/tokens.bin ]] || {
		"$bin/trainmodel" corpus -out "$c/train" -seed 45 -tokens 11700000 -quote-every 10 | tail -1
		"$bin/trainmodel" corpus -out "$c/valid" -seed 46 -tokens 200000 -quote-every 10 | tail -1
		rm -f "$c/valid/probes.json"
	}
	echo "corpus in $((SECONDS - t0)) s"
	# shellcheck disable=SC2086
	PYTHONUNBUFFERED=1 python3 test/trainmodel/train.py --corpus "$c/train" --valid "$c/valid" --out "$draft/weights" \
		${DRAFT_ARGS:---embd 32 --heads 2 --kv-heads 1 --ff 128 --layers 2 --steps 3000 --max-seconds 100} \
		>"$logs/train.log" 2>&1
	tail -3 "$logs/train.log"
	"$bin/trainmodel" convert -weights "$draft/weights" -out "$draft/tiny-chat-draft.gguf" || return 1
	xz -T0 -c "$draft/tiny-chat-draft.gguf" >"$out/tiny-chat-draft.gguf.xz" # a file back is at most 16 MiB
	cp "$draft/weights/manifest.json" "$out/"
	for f in loss.csv samples.txt; do [[ -f $draft/weights/$f ]] && cp "$draft/weights/$f" "$out/draft.$f"; done
	echo "train: $((SECONDS - t0)) s"
}

step_both() {
	step_build >"$logs/build.log" 2>&1 &
	local b=$!
	step_train
	wait "$b"
	cat "$logs/build.log"
}

bench() {
	MACFLEET_RUNNER="$bin/macfleet-runner" MACFLEET_TRAINED_MODEL="$PWD/test/models/tiny-chat-trained.gguf" \
		MACFLEET_DRAFT_MODEL="${DRAFT:-$PWD/test/models/tiny-chat-draft.gguf.zst}" \
		"$bin/runner.test" -test.run '^$' -test.count=1 "$@"
}

step_spec() {
	ls "$bin/lib/" || return 1
	bench -test.bench 'Speculation$' -test.benchtime "${SPEC_ROUNDS:-8}x" 2>&1 | grep -E 'Benchmark|ok|FAIL|no accelerator|_test.go'
	bench -test.bench 'SpeculationStreams' -test.benchtime "${STREAM_ROUNDS:-4}x" 2>&1 | grep -E 'Benchmark|ok|FAIL|_test.go'
}

step_stock() { MACFLEET_CUDA_GRAPH_MAX_TOKENS=1 step_spec; }

step_draft() {
	MACFLEET_BENCH_DRAFT_DEVICE=${DRAFT_DEVICE:-} bench -test.bench 'Speculation$/draft' -test.benchtime "${SPEC_ROUNDS:-8}x" 2>&1 |
		grep -E 'Benchmark|ok|FAIL|_test.go'
}
step_draftgpu() { DRAFT_DEVICE=gpu step_draft; }

# fillers: BenchmarkSlotLayouts (the same 16 streams on slots 0-15 and on every fourth
# slot of 64, with fillers and without, on the synthesized mid model).
step_fillers() {
	MACFLEET_BENCH_SLOTS=${FILLER_SLOTS:-64} bench -test.bench 'SlotLayouts' -test.benchtime "${FILLER_ROUNDS:-3}x" 2>&1 |
		grep -E 'Benchmark|ok|FAIL|_test.go'
}
step_verifystock() { MACFLEET_CUDA_GRAPH_MAX_TOKENS=1 step_verify; }

step_verify() {
	MACFLEET_RUNNER="$bin/macfleet-runner" MACFLEET_TRAINED_MODEL="$PWD/test/models/tiny-chat-trained.gguf" \
		MACFLEET_DRAFT_MODEL="$PWD/test/models/tiny-chat-draft.gguf.zst" MACFLEET_TEST_GPU=1 \
		"$bin/runner.test" -test.count=1 -test.timeout 5m \
		-test.run "${VERIFY_RUN:-TestSpeculation|TestDraftModel}" -test.v 2>&1 | grep -E '^(=== RUN|--- |PASS|FAIL|ok)|_test.go' | tail -"${VERIFY_TAIL:-40}"
}

for s in "$@"; do
	echo "=== $s"
	t0=$SECONDS
	"step_$s" 2>&1 | tee "$logs/$s.log"
	echo "=== $s: exit ${PIPESTATUS[0]} in $((SECONDS - t0)) s"
done
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$logs"
