# macfleet — build, generate, test. Tools are pinned in hack/tools/go.mod and run with
# `go tool`; the kube-apiserver, etcd and kubectl used by tests are built from Go
# modules by hack/envtest and cached by version under $(CACHE_DIR).
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

K8S_VERSION   ?= 1.36.3
ETCD_VERSION  ?= 3.6.6
CACHE_DIR     ?= $(HOME)/.cache/macfleet
ENVTEST_DIR   := $(CACHE_DIR)/k8s/$(K8S_VERSION)-etcd$(ETCD_VERSION)
BIN           := $(CURDIR)/bin
RUNNER        := $(BIN)/macfleet-runner
GO_TEST_FLAGS ?= -race -p 2 -timeout 30m
TOOLS         := go tool -modfile=hack/tools/go.mod
CONTROLLER_GEN := $(TOOLS) controller-gen
HELM          := $(BIN)/helm
HELM_VERSION  := $(shell awk '$$1 == "helm.sh/helm/v3" {print $$2}' hack/tools/go.mod)
# helm assumes this Kubernetes version when no cluster is asked (template, lint): the
# minor of the client-go it is built with, as helm's own release builds do.
HELM_K8S_MINOR := $(shell awk '$$1 == "k8s.io/client-go" {split($$2, v, "."); print v[2]}' hack/tools/go.mod)
HELM_LDFLAGS  := -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	$(foreach p,pkg/chartutil pkg/lint/rules,-X helm.sh/helm/v3/$(p).k8sVersionMajor=1 -X helm.sh/helm/v3/$(p).k8sVersionMinor=$(HELM_K8S_MINOR))
# golangci-lint, run by `make verify` (hack/lint.sh, .golangci.yml): built from the Go
# module pinned in hack/tools/go.mod into the cache, once per version.
GOLANGCI_LINT_VERSION := $(shell awk '$$1 == "github.com/golangci/golangci-lint/v2" {print $$2}' hack/tools/go.mod)
GOLANGCI_LINT := $(CACHE_DIR)/golangci-lint/$(GOLANGCI_LINT_VERSION)/golangci-lint
CHART         := charts/macfleet
# The version stamped into every binary (internal/version, printed by `macfleet version`):
# the nearest release tag from `git describe` (v0.2.0, or v0.2.0-3-g0123abc between tags,
# -dirty with uncommitted changes), "dev" where there is none; VERSION=v0.2.0 overrides it
# (the Homebrew formula builds from a release's source, which has no .git).
VERSION       ?= $(shell git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null || echo dev)
COMMIT        ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)
VERSION_PKG   := github.com/macfleet/macfleet/internal/version
LDFLAGS       := -X $(VERSION_PKG).version=$(VERSION) -X $(VERSION_PKG).commit=$(COMMIT)
# The release's version: VERSION, or v0.0.0-dev.gCOMMIT where there is no tag (a chart's
# version must be semver, and the image's tag is the chart's appVersion).
RELEASE_VERSION ?= $(if $(filter dev,$(VERSION)),v0.0.0-dev.g$(or $(COMMIT),unknown),$(VERSION))
RELEASE_DIR   ?= $(BIN)/release
CHART_SYNC    := go run ./test/chart/chartsync
# The peer server `make bench-peers` measures against: built from the Go module at the
# version go.mod requires, once per version, into the cache.
PEER_VERSION  := $(shell awk '$$1 == "github.com/ollama/ollama" {print $$2}' go.mod)
PEER_DIR      := $(CACHE_DIR)/peers/$(PEER_VERSION)
PEER          := $(PEER_DIR)/ollama

# What this machine needs for the goals asked (hack/deps.sh): the test set for test-like
# goals, the peers set for bench-peers and peer, the demo set otherwise.
DEPS_GOALS    := $(strip $(if $(filter test attack soak fuzz bench chart-test record-clients,$(MAKECMDGOALS)),test,$(if $(filter bench-peers peer,$(MAKECMDGOALS)),,demo)) \
	$(if $(filter bench-peers peer,$(MAKECMDGOALS)),peers))
