# meshca — see README.md. Every external program is built or installed by
# the scripts below and cached under $(MESHCA_CACHE), outside the clone.
export MESHCA_CACHE ?= $(HOME)/.cache/meshca
GO ?= go
GOTEST_FLAGS ?= -race -count=1
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all build build-hsm test test-unit test-hsm test-integration test-istio tools k8s istio manifests proto proto-check bench demo check lint clean

all: build

# BIN_DIR is where build and build-hsm write meshca.
BIN_DIR ?= bin

## build: bin/meshca, static (CGO_ENABLED=0): no libc, runs from scratch.
build:
	CGO_ENABLED=0 $(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN_DIR)/meshca ./cmd/meshca

## build-hsm: bin/meshca-hsm, the HSM variant: the pkcs11 upstream (build
## tag pkcs11) needs cgo, so it links to libc dynamically and dlopens the
## vendor's PKCS#11 module at run time; the resolver and user lookups stay
## pure Go (netgo, osusergo), so libc is all it needs besides the module.
HSM_TAGS := pkcs11,netgo,osusergo
build-hsm:
	hack/deps.sh
	CGO_ENABLED=1 $(GO) build -tags $(HSM_TAGS) -ldflags "-X main.version=$(VERSION)" -o $(BIN_DIR)/meshca-hsm ./cmd/meshca

## image: the container image without a container daemon (hack/image, its
## own module, with go-containerregistry): a static -trimpath build of
## meshca stamped with VERSION, in an OCI image layout tarball with a
## docker manifest.json (docker load, podman load, skopeo oci-archive:).
## Every time in it is SOURCE_DATE_EPOCH (default: HEAD's commit time), so
## the same tree and Go give the same digest. The Dockerfile makes the same
## files with a daemon.
.PHONY: image image-hsm test-image
IMAGE_TAR ?= _out/meshca-image.tar
IMAGE_REPOSITORY ?= ghcr.io/meshca/meshca
image:
	cd hack/image && $(GO) run . -root $(CURDIR) -version $(VERSION) \
	  -repository $(IMAGE_REPOSITORY) -out $(abspath $(IMAGE_TAR))

## image-hsm: the HSM variant's image (meshca-hsm): the build-hsm binary,
## and the dynamic loader and libc it links to, taken from this machine's
## Debian libc6 (its version is a label); the operator mounts the vendor's
## PKCS#11 module (docs/upstream.md).
HSM_IMAGE_TAR ?= _out/meshca-hsm-image.tar
HSM_IMAGE_REPOSITORY ?= ghcr.io/meshca/meshca-hsm
image-hsm:
	hack/deps.sh
	cd hack/image && $(GO) run . -variant hsm -root $(CURDIR) -version $(VERSION) \
	  -repository $(HSM_IMAGE_REPOSITORY) -out $(abspath $(HSM_IMAGE_TAR))

## test: everything — unit tests, then the integration tests against a real
## etcd + kube-apiserver and an unmodified Istio client. Each step says how
## long it took (builds included), and the last lines sum them up: where
## a run, cold or warm, spends its time. The external builds (make tools)
## start at once, beside the first steps, their lines marked [tools]: on a
## fresh machine their downloads and links fill what the unit tests and
## the fuzzing's fixed time leave of the cores; test-integration waits for
## them (a few seconds when they are cached).
## test-integration runs test-istio's tests too, beside its own
## (TEST_ISTIO=1, hack/test-integration.sh).
TEST_STEPS := proto-check check test-unit fuzz-smoke test-image test-alerts test-integration
test:
	@t0=$$(date +%s); times=""; hack/deps.sh; trc=$$(mktemp); \
	setsid sh -c '{ $(MAKE) --no-print-directory tools 2>&1; echo $$? > '"$$trc"'; } | sed -u "s/^/[tools] /"' & tools=$$!; \
	trap '[ -n "$$tools" ] && kill -- -$$tools 2>/dev/null; rm -f "$$trc"' EXIT; \
	for step in $(TEST_STEPS); do \
	  s=$$(date +%s); rc=0; \
	  if [ $$step = test-integration ]; then \
	    wait $$tools; tools=; rc=$$(cat "$$trc"); rc=$${rc:-1}; w=$$(( $$(date +%s) - s )); times="$$times tools-wait=$${w}s"; \
	    echo "== make test: waited $${w}s for the external builds"; \
	    if [ $$rc -ne 0 ]; then echo "== make test: the external builds failed (exit $$rc); steps:$$times"; exit $$rc; fi; \
	    s=$$(date +%s); \
	  fi; \
	  $(MAKE) --no-print-directory $$step TEST_ISTIO=1 || rc=$$?; \
	  times="$$times $$step=$$(( $$(date +%s) - s ))s"; echo "== make test: $$step took $$(( $$(date +%s) - s ))s"; \
	  if [ $$rc -ne 0 ]; then echo "== make test: $$step failed (exit $$rc); steps:$$times"; exit $$rc; fi; \
	done; \
	echo "== make test: passed in $$(( $$(date +%s) - t0 ))s; steps:$$times"

