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

export KUBEBUILDER_ASSETS := $(ENVTEST_DIR)
export MACFLEET_RUNNER    := $(RUNNER)

.PHONY: all
all: generate manifests build

##@ Generation

.PHONY: generate
generate: ## Generate deepcopy functions.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

.PHONY: manifests
manifests: ## Generate CRDs and RBAC from markers.
	$(CONTROLLER_GEN) crd rbac:roleName=macfleet-manager paths=./api/... paths=./controllers/... paths=./internal/manager/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac

##@ Build

.PHONY: build
build: ## Build the pure-Go macfleet binary.
	CGO_ENABLED=0 go build -trimpath -o $(BIN)/macfleet ./cmd/macfleet

.PHONY: runner
runner: $(RUNNER) ## Build the cgo runner (llama.cpp; Metal on darwin, CPU elsewhere).
$(RUNNER): $(shell find runner cmd/macfleet-runner -name '*.go' -o -name '*.h' -o -name '*.c*' 2>/dev/null) go.mod hack/build-runner.sh
	hack/build-runner.sh $(RUNNER)

.PHONY: envtest
envtest: $(ENVTEST_DIR)/kube-apiserver ## Build kube-apiserver, etcd and kubectl from Go modules (cached).
$(ENVTEST_DIR)/kube-apiserver:
	hack/envtest/build.sh $(ENVTEST_DIR) $(K8S_VERSION) $(ETCD_VERSION)

##@ Verify and test

.PHONY: verify
verify: ## Fail if generation leaves a diff; vet; cross-compile for darwin/arm64.
	hack/verify.sh

.PHONY: test
test: envtest runner ## Run every test (race detector, real API server, real runners).
	hack/go-env.sh go test $(GO_TEST_FLAGS) ./...

.PHONY: bench
bench: envtest runner ## Run the benchmarks named in docs/benchmarks.md.
	hack/bench.sh

##@ Local

.PHONY: dev-cluster
dev-cluster: envtest build ## Start a local apiserver+etcd with the CRDs; prints a kubeconfig path.
	hack/dev-cluster.sh $(ENVTEST_DIR)

.PHONY: demo
demo: envtest build runner ## The main job: a local fleet answering a streamed chat completion.
	hack/demo.sh

.PHONY: help
help: ## Show targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*##/ {printf "  %-12s %s\n", $$1, $$2} /^##@/ {printf "\n%s\n", substr($$0, 5)}' $(MAKEFILE_LIST)
