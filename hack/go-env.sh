#!/usr/bin/env bash
# Usage: hack/go-env.sh COMMAND [ARG...]
#
# Runs COMMAND (usually `go build` or `go test`) with the cgo environment that compiles
# llama.cpp for the runner: the include paths of llama.h/ggml.h inside the ollama
# module, and on x86-64 Linux with AVX2 `-O3 -march=x86-64-v3` (about 5x faster than a
# baseline build). hack/build-runner.sh and `make test` both go through here, so every
# cgo package is compiled with identical flags and the build cache is shared.
#
# The runner links llama.cpp's core, ggml, the `common` helpers (for the
# JSON-schema-to-grammar converter) and mtmd with clip (image input through a
# projector, `--mmproj`), not ollama's `llama` wrapper. Of the headers missing from
# the ollama module zip, nlohmann/json is needed (Debian: nlohmann-json3-dev; macOS:
# `brew install nlohmann-json`), and the two below for mtmd.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mod=github.com/ollama/ollama

ollama_dir="$(cd "$root" && go list -m -f '{{.Dir}}' "$mod")"
if [[ -z "$ollama_dir" || ! -d "$ollama_dir" ]]; then
	(cd "$root" && go mod download "$mod")
	ollama_dir="$(cd "$root" && go list -m -f '{{.Dir}}' "$mod")"
fi
for h in llama/llama.cpp/include/llama.h llama/llama.cpp/src/llama-context.h ml/backend/ggml/ggml/include/ggml.h; do
	if [[ ! -f "$ollama_dir/$h" ]]; then
		echo "go-env.sh: $ollama_dir/$h not found" >&2
		exit 1
	fi
done

# mtmd's image and audio helpers include two headers the module zip lacks:
# stb/stb_image.h (Debian's libstb-dev, in the system include path; macOS: `brew
# install stb`) and miniaudio/miniaudio.h, which the Go module github.com/gen2brain/malgo
# ships; it is copied once into a directory of its own under the user's cache.
miniaudio_mod=github.com/gen2brain/malgo@v0.11.24
cgo_include="${XDG_CACHE_HOME:-$HOME/.cache}/macfleet/cgo-include"
if [[ ! -f "$cgo_include/miniaudio/miniaudio.h" ]]; then
	ma_dir="$(cd "${TMPDIR:-/tmp}" && GOFLAGS=-mod=mod go mod download -json "$miniaudio_mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
	if [[ ! -f "$ma_dir/miniaudio.h" ]]; then
		echo "go-env.sh: miniaudio.h not found in $miniaudio_mod ($ma_dir)" >&2
		exit 1
	fi
	mkdir -p "$cgo_include/miniaudio"
	cp "$ma_dir/miniaudio.h" "$cgo_include/miniaudio/.miniaudio.h.$$"
	mv "$cgo_include/miniaudio/.miniaudio.h.$$" "$cgo_include/miniaudio/miniaudio.h"
fi

export CGO_ENABLED=1
export CGO_CPPFLAGS="-I$ollama_dir/llama/llama.cpp/include -I$ollama_dir/llama/llama.cpp/common -I$ollama_dir/llama/llama.cpp/src -I$ollama_dir/ml/backend/ggml/ggml/include -I$cgo_include${CGO_CPPFLAGS:+ $CGO_CPPFLAGS}"
# Homebrew on Apple Silicon installs under /opt/homebrew, whose headers clang does not
# search: name nlohmann-json's include directory when brew knows it.
if [[ "$(go env GOOS)" == darwin ]] && command -v brew >/dev/null; then
	nlohmann="$(brew --prefix nlohmann-json 2>/dev/null || true)"
	if [[ -n "$nlohmann" && -d "$nlohmann/include" ]]; then
		export CGO_CPPFLAGS="$CGO_CPPFLAGS -I$nlohmann/include"
	fi
	# mtmd includes "stb/stb_image.h": link brew's stb header there, wherever in its
	# include directory the formula put it.
	stb="$(brew --prefix stb 2>/dev/null || true)"
	for h in "$stb/include/stb/stb_image.h" "$stb/include/stb_image.h"; do
		if [[ -n "$stb" && -f "$h" ]]; then
			mkdir -p "$cgo_include/stb" && ln -sf "$h" "$cgo_include/stb/stb_image.h"
			break
		fi
	done
fi

if [[ "$(go env GOOS)" == linux && "$(go env GOARCH)" == amd64 ]]; then
	opt="-O3"
	if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && grep -qw f16c /proc/cpuinfo \
		&& grep -qw bmi2 /proc/cpuinfo; then
		opt="-O3 -march=x86-64-v3"
	fi
	export CGO_CFLAGS="$opt${CGO_CFLAGS:+ $CGO_CFLAGS}"
	export CGO_CXXFLAGS="$opt${CGO_CXXFLAGS:+ $CGO_CXXFLAGS}"
fi
# Elsewhere (darwin/arm64 in particular) the defaults are right: Metal, Accelerate and
# the native CPU features come from the ollama packages' own cgo directives.

exec "$@"
