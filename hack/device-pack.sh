#!/usr/bin/env bash
# Usage: hack/device-pack.sh [DIR]
#
# Packs what hack/test-gpu.sh needs on a machine with an accelerator but no Go and no
# network into DIR (default .cache/device, which git ignores): the binaries built here
# (macfleet, macfleet-runner, the runner's test binary, the peer benchmark and the peer
# server where `make peer` built it), the ggml sources the CUDA backend is built from
# (the ollama module's CMakeLists.txt and ml/backend/ggml/ggml) and the tokenizer and
# chat-template test data the runner's tests read (MACFLEET_TESTASSETS_DIR there).
# Everything travels xz-compressed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
dir="${1:-.cache/device}"
mkdir -p "$dir"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mod="$(go list -m -f '{{.Dir}}' github.com/ollama/ollama)"

mkdir -p "$stage/bin"
go build -trimpath -ldflags "-s -w" -o "$stage/bin/macfleet" ./cmd/macfleet
hack/go-env.sh go build -trimpath -ldflags "-s -w" -o "$stage/bin/macfleet-runner" ./cmd/macfleet-runner
go test -c -trimpath -ldflags "-s -w" -o "$stage/bin/runner.test" ./test/runner
go build -trimpath -ldflags "-s -w" -o "$stage/bin/peers" ./test/bench/peers
peer="${PEER:-$(ls "$HOME"/.cache/macfleet/peers/*/ollama 2>/dev/null | tail -1 || true)}"
if [[ -n "$peer" && -x "$peer" ]]; then
	cp "$peer" "$stage/bin/ollama"
fi
tar -C "$stage" -cJf "$dir/bin.tar.xz" bin

tar -C "$mod" -cJf "$dir/ggml-src.tar.xz" --mode=u+w CMakeLists.txt ml/backend/ggml/ggml
tar -C "$mod" -cJf "$dir/testassets.tar.xz" --mode=u+w tokenizer/testdata/llama3.2 template
ls -l "$dir"
du -sh "$dir"
