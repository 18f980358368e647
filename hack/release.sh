#!/usr/bin/env bash
# Usage: VERSION=v0.2.0 COMMIT=0123abc HELM=bin/helm hack/release.sh OUT
#
# Builds the release artifacts into OUT (`make release`; the release workflow runs the
# same and adds the runner, which needs a Mac):
#
#   macfleet-image-VERSION.oci.tar          the manager/gateway image, linux/amd64 and
#                                           linux/arm64, as an OCI layout tar (no
#                                           container runtime needed; hack/release)
#   macfleet-CHARTVERSION.tgz               the chart; its default image is the one above
#   macfleet-VERSION-darwin-arm64.tar.gz    the macfleet binary for the Macs and the admin
#   SHA256SUMS
#
# Every binary is static (CGO_ENABLED=0), trimmed and stamped with VERSION and COMMIT.
# Files get the commit's time, so the same commit gives the same bytes.
set -euo pipefail

if [[ $# -ne 1 || -z "${VERSION:-}" || -z "${HELM:-}" ]]; then
	echo "usage: VERSION=vX.Y.Z [COMMIT=…] HELM=… $0 OUT" >&2
	exit 2
fi
out=$1
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
chart_version=${VERSION#v}
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
pkg=github.com/macfleet/macfleet/internal/version
ldflags="-s -w -X $pkg.version=$VERSION -X $pkg.commit=${COMMIT:-}"

rm -rf "$out"
mkdir -p "$out/build"
build() { # build GOOS GOARCH
	echo "building macfleet $VERSION for $1/$2"
	CGO_ENABLED=0 GOOS=$1 GOARCH=$2 go build -trimpath -ldflags "$ldflags" -o "$out/build/$1-$2/macfleet" ./cmd/macfleet
}
build linux amd64
build linux arm64
build darwin arm64

image="$out/macfleet-image-$VERSION.oci.tar"
ca=()
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
	ca=(-ca-certs /etc/ssl/certs/ca-certificates.crt)
fi
go run ./hack/release image -o "$image" -tag "$VERSION" -epoch "$epoch" "${ca[@]}" \
	linux/amd64="$out/build/linux-amd64/macfleet" linux/arm64="$out/build/linux-arm64/macfleet"

HELM_CACHE_HOME="$out/build/helm" HELM_CONFIG_HOME="$out/build/helm" HELM_DATA_HOME="$out/build/helm" \
	"$HELM" package charts/macfleet --version "$chart_version" --app-version "$VERSION" -d "$out"

# The darwin archive: the binary and the README, owned by root, with the commit's time.
stage="$out/build/macfleet-$VERSION-darwin-arm64"
mkdir -p "$stage"
cp "$out/build/darwin-arm64/macfleet" README.md "$stage/"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -C "$out/build" \
	-cf - "macfleet-$VERSION-darwin-arm64" | gzip -9n >"$out/macfleet-$VERSION-darwin-arm64.tar.gz"

go run ./hack/release check -image "$image" -chart "$out/macfleet-$chart_version.tgz" -helm "$HELM"
rm -rf "$out/build"
(cd "$out" && sha256sum -- * >SHA256SUMS && cat SHA256SUMS)
