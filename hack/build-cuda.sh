#!/usr/bin/env bash
# Usage: hack/build-cuda.sh OUT_DIR [SRC]
#
# Builds ggml's CUDA backend (libggml-cuda.so, with the libggml-base.so it links) from
# the ollama module that the runner vendors llama.cpp and ggml from, with nvcc, into
# OUT_DIR: the runner's backend directory (the folder lib beside bin/macfleet-runner,
# or --backend-dir / $MACFLEET_BACKEND_DIR). SRC is the module directory (default: the
# Go module cache's, `go list -m`); a machine without Go gets a copy of its
# CMakeLists.txt and ml/backend/ggml/ggml (hack/device-pack.sh makes one).
#
# CUDA_ARCHITECTURES (default 90, Hopper) picks the GPUs compiled for, e.g. "86;89;90".
# Needs CMake, Ninja and the CUDA toolkit. On 16 cores: about 160 s.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
	echo "usage: $0 OUT_DIR [SRC]" >&2
	exit 2
fi
out="$1"
src="${2:-}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "$src" ]]; then
	src="$(cd "$root" && go list -m -f '{{.Dir}}' github.com/ollama/ollama)"
fi
for f in CMakeLists.txt ml/backend/ggml/ggml/src/ggml-cuda/CMakeLists.txt; do
	[[ -f "$src/$f" ]] || { echo "build-cuda.sh: $src/$f not found" >&2; exit 1; }
done
command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] || {
	echo "build-cuda.sh: nvcc not found (install the CUDA toolkit)" >&2
	exit 1
}
export PATH="$PATH:/usr/local/cuda/bin"
build="${BUILD_DIR:-$out/.build}"
mkdir -p "$out" "$build"
# The sources are built from a copy with hack/cuda-patches applied (the module's files
# are read-only, and a copy already patched the same way is kept between builds).
# graph-per-shape.patch: ggml records a CUDA graph for one-token batches only, one a
# context, recorded again whenever the batch's shape changes; patched, batches of up
# to 64 tokens (MACFLEET_CUDA_GRAPH_MAX_TOKENS) run as graphs and each shape keeps its
# own (recorded the second time the shape runs), so a step verifying drafted tokens and
# the one-token step after it both replay a graph (docs/speculative-decoding.md).
patches=("$root"/hack/cuda-patches/*.patch)
stamp="$(cat "${patches[@]}" | sha256sum | cut -c1-16)"
tree="$build/src"
if [[ "$(cat "$tree/.patches" 2>/dev/null)" != "$stamp" ]]; then
	rm -rf "$tree"
	mkdir -p "$tree/ml/backend/ggml"
	cp "$src/CMakeLists.txt" "$tree/"
	cp -r "$src/ml/backend/ggml/ggml" "$tree/ml/backend/ggml/"
	chmod -R u+w "$tree"
	for p in "${patches[@]}"; do
		if command -v patch >/dev/null; then
			patch -s -d "$tree" -p1 <"$p"
		else
			git apply --directory="$tree" --unsafe-paths -p1 "$p"
		fi
	done
	echo "$stamp" >"$tree/.patches"
fi
# The module's CMakeLists.txt sets ggml's options as the peer builds them (dynamic
# backends, CUDA graphs, flash attention); one CPU variant, since the runner links its
# own CPU backend and loads none. The libraries find each other and the CUDA runtime
# through their RUNPATH ($ORIGIN, then the toolkit's library folder).
cmake -S "$tree" -B "$build" -G Ninja \
	-DCMAKE_BUILD_TYPE=Release \
	-DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90}" \
	-DGGML_CPU_ALL_VARIANTS=OFF \
	-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
	-DCMAKE_INSTALL_RPATH='$ORIGIN' \
	-DCMAKE_INSTALL_RPATH_USE_LINK_PATH=ON >"$build/configure.log"
cmake --build "$build" --target ggml-cuda -j "$(nproc)"
cp -a "$build"/lib/ollama/libggml-cuda.so* "$build"/lib/ollama/libggml-base.so* "$out"/
ls -l "$out"