test-unit: test-hsm
	$(GO) test $(GOTEST_FLAGS) ./...

## test-hsm: the HSM build's packages with the build tag pkcs11, against
## the real SoftHSM2 (Debian's softhsm2; its objects read back with
## opensc's pkcs11-tool), which hack/deps.sh installs, and cmd/meshca's
## PKCS#11 flags in that build. The default build's pkcs11 stub is tested
## by test-unit's go test ./... .
HSM_PKGS := ./keymgr/upstream/pkcs11/... ./internal/softhsm/...
test-hsm:
	hack/deps.sh
	CGO_ENABLED=1 $(GO) test $(GOTEST_FLAGS) -tags $(HSM_TAGS) $(HSM_PKGS)
	CGO_ENABLED=1 $(GO) test $(GOTEST_FLAGS) -tags $(HSM_TAGS) -run PKCS11 ./cmd/meshca

## fuzz-smoke: mutate each fuzz target for FUZZTIME, one after the other
## (test-unit already runs their seeds: f.Add and testdata/fuzz). A crash
## fails the run and is written to the package's testdata/fuzz/<target>/.
## The campaign before a release: make fuzz-smoke FUZZTIME=10m.
## FUZZMINIMIZETIME bounds how long a worker shrinks a new input before it
## reports it: Go's default, 60s, spent on a state document or kubeconfig
## of a few KiB, would eat the whole run.
## Left out: FuzzTokenExpiry and internal/pemutil's FuzzParse, whose
## functions FuzzReadClaims, FuzzParseCertificates and FuzzParsePrivateKey
## run on every input they make.
.PHONY: fuzz-smoke
FUZZTIME ?= 3s
FUZZMINIMIZETIME ?= 1s
# FUZZFLAGS adds go test flags, e.g. -parallel=1 beside other work.
FUZZFLAGS ?=
# FUZZ_TARGET_TIMEOUT bounds one target's go test, build included: once a
# go command hung in vet, with no child left, until CI's own limit. A
# timeout is tried once more, then fails the run.
FUZZ_TARGET_TIMEOUT ?= $(if $(filter 3s,$(FUZZTIME)),10m,30m)
# FUZZ_TARGETS is every Fuzz function of the product module's tests, found
# rather than listed, so a new target cannot be left out of CI's run.
FUZZ_TARGETS := $(shell grep -rHo --include='*_test.go' --exclude-dir=integration \
	--exclude-dir=hack --exclude-dir=.git '^func Fuzz[A-Za-z0-9_]*' . | \
	sed -E 's,^(.*)/[^/]*:func (Fuzz.*)$$,\1:\2,' | sort)
