#!/usr/bin/env bash
# Usage: VERSION=v0.2.0 COMMIT=0123abc HELM=bin/helm [CA_CERTS=FILE] [RELEASE_RUNNER=FILE] hack/release.sh OUT
#
# Builds the release artifacts into OUT (`make release`; the release workflow runs the
# same and adds the runner, which needs a Mac), on Linux or macOS alike:
#
#   macfleet-image-VERSION.oci.tar              the manager/gateway image, linux/amd64 and
#                                               linux/arm64, as an OCI layout tar (no
#                                               container runtime needed; hack/release),
#                                               with CA roots: CA_CERTS, else this
#                                               machine's bundle (none is an error)
#   macfleet-CHARTVERSION.tgz                   the chart; its default image is the one above
#   macfleet-VERSION-OS-ARCH.tar.gz             the macfleet binary for darwin and linux,
#                                               arm64 and amd64: the Macs and the admin
#   macfleet-runner-VERSION-darwin-arm64.tar.gz the runner, where RELEASE_RUNNER names one built
#                                               on a Mac (make runner)
#   SHA256SUMS
#   homebrew-tap/Formula/macfleet.rb            the formula of `brew install ORG/tap/macfleet`:
#                                               hack/homebrew/macfleet.rb with the archives'
#                                               urls (RELEASE_URL, default the GitHub
#                                               release) and checksums
#
# Every binary is static (CGO_ENABLED=0), trimmed and stamped with VERSION and COMMIT.
# Files get the commit's time, so the same commit gives the same bytes. Archives and
# checksums are written by hack/release, not by tar, gzip or sha256sum, whose flags
# differ between GNU (Linux) and BSD (macOS).
set -euo pipefail

if [[ $# -ne 1 || -z "${VERSION:-}" || -z "${HELM:-}" ]]; then
	echo "usage: VERSION=vX.Y.Z [COMMIT=…] HELM=… [CA_CERTS=…] [RELEASE_RUNNER=…] $0 OUT" >&2
	exit 2
fi
out=$1
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
chart_version=${VERSION#v}
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
pkg=github.com/macfleet/macfleet/internal/version
ldflags="-s -w -X $pkg.version=$VERSION -X $pkg.commit=${COMMIT:-}"
# The tool is built once; each step below runs it.
tool="$out/build/release"

rm -rf "$out"
mkdir -p "$out/build"
CGO_ENABLED=0 go build -o "$tool" ./hack/release

build() { # build GOOS GOARCH
	echo "building macfleet $VERSION for $1/$2"
	CGO_ENABLED=0 GOOS=$1 GOARCH=$2 go build -trimpath -ldflags "$ldflags" -o "$out/build/$1-$2/macfleet" ./cmd/macfleet
}
archive() { # archive BINARY GOOS GOARCH FILE...: BINARY-VERSION-GOOS-GOARCH.tar.gz
	local name=$1-$VERSION-$2-$3
	local platform=$2/$3
	shift 3
	"$tool" archive -o "$out/$name.tar.gz" -platform "$platform" -epoch "$epoch" "$@"
}
for platform in darwin/arm64 darwin/amd64 linux/arm64 linux/amd64; do
	goos=${platform%/*} goarch=${platform#*/}
	build "$goos" "$goarch"
	archive macfleet "$goos" "$goarch" "$out/build/$goos-$goarch/macfleet" README.md
done
if [[ -n "${RELEASE_RUNNER:-}" ]]; then
	archive macfleet-runner darwin arm64 "$RELEASE_RUNNER"
fi

image="$out/macfleet-image-$VERSION.oci.tar"
"$tool" image -o "$image" -tag "$VERSION" -epoch "$epoch" -ca-certs "${CA_CERTS:-}" \
	linux/amd64="$out/build/linux-amd64/macfleet" linux/arm64="$out/build/linux-arm64/macfleet"

HELM_CACHE_HOME="$out/build/helm" HELM_CONFIG_HOME="$out/build/helm" HELM_DATA_HOME="$out/build/helm" \
	"$HELM" package charts/macfleet --version "$chart_version" --app-version "$VERSION" -d "$out"

"$tool" check -image "$image" -chart "$out/macfleet-$chart_version.tgz" -helm "$HELM"
"$tool" tap -version "$VERSION" -url "${RELEASE_URL:-}" -o "$out/homebrew-tap" "$out"/*.tar.gz
"$tool" sums "$out"
rm -rf "$out/build"
