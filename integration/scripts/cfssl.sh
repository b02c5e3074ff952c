#!/usr/bin/env bash
# cfssl.sh — build (cached) the real cfssl CLI, whose `cfssl serve` the
# integration tests run. Debian's golang-cfssl is from 2016 and drops URI
# SANs; v1.7 needs a newer Go. Pinned with the library in go.mod.
#
#   cfssl.sh build    # into $CFSSL_CACHE/bin/cfssl-v$CFSSL_VERSION (no-op when present); prints its path
#
#   MESHCA_CACHE  default $HOME/.cache/meshca;  CFSSL_CACHE default $MESHCA_CACHE/cfssl
set -euo pipefail
# shellcheck source=progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/progress.sh"
CFSSL_VERSION=1.6.5
CACHE=${CFSSL_CACHE:-${MESHCA_CACHE:-$HOME/.cache/meshca}/cfssl}
BIN=$CACHE/bin/cfssl-v$CFSSL_VERSION
case "${1:-}" in
  build)
    mkdir -p "$CACHE"; exec 9>"$CACHE/.build.lock"; flock 9   # one build at a time per cache
    if [[ ! -x $BIN ]]; then
      echo "[cfssl] building cfssl v$CFSSL_VERSION (cold: ~3 min)" >&2
      mkdir -p "$CACHE/bin" "$CACHE/gobin"
      progress cfssl env GOMODCACHE=$CACHE/gomodcache GOCACHE=$CACHE/gocache GOBIN=$CACHE/gobin GOFLAGS=-buildvcs=false GOWORK=off CGO_ENABLED=0 \
        go install -v "github.com/cloudflare/cfssl/cmd/cfssl@v$CFSSL_VERSION"
      mv "$CACHE/gobin/cfssl" "$BIN"
    fi
    echo "$BIN" ;;
  *) echo "usage: $0 build" >&2; exit 2 ;;
esac