# The components this run builds from nothing, in make's order: hack/step.sh announces
# each as "[N/M] name" with the time since make started.
MACFLEET_STEPS := $(strip $(if $(wildcard $(ENVTEST_DIR)/kube-apiserver),,etcd kube-apiserver kubectl) \
	$(if $(filter demo dev-cluster bench-peers bench-fleetcache bench-abuse,$(MAKECMDGOALS)),$(if $(wildcard $(BIN)/macfleet),,macfleet)) \
	$(if $(filter demo runner test attack soak bench bench-peers bench-fleetcache bench-abuse record-clients,$(MAKECMDGOALS)),$(if $(wildcard $(RUNNER)),,runner)) \
	$(if $(filter bench-peers peer,$(MAKECMDGOALS)),$(if $(wildcard $(PEER)),,peer)) \
	$(if $(filter test helm chart-test chart-verify,$(MAKECMDGOALS)),$(if $(wildcard $(HELM)),,helm)) \
	$(if $(filter verify lint golangci-lint,$(MAKECMDGOALS)),$(if $(wildcard $(GOLANGCI_LINT)),,golangci-lint)))
MACFLEET_STEPS_START := $(shell date +%s)
export MACFLEET_STEPS MACFLEET_STEPS_START CACHE_DIR

export KUBEBUILDER_ASSETS := $(ENVTEST_DIR)
export MACFLEET_RUNNER    := $(RUNNER)
export MACFLEET_HELM      := $(HELM)
export GOLANGCI_LINT

.PHONY: all
all: generate manifests build

##@ Set-up

.PHONY: deps
deps: ## Install the Debian packages (and for test the npm clients) this machine lacks; fail at once if it cannot.
	hack/deps.sh $(DEPS_GOALS)

##@ Generation

.PHONY: generate
generate: ## Generate deepcopy functions.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

.PHONY: manifests
manifests: ## Generate CRDs and RBAC from markers; copy them into the chart.
	$(CONTROLLER_GEN) crd rbac:roleName=macfleet-manager paths=./api/... paths=./controllers/... paths=./cmd/macfleet/manager/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	$(CONTROLLER_GEN) rbac:roleName=macfleet-gateway paths=./gateway/... output:rbac:artifacts:config=config/rbac/gateway
	$(CHART_SYNC)

##@ Build

.PHONY: build
build: ## Build the pure-Go macfleet binary.
	CGO_ENABLED=0 hack/step.sh macfleet go build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/macfleet ./cmd/macfleet

.PHONY: runner
runner: $(RUNNER) ## Build the cgo runner (llama.cpp; Metal on darwin, CPU elsewhere).
# The runner's own code and the packages it links (internal/chat, api/runnerapi, ...):
# a change to the output parser must rebuild it (go build itself is cached).
$(RUNNER): $(shell find metal/runner cmd/macfleet-runner internal api -name '*.go' ! -name '*_test.go' -o -name '*.h' -o -name '*.c*' 2>/dev/null) go.mod hack/build-runner.sh | deps
	GO_LDFLAGS="$(LDFLAGS)" hack/step.sh runner hack/build-runner.sh $(RUNNER)

.PHONY: envtest
envtest: $(ENVTEST_DIR)/kube-apiserver ## Build kube-apiserver, etcd and kubectl from Go modules (cached).
$(ENVTEST_DIR)/kube-apiserver: | deps
	hack/envtest/build.sh $(ENVTEST_DIR) $(K8S_VERSION) $(ETCD_VERSION)

.PHONY: release
release: helm ## Build the release into bin/release on Linux or macOS: the image (OCI layout, linux/amd64+arm64, CA roots), the chart package, macfleet for darwin and linux (arm64, amd64), checksums, the Homebrew tap (RELEASE_RUNNER= adds the runner, CA_CERTS= the image's CA bundle).
	VERSION=$(RELEASE_VERSION) COMMIT=$(COMMIT) HELM=$(HELM) hack/release.sh $(RELEASE_DIR)

##@ Verify and test

.PHONY: verify
verify: ## Fail if generation leaves a diff; vet; lint (golangci-lint); structure counts over their limits; cross-compile for darwin/arm64.
	hack/verify.sh

.PHONY: lint
lint: golangci-lint ## Run golangci-lint (.golangci.yml: function length, duplication, import layers).
	hack/lint.sh

.PHONY: structure
structure: ## Count the code's shapes against hack/structure/limits.txt (pointer-only types, pool locks, the acquire walk, wide parameters, upward imports, long functions, the runner server's widest method set).
	go run ./hack/structure

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT) ## Build golangci-lint from Go modules into the cache (version pinned in hack/tools/go.mod).
$(GOLANGCI_LINT):
	hack/step.sh golangci-lint go build -modfile=hack/tools/go.mod -trimpath \
		-ldflags "-X main.version=$(patsubst v%,%,$(GOLANGCI_LINT_VERSION))" -o $@ github.com/golangci/golangci-lint/v2/cmd/golangci-lint

