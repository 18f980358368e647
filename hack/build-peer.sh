#!/usr/bin/env bash
# Usage: hack/build-peer.sh DIR
#
# Builds the peer server that `make bench-peers` measures macfleet against from its Go
# module, at the version go.mod already requires (`go list -m github.com/ollama/ollama`),
# into DIR/ollama, with the cgo flags of hack/go-env.sh (so its llama.cpp is compiled
# exactly like the runner's). `go install MODULE@VERSION` builds it with the module's own
# go.mod, as its release would be; building it inside this module would need go.sum
# entries for its command line's dependencies and could move this module's versions. The module zip lacks two headers its image and audio
# helpers include: stb_image.h comes from Debian's libstb-dev (hack/deps.sh peers),
# miniaudio.h from the Go module that ships it (github.com/gen2brain/malgo), copied into
# DIR/include. A cold build compiles llama.cpp and ggml again (a few minutes on 2 cores).
set -euo pipefail

if [[ $# -ne 1 ]]; then
	echo "usage: $0 DIR" >&2
	exit 2
fi
dir=$1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mod=github.com/ollama/ollama
miniaudio_mod=github.com/gen2brain/malgo@v0.11.24
version=$(cd "$root" && go list -m -f '{{.Version}}' "$mod")

mkdir -p "$dir/include/miniaudio"
ma_dir=$(cd "$dir" && GOFLAGS=-mod=mod go mod download -json "$miniaudio_mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [[ ! -f $ma_dir/miniaudio.h ]]; then
	echo "build-peer.sh: miniaudio.h not found in $miniaudio_mod ($ma_dir)" >&2
	exit 1
fi
cp "$ma_dir/miniaudio.h" "$dir/include/miniaudio/miniaudio.h"
if [[ $(go env GOOS) == linux && ! -f /usr/include/stb/stb_image.h ]]; then
	echo "build-peer.sh: /usr/include/stb/stb_image.h missing; run hack/deps.sh peers" >&2
	exit 1
fi

# Built into a temporary GOBIN and moved into place, so an interrupted build never
# leaves a binary that looks finished.
tmp=$(mktemp -d "$dir/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
CGO_CPPFLAGS="-I$dir/include${CGO_CPPFLAGS:+ $CGO_CPPFLAGS}" GOBIN=$tmp \
	"$root/hack/go-env.sh" go install -trimpath \
	-ldflags "-s -w -X $mod/version.Version=${version#v}" "$mod@$version"
mv "$tmp/ollama" "$dir/ollama"
