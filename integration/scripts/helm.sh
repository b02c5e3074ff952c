#!/usr/bin/env bash
# helm.sh — build (cached) the real helm CLI from the Go module proxy; the
# chart tests run its `lint --strict` and `template`.
#
#   helm.sh build    # into $HELM_CACHE/bin/helm-v$HELM_VERSION (no-op when present); prints its path
#   helm.sh path     # prints that path; exits 1 when it has not been built
#   helm.sh manifests  # prints deploy/manifests/meshca.yaml: the chart's defaults rendered (builds helm first)
#
#   MESHCA_CACHE  default $HOME/.cache/meshca;  HELM_CACHE default $MESHCA_CACHE/helm
#
# helm v4's go.mod has no replace directives, so `go install` works as it
# is; the version is stamped the way helm's own Makefile does, or
# `helm version` says v4.x-dev. Cold: a few minutes on 2 cores.
set -euo pipefail
# shellcheck source=progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/progress.sh"
HELM_VERSION=4.3.2
CACHE=${HELM_CACHE:-${MESHCA_CACHE:-$HOME/.cache/meshca}/helm}
BIN=$CACHE/bin/helm-v$HELM_VERSION
case "${1:-}" in
  build)
    [[ -x $BIN ]] && { echo "$BIN"; exit 0; }
    mkdir -p "$CACHE"; exec 9>"$CACHE/.build.lock"; flock 9   # one build at a time per cache
    if [[ ! -x $BIN ]]; then
      echo "[helm] building helm v$HELM_VERSION (cold: ~5 min on 2 cores)" >&2
      mkdir -p "$CACHE/bin" "$CACHE/gobin"
      progress helm env GOMODCACHE=$CACHE/gomodcache GOCACHE=$CACHE/gocache GOBIN=$CACHE/gobin GOFLAGS=-buildvcs=false GOWORK=off CGO_ENABLED=0 \
        go install -v -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=v$HELM_VERSION" \
        "helm.sh/helm/v4/cmd/helm@v$HELM_VERSION"
      mv "$CACHE/gobin/helm" "$BIN"
      "$BIN" version >&2
    fi
    echo "$BIN" ;;
  path)
    [[ -x $BIN ]] || { echo "[helm] v$HELM_VERSION is not built: run $0 build" >&2; exit 1; }
    echo "$BIN" ;;
  manifests)
    bin=$("$0" build)
    chart=$(cd "$(dirname "$0")/../../deploy/charts/meshca" && pwd)
    cat <<'HEADER'
# meshca as istio-system's CA, without Helm: the Helm chart's defaults as
# `make manifests` renders them (helm template meshca deploy/charts/meshca
# --namespace istio-system). Do not edit: change the chart, then run
# `make manifests`; the chart tests fail while this file is stale.
#
# Two replicas share the CA state in the Secret meshca-ca-state, created
# empty here and filled by meshca on its first start (it holds the CA key:
# keep it). The trust bundle is published as istio-ca-root-cert in every
# namespace; the root rotation CronJobs ship suspended. docs/install.md
# explains every object and the values that change them.
HEADER
    HELM_CACHE_HOME=$CACHE/home/cache HELM_CONFIG_HOME=$CACHE/home/config HELM_DATA_HOME=$CACHE/home/data \
      "$bin" template meshca "$chart" --namespace istio-system ;;
  *) echo "usage: $0 build|path|manifests" >&2; exit 2 ;;
esac