.PHONY: test
test: deps envtest runner helm ## Run every test (race detector, real API server, real runners).
	hack/go-env.sh go test $(GO_TEST_FLAGS) ./...

.PHONY: attack
attack: deps envtest runner ## Try each data-plane exploit of docs/security.md against real components, as an attacker would.
	hack/attack.sh

# CLIENTS_NODE_MODULES: a node_modules folder holding other versions of the coding
# agents (npm install --prefix DIR @anthropic-ai/claude-code@VERSION @openai/codex@VERSION
# gives DIR/node_modules); default hack/npm's pinned install.
CLIENTS_NODE_MODULES ?=

.PHONY: record-clients
record-clients: deps envtest runner ## Record the coding agents' first requests against the local fleet into internal/chat/translate/testdata/clients.
	MACFLEET_E2E_RECORD=1 $(if $(CLIENTS_NODE_MODULES),MACFLEET_NODE_MODULES=$(abspath $(CLIENTS_NODE_MODULES))) \
		hack/go-env.sh go test -count=1 -timeout 30m -run '^TestCodingAgents$$' -v ./test/e2e/

SOAK_DURATION ?= 10m
SOAK_SEED     ?= 1
SOAK_TIMEOUT  ?= 3h

.PHONY: soak
soak: envtest runner ## Chaos soak: the local fleet under mixed traffic and seeded faults for SOAK_DURATION (10m; CI: 90s).
	SOAK_DURATION=$(SOAK_DURATION) SOAK_SEED=$(SOAK_SEED) go test -race -count=1 -timeout $(SOAK_TIMEOUT) -run '^TestSoak$$' -v ./test/soak/

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (default 10000x: inputs, not seconds).
	hack/fuzz.sh

.PHONY: bench
bench: envtest runner ## Run the benchmarks named in docs/benchmarks.md.
	hack/bench.sh

SPEC_ROUNDS ?= 10

.PHONY: bench-spec
bench-spec: runner ## Speculative decoding: single-stream decode off and on in one run, copy-heavy and nothing to copy (docs/speculative-decoding.md).
	MACFLEET_RUNNER=$(RUNNER) go test -count=1 -run '^$$' -bench Speculation -benchtime $(SPEC_ROUNDS)x ./test/runner

.PHONY: bench-fillers
bench-fillers: runner ## Fillers: the same streams on one block of slots and on every fourth slot, with and without fillers, in one run (docs/runner-protocol.md#scheduling).
	MACFLEET_RUNNER=$(RUNNER) go test -count=1 -run '^$$' -bench SlotLayouts -benchtime 3x ./test/runner

# PEERS_SMOKE=1: one round of the tiny model with short outputs, to check the harness
# end to end (CI), not the figures.
PEERS_SMOKE   ?=
PEERS_ROUNDS  ?= $(if $(PEERS_SMOKE),1,3)
PEERS_MODEL   ?= $(if $(PEERS_SMOKE),tiny,mid)
PEERS_TOKENS  ?= $(if $(PEERS_SMOKE),16,128)
PEERS_FLAGS   ?= $(if $(PEERS_SMOKE),-long 200)

.PHONY: bench-peers
bench-peers: build runner $(PEER) ## Measure macfleet serve side by side with a peer server on this machine (docs/benchmarks.md).
	go run ./test/bench/peers -macfleet $(BIN)/macfleet -runner $(RUNNER) -peer $(PEER) -peer-version $(PEER_VERSION) \
		-rounds $(PEERS_ROUNDS) -model $(PEERS_MODEL) -tokens $(PEERS_TOKENS) $(PEERS_FLAGS)

# The harness compiled on its own (pure Go), for a machine without Go: the GPU machine of
# docs/benchmarks.md, "On the card", where it runs beside macfleet, the runner and the peer.
.PHONY: bench-peers-bin
bench-peers-bin: ## Compile the bench-peers harness into bin/bench-peers/peers, to run where there is no Go (docs/benchmarks.md, "On the card").
	CGO_ENABLED=0 go build -trimpath -o $(BIN)/bench-peers/peers ./test/bench/peers

