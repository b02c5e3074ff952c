#!/usr/bin/env bash
# istio.sh — build (cached) the real istiod (pilot-discovery) and istio-agent (pilot-agent) from Istio's Go
# module, at the istio.io/istio version integration/istioclient/go.mod requires, for the integration tests.
# No docker, no internet: only the Go module proxy (via `go`) is used.
#
#   istio.sh build                          # build both into $ISTIO_LOCAL_CACHE/bin (no-op when present); prints their paths
#   istio.sh path pilot-discovery|pilot-agent  # prints that binary's path; exits 1 when it has not been built
#
# Env knobs:
#   MESHCA_CACHE       meshca's cache root                     default: $HOME/.cache/meshca
#   ISTIO_LOCAL_CACHE  wrapper module and binaries              default: $MESHCA_CACHE/istio
#   ISTIO_OWN_DEPS=1   build with the dependency versions Istio's go.mod pins, instead of the (newer) ones
#                      integration/istioclient/go.mod selects
#
# Unlike k8s.sh, the build uses the caller's GOMODCACHE, GOCACHE and CGO_ENABLED, and no -trimpath: `go test`
# in integration/istioclient compiles a large part of the same packages, and the Go build cache reuses a
# compiled package only when its flags, cgo setting and dependency versions are the same. That is also why the
# wrapper module selects istioclient's dependency versions by default: Istio's pins are older (client-go,
# grpc, go-control-plane), and every Istio package above them would otherwise be compiled twice.
#
# Cost, measured on 2 cores shared with other builds: ~16 CPU-minutes, 14.5 min wall with the module cache
# warm (37 min when downloading ~850 MB of modules as well, under heavier load), 2.4 GB peak memory (the
# pilot-discovery link), 2.3 GB of build cache; 17 s when the build cache is warm. Binaries: 133 MB and 32 MB.
set -euo pipefail

GO=${GO:-go}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CLIENT_MOD=$HERE/../istioclient/go.mod
CACHE=${ISTIO_LOCAL_CACHE:-${MESHCA_CACHE:-$HOME/.cache/meshca}/istio}
BINDIR=$CACHE/bin
CMDS=(pilot-discovery pilot-agent)

log() { echo "[istio] $*" >&2; }
# shellcheck source=progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/progress.sh"

# The istio.io/istio version integration/istioclient requires (a single-line require or one in a block).
VERSION=$(awk '$1 == "require" && $2 == "istio.io/istio" {print $3; exit} $1 == "istio.io/istio" && $2 ~ /^v/ {print $2; exit}' "$CLIENT_MOD")
[[ -n $VERSION ]] || { log "no istio.io/istio requirement in $CLIENT_MOD"; exit 1; }

bin_of() { echo "$BINDIR/$1-$VERSION"; }

# The module's directives of one kind ("require" or "replace"), one per line without the keyword, from both
# the single-line and the block form; comments are dropped.
directives() {
  awk -v kw="$1" '
    { sub(/\/\/.*/, "") }
    $1 == kw && $2 == "(" { inblock = 1; next }
    inblock && $1 == ")" { inblock = 0; next }
    inblock && NF { print; next }
    $1 == kw && NF > 1 { $1 = ""; sub(/^ +/, ""); print }
  ' "$2"
}

missing() {
  local c
  for c in "${CMDS[@]}"; do [[ -x $(bin_of "$c") ]] || return 0; done
  return 1
}

build() {
  local c
  if missing; then
    mkdir -p "$CACHE"; exec 9>"$CACHE/.build.lock"; flock 9   # one build at a time per cache
  fi
  if missing; then
    export GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false" GOWORK=off
    local w=$CACHE/src/istio-$VERSION
    mkdir -p "$w" "$BINDIR"
    [[ -f $w/go.mod ]] || printf 'module local/placeholder\n\ngo 1.26.0\n' > "$w/go.mod"
    local t0 info istiomod idir goline
    t0=$(date +%s)
    log "fetching istio.io/istio@$VERSION (module cache $("$GO" env GOMODCACHE))"
    info=$(cd "$w" && "$GO" mod download -json "istio.io/istio@$VERSION")
    istiomod=$(awk -F'"' '$2 == "GoMod" {print $4}' <<<"$info")
    idir=$(awk -F'"' '$2 == "Dir" {print $4}' <<<"$info")
    goline=$(awk '$1 == "go" {print $2; exit}' "$istiomod")
    {
      printf 'module local/istiobuild\n\ngo %s\n\nrequire istio.io/istio %s\n' "$goline" "$VERSION"
      if [[ ${ISTIO_OWN_DEPS:-0} != 1 ]]; then
        # istioclient's selected versions (minus meshca's own modules); tidy keeps only the needed ones
        printf '\nrequire (\n'
        directives require "$CLIENT_MOD" | awk '$1 != "istio.io/istio" && $1 !~ /^github\.com\/meshca\// {printf "\t%s %s\n", $1, $2}'
        printf ')\n'
      fi
      # Istio's own replace directives, except local-path ones (they name files in Istio's tree)
      local reps
      reps=$(directives replace "$istiomod" | awk '$NF !~ /^\.\.?\// && $3 !~ /^\.\.?\//')
      if [[ -n $reps ]]; then printf '\nreplace (\n'; printf '%s\n' "$reps" | sed 's/^/\t/'; printf ')\n'; fi
    } > "$w/go.mod"
    printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "istio.io/istio/pilot/cmd/pilot-agent"\n\t_ "istio.io/istio/pilot/cmd/pilot-discovery"\n)\n' > "$w/tools.go"
    rm -f "$w/go.sum"
    log "resolving dependencies in $w"
    (cd "$w" && "$GO" mod tidy)
    local rev=${VERSION##*-} vpkg=istio.io/istio/pkg/version ld
    # Istio's release stamping; a "<major>.<minor>-dev" version parses as that minor's latest patch in istiod.
    ld="-s -w -X $vpkg.buildVersion=$(tr -d '[:space:]' < "$idir/VERSION")-dev -X $vpkg.buildGitRevision=$rev -X $vpkg.buildStatus=Clean -X $vpkg.buildTag=$VERSION"
    for c in "${CMDS[@]}"; do
      local b; b=$(bin_of "$c")
      [[ -x $b ]] && continue
      local t1; t1=$(date +%s)
      log "building $c $VERSION with GOCACHE $("$GO" env GOCACHE) (cold: ~15 min on 2 cores, 2.4 GB peak memory)"
      (cd "$w" && progress "$c" "$GO" build -v -ldflags "$ld" -o "$b.tmp" "istio.io/istio/pilot/cmd/$c")
      mv "$b.tmp" "$b"
      log "built $b in $(( $(date +%s) - t1 ))s"
    done
    log "done in $(( $(date +%s) - t0 ))s"
  fi
  for c in "${CMDS[@]}"; do bin_of "$c"; done
}

case "${1:-}" in
  build) build ;;
  path)
    case "${2:-}" in pilot-discovery|pilot-agent) ;; *) echo "usage: $0 path pilot-discovery|pilot-agent" >&2; exit 2 ;; esac
    b=$(bin_of "$2")
    [[ -x $b ]] || { log "$2 $VERSION is not built: run $0 build"; exit 1; }
    echo "$b" ;;
  *) echo "usage: $0 build | path pilot-discovery|pilot-agent" >&2; exit 2 ;;
esac
