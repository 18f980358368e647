#!/usr/bin/env bash
# Usage: hack/trained-model.sh stage [DIR]      (make trained-model)
#        hack/trained-model.sh convert WEIGHTS  (make trained-model-convert WEIGHTS=...)
#        hack/trained-model.sh draft-convert WEIGHTS
#
# The small trained test model (docs/testing.md, "The trained test model").
#
# stage: generates the training corpus (seed 45, 11.7 M tokens, every tenth document a
# quote) and a held-out corpus (seed 46, 200 k tokens, the same) with the runner's own
# template renderer and the real Llama 3
# vocabulary, copies test/trainmodel/{train,weights}.py beside them into DIR (default
# .cache/trainmodel), and checks the whole layout before any GPU time is spent: random
# weights written by weights.py (no PyTorch needed) are converted into a GGUF. Then
# run, on a machine with one CUDA GPU and PyTorch, from the directory above DIR:
#
#   python3 DIR/train.py --corpus DIR/corpus --valid DIR/valid --out OUT/weights --seed 49
#
# (the model in the repository; seeds differ a lot in how they answer the coding
# agents' real requests: docs/testing.md, "How it was chosen", says how to judge one)
#
# convert: writes test/models/tiny-chat-trained.gguf from the weights train.py saved
# (manifest.json and weights-NNN.bin), with the run's record beside it.
#
# draft-convert: the same for the draft model (speculative decoding), trained with a
# much smaller shape on the same corpus (docs/testing.md, its draft model; the one in
# the repository on its quotes as they began before, "The file PATH says:"):
#
#   python3 DIR/train.py --corpus DIR/corpus --valid DIR/valid --out OUT/draft \
#       --embd 32 --heads 2 --kv-heads 1 --ff 128 --layers 2 --steps 3000 --max-seconds 100
#
# and kept zstd-compressed as test/models/tiny-chat-draft.gguf.zst (the tests
# decompress it once into the user's cache).
set -euo pipefail
cd "$(dirname "$0")/.."
go=(hack/go-env.sh go)
tool=bin/trainmodel
"${go[@]}" build -o "$tool" ./test/trainmodel/cmd/trainmodel

case "${1:-}" in
stage)
	dir=${2:-.cache/trainmodel}
	rm -rf "$dir"
	mkdir -p "$dir"
	"$tool" corpus -out "$dir/corpus" -seed 45 -tokens 11700000 -quote-every 10
	"$tool" corpus -out "$dir/valid" -seed 46 -tokens 200000 -quote-every 10
	rm "$dir/valid/probes.json" # the probes are the training corpus's
	cp test/trainmodel/train.py test/trainmodel/weights.py "$dir/"
	python3 -m py_compile "$dir/train.py" "$dir/weights.py"
	rm -rf "$dir/__pycache__"
	check=$(mktemp -d)
	trap 'rm -rf "$check"' EXIT
	python3 "$dir/weights.py" --out "$check/weights"
	"$tool" convert -weights "$check/weights" -out "$check/check.gguf"
	echo "staged in $dir ($(du -sh "$dir" | cut -f1)); the layout converts to a $(du -h "$check/check.gguf" | cut -f1) GGUF"
	echo "train: python3 $dir/train.py --corpus $dir/corpus --valid $dir/valid --out OUT/weights --seed 49"
	;;
convert)
	weights=${2:?usage: hack/trained-model.sh convert WEIGHTS_DIR}
	mkdir -p test/models
	"$tool" convert -weights "$weights" -out test/models/tiny-chat-trained.gguf
	# The record of the run beside the model: hyperparameters, seed, steps, corpus
	# counts (the manifest), the loss curve and the probe answers.
	cp "$weights/manifest.json" test/models/tiny-chat-trained.manifest.json
	for f in loss.csv samples.txt; do
		if [ -f "$weights/$f" ]; then cp "$weights/$f" "test/models/tiny-chat-trained.$f"; fi
	done
	ls -la test/models/
	;;
draft-convert)
	weights=${2:?usage: hack/trained-model.sh draft-convert WEIGHTS_DIR}
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	"$tool" convert -weights "$weights" -out "$tmp/draft.gguf"
	zstd -19 -q -f "$tmp/draft.gguf" -o test/models/tiny-chat-draft.gguf.zst
	cp "$weights/manifest.json" test/models/tiny-chat-draft.manifest.json
	for f in loss.csv samples.txt; do
		if [ -f "$weights/$f" ]; then cp "$weights/$f" "test/models/tiny-chat-draft.$f"; fi
	done
	ls -la test/models/tiny-chat-draft.*
	;;
*)
	sed -n '2,4p' "$0" >&2
	exit 2
	;;
esac