fuzz-smoke:
	@set -e; out=$$(mktemp); trap 'rm -f $$out' EXIT; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; corpus=$$pkg/testdata/fuzz/$$name; \
	  before=$$(ls $$corpus 2>/dev/null | wc -l); \
	  echo "fuzz-smoke: $$pkg $$name for $(FUZZTIME)"; \
	  for try in 1 2; do \
	    rc=0; timeout -k 10s $(FUZZ_TARGET_TIMEOUT) $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) $(FUZZFLAGS) $$pkg > $$out 2>&1 || rc=$$?; \
	    [ $$rc = 124 ] || [ $$rc = 137 ] || break; \
	    cat $$out; echo "fuzz-smoke: $$name: go test did not end within $(FUZZ_TARGET_TIMEOUT) (a hung build step, not a finding); try $$try of 2"; \
	  done; \
	  if [ $$rc = 0 ]; then \
	    cat $$out; continue; \
	  fi; \
	  cat $$out; after=$$(ls $$corpus 2>/dev/null | wc -l); \
	  if [ "$$after" = "$$before" ] && grep -q '^    context deadline exceeded$$' $$out; then \
	    echo "fuzz-smoke: $$name: Go 1.26's fuzz coordinator reported its own -fuzztime deadline (go.dev/issue/75804, fixed in Go 1.27); no failing input was written: not a finding"; \
	    continue; \
	  fi; \
	  exit 1; \
	done

## test-alerts: the chart's PrometheusRule rendered by the real helm, its
## rule groups through promtool check rules and hack/promtool's tests (each
## alert fires on meshca's series, none on an istiod's of the same names).
.PHONY: test-alerts
test-alerts:
	hack/promtool/test.sh

# Builds meshca once, packs it twice (same bytes) and reads the image back;
# the same for the HSM variant, whose binary runs on the image's own libc.
# A packer, not concurrent code: no -race, which slows its gzip tenfold.
test-image:
	hack/deps.sh
	cd hack/image && $(GO) test -count=1 -timeout 20m ./...

# Build (cached) the real etcd and kube-apiserver (k8s), and cfssl, Vault,
# helm and Istio (tools), before go test starts, so that the first, long builds
# show their progress and are not cut by a test timeout. The builds run at
# once: their module downloads overlap the others' compiling.
k8s:
	hack/deps.sh
	integration/scripts/k8s.sh build

# istio: the real istiod (pilot-discovery) and istio-agent (pilot-agent)
# from Istio's Go module at the version integration/istioclient requires.
istio:
	hack/deps.sh
	integration/scripts/istio.sh build

tools:
	hack/deps.sh
	@set -e; integration/scripts/k8s.sh build & k=$$!; integration/scripts/vault.sh build & v=$$!; \
	integration/scripts/cfssl.sh build & c=$$!; integration/scripts/helm.sh build & h=$$!; \
	integration/scripts/istio.sh build & i=$$!; \
	wait $$k; wait $$v; wait $$c; wait $$h; wait $$i

# deploy/manifests/meshca.yaml is the Helm chart's defaults rendered by the
# real helm; integration/chart's TestManifestsUpToDate fails while it is stale.
manifests:
	MESHCA_UPDATE_CHART_KEYS=1 $(GO) test ./cmd/meshca -run TestChartConfigKeys -count=1
	integration/scripts/helm.sh manifests > deploy/manifests/meshca.yaml.tmp
	mv deploy/manifests/meshca.yaml.tmp deploy/manifests/meshca.yaml

# go test keeps a passing package's logs to itself: the figures the tests
# exist to show (handshakes checked and failed during rotation, attacks
# refused, kills survived, takeover times) go through harness.Report to
# $(MESHCA_TEST_REPORT) and are printed here, pass or fail.
# integration/e2e runs as MESHCA_E2E_SHARDS processes beside the other
# packages (hack/test-integration.sh says why and how); TEST_ISTIO=1 adds
# test-istio's tests, as make test does.
TEST_ISTIO ?= 0
test-integration: tools
	@report=$$(mktemp) && trap 'rm -f $$report' EXIT; rc=0; \
	MESHCA_TEST_REPORT=$$report MESHCA_TEST_ISTIO=$(TEST_ISTIO) GO="$(GO)" GOTEST_FLAGS="$(GOTEST_FLAGS)" \
	  hack/test-integration.sh || rc=$$?; \
	echo "== integration test figures (harness.Report) =="; sort $$report; exit $$rc

