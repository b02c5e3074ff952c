# meshca — see README.md. Every external program is built or installed by
# the scripts below and cached under $(MESHCA_CACHE), outside the clone.
export MESHCA_CACHE ?= $(HOME)/.cache/meshca
GO ?= go
GOTEST_FLAGS ?= -race -count=1
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all build test test-unit test-integration test-istio tools k8s proto proto-check bench demo check lint clean

all: build

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o bin/meshca ./cmd/meshca

## test: everything — unit tests, then the integration tests against a real
## etcd + kube-apiserver and an unmodified Istio client.
test: proto-check check test-unit test-integration test-istio

test-unit:
	$(GO) test $(GOTEST_FLAGS) ./...

# Build (cached) the real etcd and kube-apiserver (k8s), and cfssl and
# Vault (tools), before go test starts, so that the first, long builds show
# their progress and are not cut by a test timeout. The three builds run at
# once: their module downloads overlap the others' compiling.
k8s:
	hack/deps.sh
	integration/scripts/k8s.sh build

tools:
	hack/deps.sh
	@set -e; integration/scripts/k8s.sh build & k=$$!; integration/scripts/vault.sh build & v=$$!; \
	integration/scripts/cfssl.sh build & c=$$!; wait $$k; wait $$v; wait $$c

test-integration: tools
	cd integration && $(GO) test $(GOTEST_FLAGS) -timeout 20m ./...

test-istio: k8s
	# Wire compatibility, not concurrency: no -race, which halves its cold build.
	cd integration/istioclient && $(GO) test -count=1 -timeout 20m ./...

proto:
	hack/protogen.sh

proto-check:
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && hack/protogen.sh $$tmp && \
	for f in $$(cd $$tmp && find proto -name '*.go'); do \
	  cmp -s $$tmp/$$f $$f || { echo "proto-check: $$f is stale; run make proto" >&2; exit 1; }; \
	done && \
	n=$$(find proto -name '*.pb.go' | wc -l) && m=$$(cd $$tmp && find proto -name '*.pb.go' | wc -l) && \
	[ $$n -eq $$m ] || { echo "proto-check: generated files differ in number ($$n vs $$m)" >&2; exit 1; }
	@echo "proto-check: generated code is current"

bench: tools
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./csr ./signer/... ./ca
	cd integration && $(GO) test -run '^$$' -bench . -benchtime 1x ./e2e
	cd integration && $(GO) test -run '^$$' -bench . -benchtime 2x ./signers

demo: k8s
	cd integration && $(GO) run ./cmd/demo $(DEMO_FLAGS)

## check: gofmt, the budgets (hack/budgets: file size, direct requires,
## grpc/status, package layering), go vet, go mod tidy (part of test); lint
## adds staticcheck.
check:
	@out=$$(gofmt -l . ) && [ -z "$$out" ] || { echo "gofmt needed:" $$out >&2; exit 1; }
	$(GO) run ./hack/budgets
	$(GO) vet ./...
	cd integration && $(GO) vet ./...
	$(GO) mod tidy -diff && cd integration && $(GO) mod tidy -diff && cd istioclient && $(GO) mod tidy -diff

lint: check
	$(GO) run $(STATICCHECK) ./...
	cd integration && $(GO) run $(STATICCHECK) ./...

clean:
	rm -rf bin _out