# FLEETCACHE_SMOKE=1: 2 Macs, 2 tenants × 2 users of short prompts, to check the harness
# end to end (the fleet's start takes most of its half minute), not the figures.
FLEETCACHE_SMOKE ?=
FLEETCACHE_FLAGS ?= $(if $(FLEETCACHE_SMOKE),-smoke)

.PHONY: bench-fleetcache
bench-fleetcache: envtest build runner ## The fleet as one prompt cache (issue 26): least-load, prefix-affinity, prefix-cache routing, and prefix-cache with peer fetch, on 4 simulated Macs (docs/benchmarks.md).
	go run ./test/bench/fleetcache -macfleet $(BIN)/macfleet -runner $(RUNNER) $(FLEETCACHE_FLAGS)

# ABUSE_SMOKE=1: a few streams, 300 connections, 200 bearers, 20 pairs against the same
# binary, to check the harness end to end (TestSmoke runs it in `make test`), not the
# figures. The hot path is compared with the gateway of ABUSE_BASELINE: main before
# issue 42's defences were merged (budget reservations, connection caps per source,
# TokenReview limits).
ABUSE_SMOKE    ?=
ABUSE_BASELINE ?= 289c4a94ef54da2ceec5d56c2310f9b4421a0bff
ABUSE_FLAGS    ?= $(if $(ABUSE_SMOKE),-smoke)

.PHONY: bench-abuse
bench-abuse: envtest build runner ## Issue 42's defences under attack on the local fleet: a budget across two gateways, idle connections, random bearers, the hot path against ABUSE_BASELINE (docs/benchmarks.md).
	go run ./test/bench/abuse -macfleet $(BIN)/macfleet -runner $(RUNNER) \
		$(if $(ABUSE_SMOKE),,-baseline "$$(hack/build-macfleet-at.sh $(ABUSE_BASELINE))") $(ABUSE_FLAGS)

.PHONY: bench-runners
bench-runners: ## Compare the runners of COMMITS side by side, interleaved (the last is the baseline; RUNNERS_FLAGS for more).
	@test -n "$(COMMITS)" || { echo 'usage: make bench-runners COMMITS="OLD ... NEW" [RUNNERS_FLAGS="-rounds 5"]' >&2; exit 2; }
	RUNNERS_FLAGS="$(RUNNERS_FLAGS)" hack/bench-runners.sh $(COMMITS)

.PHONY: peer
peer: $(PEER) ## Build the peer server of bench-peers into the cache (once per version).
$(PEER): | deps
	hack/step.sh peer hack/build-peer.sh $(PEER_DIR)

##@ Helm chart

.PHONY: helm
helm: $(HELM) ## Build helm from Go modules (version pinned in hack/tools/go.mod).
$(HELM): hack/tools/go.mod hack/tools/go.sum | deps
	hack/step.sh helm go build -modfile=hack/tools/go.mod -trimpath -ldflags "$(HELM_LDFLAGS)" -o $@ helm.sh/helm/v3/cmd/helm

.PHONY: chart-sync
chart-sync: ## Copy the CRDs, RBAC, node namespaces and admission policy from config/ into the chart.
	$(CHART_SYNC)

.PHONY: chart-verify
chart-verify: helm ## Fail if the chart's copies of config/ are stale or `helm lint --strict` complains.
	$(CHART_SYNC) -check
	$(HELM) lint --strict $(CHART)

.PHONY: chart-test
chart-test: envtest helm ## Render the chart and install, upgrade and uninstall it on a real API server.
	hack/go-env.sh go test $(GO_TEST_FLAGS) ./test/chart/...

##@ Local

.PHONY: dev-cluster
dev-cluster: envtest build ## Start a local apiserver+etcd with the CRDs; prints a kubeconfig path.
	hack/dev-cluster.sh $(ENVTEST_DIR)

.PHONY: demo
demo: deps envtest build runner ## The main job: a local fleet answering a streamed chat completion.
	hack/demo.sh

.PHONY: trained-model
trained-model: ## Stage the small test model's corpus and train.py in .cache/trainmodel for a GPU run (docs/testing.md).
	hack/trained-model.sh stage

.PHONY: trained-model-convert
trained-model-convert: ## Write test/models/tiny-chat-trained.gguf from the weights train.py saved in WEIGHTS.
	hack/trained-model.sh convert $(WEIGHTS)

.PHONY: help
help: ## Show targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*##/ {printf "  %-12s %s\n", $$1, $$2} /^##@/ {printf "\n%s\n", substr($$0, 5)}' $(MAKEFILE_LIST)