## soak: TestSoak (integration/e2e/soak_test.go) for SOAK_DURATION (5
## minutes; make test runs 50 s of it): two replicas on one state Secret
## under every attack of one hostile process without a token (half-open
## streams, long health Watches, silent TCP, half TLS handshakes, idle
## admin keep-alives), from one address then from 16, while a
## ztunnel-shaped load renews certificates from others
## (MESHCA_SOAK_ATTACKER_NICE lowers the attacker's CPU weight,
## MESHCA_SOAK_PPROF_DIR collects profiles). It asserts 0
## failed requests, p99 within 3x of the same run's baseline and RSS
## under 200 MiB, and prints the figures (docs/limits.md, Soak). A
## measurement, not a race hunt: no -race.
.PHONY: soak
SOAK_DURATION ?= 5m
soak: k8s
	@report=$$(mktemp) && trap 'rm -f $$report' EXIT; rc=0; \
	(cd integration && MESHCA_SOAK_DURATION=$(SOAK_DURATION) MESHCA_SOAK_STRICT=1 MESHCA_TEST_REPORT=$$report \
	  $(GO) test -count=1 -timeout 30m -run '^TestSoak$$' ./e2e) || rc=$$?; \
	echo "== soak figures (harness.Report) =="; cat $$report; exit $$rc

test-istio: k8s istio
	# Wire compatibility and the real istiod and istio-agent through root
	# rotations, not concurrency: no -race, which halves its cold build.
	@report=$$(mktemp) && trap 'rm -f $$report' EXIT; rc=0; \
	(cd integration/istioclient && MESHCA_TEST_REPORT=$$report $(GO) test -count=1 -timeout 20m ./...) || rc=$$?; \
	echo "== Istio test figures (harness.Report) =="; sort $$report; exit $$rc

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
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./csr ./signer/... ./ca ./ca/kube
	cd integration && $(GO) test -run '^$$' -bench . -benchtime 1x ./e2e
	cd integration && $(GO) test -run '^$$' -bench . -benchtime 2x ./signers

## bench-load: meshca serve under ztunnel's load against the real apiserver
## (integration/cmd/loadgen): requests/s, p50 and p99 at 1 to 256 streams
## over 1 and 4 connections, each as a fraction of this machine's raw limit
## for one issuance measured in the same run, and a node-restart burst.
## BENCH_LOAD_FLAGS adds flags, e.g. -profile _out/profile for pprof.
.PHONY: bench-load
BENCH_LOAD_FLAGS ?=
bench-load: k8s
	cd integration && $(GO) run ./cmd/loadgen $(BENCH_LOAD_FLAGS)

demo: k8s
	cd integration && $(GO) run ./cmd/demo $(DEMO_FLAGS)

## check: gofmt, the budgets (hack/budgets: file size, direct requires,
## grpc/status, package layering), go vet, go mod tidy (part of test); lint
## adds staticcheck.
check:
	@out=$$(gofmt -l . ) && [ -z "$$out" ] || { echo "gofmt needed:" $$out >&2; exit 1; }
	hack/commitlint.sh
	$(GO) run ./hack/budgets
	$(GO) vet ./...
	hack/deps.sh # a C compiler: the HSM build's files are vetted with cgo
	CGO_ENABLED=1 $(GO) vet -tags $(HSM_TAGS) $(HSM_PKGS)
	cd integration && $(GO) vet ./...
	$(GO) mod tidy -diff && cd integration && $(GO) mod tidy -diff && cd istioclient && $(GO) mod tidy -diff
	cd hack/image && $(GO) vet ./... && $(GO) mod tidy -diff

lint: check
	$(GO) run $(STATICCHECK) ./...
	cd integration && $(GO) run $(STATICCHECK) ./...
	cd hack/image && $(GO) run $(STATICCHECK) ./...

clean:
	rm -rf bin _out
