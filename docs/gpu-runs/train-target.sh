#!/usr/bin/env bash
# Candidates of the trained test model trained on the card in one call (issue 57: the
# corpus with its quote documents, QUOTE_EVERY, default 10, the committed model's; 0
# and TOKENS=10000000 for the model of 2026-11-27's; docs/testing.md, "The trained
# test model").
#   bash docs/gpu-runs/train-target.sh OUT SEED...
# The pack (PACK, default .cache/dtrain, carried) holds xz archives made here:
#   bin.tar.xz         bin/trainmodel (./test/trainmodel/cmd/trainmodel)
#   testassets.tar.xz  the ollama module's tokenizer/testdata/llama3.2 and template
# It makes the corpus (seed 45, TOKENS) and the held-out corpus (seed 46), then for
# each training SEED one candidate: train.py (TRAIN_ARGS), converted to a GGUF there,
# brought back xz-compressed in 15 MiB parts (OUT/SEED.gguf.xz.aa, .ab: a file back
# is at most 16 MiB) with its record (OUT/SEED.tgz: the log, manifest, loss curve and
# probe answers). Here: cat OUT/SEED.gguf.xz.* | xz -d > model.gguf. NAME prefixes
# the files (a draft's shape in TRAIN_ARGS beside the target's, in the same call: the
# corpus is made once).
set -uo pipefail
out=$1
shift
pack=${PACK:-.cache/dtrain}
run=$pack/run
mkdir -p "$run/assets"
tar -C "$run" -xJf "$pack/bin.tar.xz"
tar -C "$run/assets" -xJf "$pack/testassets.tar.xz"
export MACFLEET_TESTASSETS_DIR=$PWD/$run/assets
c=$run/corpus
t0=$SECONDS
[[ -f $c/train/tokens.bin ]] || {
	"$run/bin/trainmodel" corpus -out "$c/train" -seed 45 -tokens "${TOKENS:-11700000}" -quote-every "${QUOTE_EVERY:-10}" | tail -12
	"$run/bin/trainmodel" corpus -out "$c/valid" -seed 46 -tokens 200000 -quote-every "${QUOTE_EVERY:-10}" | tail -1
	rm -f "$c/valid/probes.json"
}
echo "corpus in $((SECONDS - t0)) s"
for seed in "$@"; do
	t0=$SECONDS
	name=${NAME:-}$seed
	w=$run/w$name
	# shellcheck disable=SC2086
	PYTHONUNBUFFERED=1 python3 test/trainmodel/train.py --corpus "$c/train" --valid "$c/valid" --out "$w" \
		--seed "$seed" ${TRAIN_ARGS:-} >"$w.log" 2>&1
	tail -2 "$w.log"
	"$run/bin/trainmodel" convert -weights "$w" -out "$w/model.gguf" || continue
	xz -T0 -6 -c "$w/model.gguf" | split -b 15M - "$out/$name.gguf.xz."
	tar -C "$run" -czf "$out/$name.tgz" "w$name.log" "w$name/manifest.json" "w$name/loss.csv" "w$name/samples.txt"
	grep -c '^want' "$w/samples.txt" | sed 's/^/probes: /'
	echo "$name: $((SECONDS - t0)) s"
done
