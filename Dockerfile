# The manager and gateway image: one static macfleet binary (`macfleet manager`,
# `macfleet gateway`) on distroless, running as a non-root user.
#
#   docker build -t ghcr.io/macfleet/macfleet:dev .
#   docker buildx build --platform linux/amd64,linux/arm64 -t … .
#
# The runner (llama.cpp, cgo) is not in the image: it runs on the Macs beside the agent.

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS=linux
ARG TARGETARCH
WORKDIR /src
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/macfleet ./cmd/macfleet

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/macfleet /macfleet
# 65532 is distroless's nonroot user; the chart's podSecurityContext uses the same id.
USER 65532:65532
ENTRYPOINT ["/macfleet"]
