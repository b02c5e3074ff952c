#!/usr/bin/env bash
# vault.sh — build (cached) a real Vault server from the Go module proxy.
#
#   vault.sh build    # build into $VAULT_CACHE/bin/vault-v$VAULT_VERSION (no-op when present); prints its path
#
# Env knobs:
#   MESHCA_CACHE   meshca's cache root                         default: $HOME/.cache/meshca
#   VAULT_CACHE    wrapper module, GOMODCACHE, GOCACHE, binary  default: $MESHCA_CACHE/vault
#
# Why a wrapper module: vault v1.21.4's go.mod replaces its api and sdk with
# in-tree copies that match no published sdk tag, so `go install` is refused.
# The wrapper pins the published sdk v0.21.0 as a local copy with two
# compatibility edits and repeats vault's two non-local replaces. Cold: about
# 37 CPU-minutes and 4 GB of module cache; the binary is ~500 MB.
set -euo pipefail
VAULT_VERSION=1.21.4
CACHE=${VAULT_CACHE:-${MESHCA_CACHE:-$HOME/.cache/meshca}/vault}
BIN=$CACHE/bin/vault-v$VAULT_VERSION
log() { echo "[vault] $*" >&2; }
# shellcheck source=progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/progress.sh"

build() {
  [[ -x $BIN ]] && { echo "$BIN"; return 0; }
  # One build at a time per cache: a second caller waits, then finds the binary.
  mkdir -p "$CACHE"; exec 9>"$CACHE/.build.lock"; flock 9
  [[ -x $BIN ]] && { echo "$BIN"; return 0; }
  export GOMODCACHE=$CACHE/gomodcache GOCACHE=$CACHE/gocache GOFLAGS=-buildvcs=false GOWORK=off CGO_ENABLED=0
  local w=$CACHE/src/vault-v$VAULT_VERSION
  mkdir -p "$w" "$CACHE/bin"
  log "building Vault v$VAULT_VERSION in $w (cold: ~20 min on 2 idle cores)"
  cd "$w"
  cat > go.mod <<'MOD'
module local/vaultbuild

go 1.25.3

require (
	github.com/hashicorp/vault v1.21.4
	github.com/hashicorp/vault/api v1.22.0
	github.com/hashicorp/vault/api/auth/approle v0.1.0
	github.com/hashicorp/vault/api/auth/kubernetes v0.10.0
	github.com/hashicorp/vault/api/auth/userpass v0.1.0
	github.com/hashicorp/vault/sdk v0.21.0
)

replace github.com/99designs/keyring => github.com/Jeffail/keyring v1.2.3

replace github.com/ma314smith/signedxml v1.1.1 => github.com/moov-io/signedxml v1.1.1

replace github.com/hashicorp/vault/sdk => ./sdk
MOD
  moddir() { go mod download -json "$1" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p'; }
  rm -rf sdk && cp -r "$(moddir github.com/hashicorp/vault/sdk@v0.21.0)" sdk && chmod -R u+w sdk
  # vault v1.21.4 calls framework.Backend.ActivationFunc with two arguments.
  sed -i 's/ActivationFunc func(context.Context, \*logical.Request, string) error/ActivationFunc func(context.Context, *logical.Request) error/' sdk/framework/backend.go
  grep -q 'ActivationFunc func(context.Context, \*logical.Request) error' sdk/framework/backend.go
  # Its transit engine expects keysutil's RestorePolicy of sdk v0.25.1.
  cp "$(moddir github.com/hashicorp/vault/sdk@v0.25.1)/helper/keysutil/lock_manager.go" sdk/helper/keysutil/lock_manager.go
  log "resolving modules"
  go get github.com/hashicorp/vault@v$VAULT_VERSION
  log "compiling (the long part)"
  progress vault go build -v -trimpath -ldflags "-s -w" -o "$BIN.tmp" github.com/hashicorp/vault
  mv "$BIN.tmp" "$BIN"
  "$BIN" version >&2
  echo "$BIN"
}

case "${1:-}" in
  build) build ;;
  *) echo "usage: $0 build" >&2; exit 2 ;;
esac
