#!/usr/bin/env bash
# k8s.sh — build (cached) and run a REAL etcd + kube-apiserver on 127.0.0.1 only, for meshca's
# integration tests and `make demo`.
# No docker, no internet: only the Go module proxy (via `go`) is used, for building.
#
#   k8s.sh build            # build etcd + kube-apiserver into $K8S_LOCAL_CACHE/bin (no-op if present)
#   k8s.sh up [RUN_DIR]     # build if needed, start both, wait for /readyz; last stdout line = kubeconfig path
#   k8s.sh down RUN_DIR     # stop the processes started by `up` (by PID) and remove RUN_DIR
#   k8s.sh stop-apiserver RUN_DIR [TERM|KILL]  # stop only kube-apiserver (etcd and RUN_DIR stay); KILL: as a crash
#   k8s.sh start-apiserver RUN_DIR  # start it again: same etcd data, certs and port; wait for /readyz
#
# Env knobs:
#   MESHCA_CACHE     meshca's cache root                                        default: $HOME/.cache/meshca
#   K8S_LOCAL_CACHE  cache dir (wrapper modules, GOMODCACHE, GOCACHE, binaries)  default: $MESHCA_CACHE/k8s
#   K8S_LOCAL_K8S_VERSION   k8s.io/kubernetes version, without the v               default: 1.37.2
#   K8S_LOCAL_ETCD_VERSION  go.etcd.io/etcd/server/v3 version, without the v       default: 3.6.16
#   K8S_SHARED_GOCACHE=1  use the caller's GOMODCACHE/GOCACHE instead of private ones under the cache dir
#   CGO_ENABLED      default 0 (static binaries, like upstream release builds; no gcc needed)
#   SERVICE_CIDR     --service-cluster-ip-range (pure allocation pool, never contacted) default: 10.0.0.0/24
#   KAS_EXTRA_ARGS   extra kube-apiserver flags (word-split)
#   K8S_LOCAL_KCM=1  also build+run kube-controller-manager with only: serviceaccount (default SAs), namespace
#                    (namespace deletion), garbage-collector, root-ca-certificate-publisher controllers
set -euo pipefail

# NB: never name a variable ETCD_VERSION in etcd's environment: etcd maps every ETCD_* env var to a flag.
K8S_VERSION=${K8S_LOCAL_K8S_VERSION:-1.37.2}
ETCD_VERSION=${K8S_LOCAL_ETCD_VERSION:-3.6.16}
CACHE=${K8S_LOCAL_CACHE:-${MESHCA_CACHE:-$HOME/.cache/meshca}/k8s}
SERVICE_CIDR=${SERVICE_CIDR:-10.0.0.0/24}
SA_ISSUER=${SA_ISSUER:-https://kubernetes.default.svc.cluster.local}
GO=${GO:-go}
BIN=$CACHE/bin
ETCD_BIN=$BIN/etcd-v$ETCD_VERSION
KAS_BIN=$BIN/kube-apiserver-v$K8S_VERSION
KCM_BIN=$BIN/kube-controller-manager-v$K8S_VERSION

log() { echo "[k8s] $*" >&2; }
# shellcheck source=progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/progress.sh"

for t in curl openssl ss base64 "$GO"; do
  command -v "$t" >/dev/null || { log "missing $t (apt-get install -y curl openssl iproute2 coreutils; Go in PATH)"; exit 1; }
done

goenv() {
  if [[ "${K8S_SHARED_GOCACHE:-0}" != 1 ]]; then
    export GOMODCACHE=$CACHE/gomodcache GOCACHE=$CACHE/gocache
  fi
  export GOFLAGS=-buildvcs=false GOWORK=off CGO_ENABLED=${CGO_ENABLED:-0}
}

# path of the cached go.mod of MODULE@VERSION (fetches only .info/.mod, not the zip)
modfile_of() {
  local dir=$1 modver=$2
  [[ -f $dir/go.mod ]] || printf 'module local/placeholder\n\ngo 1.26.0\n' > "$dir/go.mod"
  (cd "$dir" && "$GO" list -m -f '{{.GoMod}}' "$modver")
}

build_etcd() {
  [[ -x $ETCD_BIN ]] && return 0
  goenv
  local w=$CACHE/src/etcd-v$ETCD_VERSION
  mkdir -p "$w" "$BIN"
  log "building etcd v$ETCD_VERSION in $w"
  # The server module requires its siblings at the same release; pin them explicitly anyway.
  local modfile
  modfile=$(modfile_of "$w" "go.etcd.io/etcd/server/v3@v$ETCD_VERSION")
  {
    printf 'module local/etcdbuild\n\ngo 1.26.0\n\nrequire (\n'
    printf '\tgo.etcd.io/etcd/server/v3 v%s\n' "$ETCD_VERSION"
    # siblings: api/v3, client/pkg/v3, client/v3, pkg/v3, raft (go.etcd.io/raft/v3 on 3.6+, etcd/raft/v3 on 3.5)
    grep -E '^\s+go\.etcd\.io/(etcd/(api|client/pkg|client|pkg|raft)/v3|raft/v3|bbolt) v' "$modfile" | awk '{printf "\t%s %s\n",$1,$2}'
    printf ')\n'
  } > "$w/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > "$w/tools.go"
  (cd "$w" && "$GO" mod tidy && progress etcd "$GO" build -v -trimpath -ldflags "-s -w" -o "$ETCD_BIN.tmp" go.etcd.io/etcd/server/v3)
  mv "$ETCD_BIN.tmp" "$ETCD_BIN"
}

build_kas() {
  [[ -x $KAS_BIN ]] && return 0
  goenv
  local w=$CACHE/src/kube-apiserver-v$K8S_VERSION minor=${K8S_VERSION#*.}
  mkdir -p "$w" "$BIN"
  log "building kube-apiserver v$K8S_VERSION in $w (cold: ~25-30 min on 2 cores)"
  local modfile
  modfile=$(modfile_of "$w" "k8s.io/kubernetes@v$K8S_VERSION")
  {
    printf 'module local/kubeapiserverbuild\n\ngo 1.26.0\n\ngodebug default=go1.26\n\n'
    printf 'require k8s.io/kubernetes v%s\n\nreplace (\n' "$K8S_VERSION"
    # every staging module k8s.io/kubernetes requires as v0.0.0 -> the published v0.<minor>.<patch> tag
    grep -E '^\s+k8s\.io/[a-z0-9-]+ v0\.0\.0$' "$modfile" | awk -v v="v0.$minor" '{printf "\t%s => %s %s\n",$1,$1,v}'
    printf ')\n'
  } > "$w/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' > "$w/tools.go"
  local vpkg=k8s.io/component-base/version
  local ld="-s -w -X $vpkg.gitVersion=v$K8S_VERSION -X $vpkg.gitMajor=${K8S_VERSION%%.*} -X $vpkg.gitMinor=${minor%%.*} -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
  (cd "$w" && "$GO" mod tidy && progress kube-apiserver "$GO" build -v -trimpath -ldflags "$ld" -o "$KAS_BIN.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
  mv "$KAS_BIN.tmp" "$KAS_BIN"
}

build_kcm() {  # optional; reuses the kube-apiserver wrapper + caches (~4.5 min when kube-apiserver was built)
  [[ -x $KCM_BIN ]] && return 0
  build_kas
  goenv
  local w=$CACHE/src/kube-apiserver-v$K8S_VERSION minor=${K8S_VERSION#*.} vpkg=k8s.io/component-base/version
  log "building kube-controller-manager v$K8S_VERSION"
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n\t_ "k8s.io/kubernetes/cmd/kube-controller-manager"\n)\n' > "$w/tools.go"
  local ld="-s -w -X $vpkg.gitVersion=v$K8S_VERSION -X $vpkg.gitMajor=${K8S_VERSION%%.*} -X $vpkg.gitMinor=${minor%%.*} -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
  (cd "$w" && "$GO" mod tidy && progress kube-controller-manager "$GO" build -v -trimpath -ldflags "$ld" -o "$KCM_BIN.tmp" k8s.io/kubernetes/cmd/kube-controller-manager)
  mv "$KCM_BIN.tmp" "$KCM_BIN"
}

free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$(( 20000 + RANDOM % 30000 ))
    if [[ -z "$(ss -Htan "( sport = :$p )" 2>/dev/null)" ]]; then echo "$p"; return 0; fi
  done
  log "no free port found"; return 1
}

gen_pki() {
  local d=$1
  mkdir -p "$d"; (
    cd "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=k8s-local-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n' > srv.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 3650 -extfile srv.ext 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=k8s-local-admin" 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n' > cli.ext
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt -days 3650 -extfile cli.ext 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    # static bearer token for an admin user as well (token,user,uid,"group1,group2")
    local tok; tok=$(openssl rand -hex 24)
    echo "$tok,k8s-local-token-admin,k8s-local-token-admin,system:masters" > tokens.csv
    echo "$tok" > admin.token
    chmod 600 ./*.key tokens.csv admin.token
  )
}

write_kubeconfig() {
  local run=$1 port=$2
  cat > "$run/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority-data: $(base64 -w0 < "$run/pki/ca.crt")
users:
- name: admin
  user:
    client-certificate-data: $(base64 -w0 < "$run/pki/admin.crt")
    client-key-data: $(base64 -w0 < "$run/pki/admin.key")
- name: admin-token
  user:
    token: $(cat "$run/pki/admin.token")
contexts:
- name: local
  context: {cluster: local, user: admin}
- name: local-token
  context: {cluster: local, user: admin-token}
current-context: local
EOF
  chmod 600 "$run/kubeconfig"
}

# start_kas RUN_DIR: start kube-apiserver with the ports, PKI and etcd of RUN_DIR (its kas.env, written by
# `up`) and wait for /readyz. `start-apiserver` calls it again after `stop-apiserver`: same data, certs and port.
start_kas() {
  local run=$1 etcd_port api_port kas_extra_args
  # shellcheck disable=SC1091
  source "$run/kas.env"
  # shellcheck disable=SC2086
  "$KAS_BIN" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$api_port" \
    --endpoint-reconciler-type=none \
    --tls-cert-file="$run/pki/apiserver.crt" --tls-private-key-file="$run/pki/apiserver.key" \
    --client-ca-file="$run/pki/ca.crt" --token-auth-file="$run/pki/tokens.csv" \
    --service-account-issuer="$SA_ISSUER" \
    --service-account-key-file="$run/pki/sa.pub" --service-account-signing-key-file="$run/pki/sa.key" \
    --api-audiences="$SA_ISSUER" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --profiling=false \
    --cert-dir="$run/pki/generated" \
    $kas_extra_args >>"$run/kube-apiserver.log" 2>&1 < /dev/null &
  echo $! > "$run/kube-apiserver.pid"
  for _ in $(seq 1 600); do
    if curl -fsS --cacert "$run/pki/ca.crt" --cert "$run/pki/admin.crt" --key "$run/pki/admin.key" \
        "https://127.0.0.1:$api_port/readyz" >/dev/null 2>&1; then return 0; fi
    if ! alive "$(cat "$run/kube-apiserver.pid")"; then break; fi
    sleep 0.1
  done
  log "kube-apiserver did not become ready; last log lines:"; tail -30 "$run/kube-apiserver.log" >&2
  return 1
}

# alive PID: the process runs. A zombie does not: our processes outlive this script, and where PID 1 does not
# reap orphans (some VM inits), an exited one stays a zombie that `kill -0` still finds.
alive() { kill -0 "$1" 2>/dev/null && ! grep -qs '^State:[[:space:]]*Z' "/proc/$1/status"; }

# stop_proc RUN_DIR NAME [SIGNAL]: stop the process of RUN_DIR/NAME.pid (SIGNAL, default TERM; KILL after 10 s)
# and wait for it to exit.
stop_proc() {
  local run=$1 f=$2 sig=${3:-TERM} pid
  [[ -f $run/$f.pid ]] || return 0
  pid=$(cat "$run/$f.pid")
  if alive "$pid"; then
    kill -"$sig" "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
    alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
  fi
  rm -f "$run/$f.pid"
}

cmd_up() {
  build_etcd; build_kas
  [[ "${K8S_LOCAL_KCM:-0}" == 1 ]] && build_kcm
  local run=${1:-$(mktemp -d -t k8s-local-run.XXXXXX)}
  mkdir -p "$run"; run=$(cd "$run" && pwd)
  local t0; t0=$(date +%s%N)
  gen_pki "$run/pki"
  local etcd_port peer_port api_port
  etcd_port=$(free_port); peer_port=$(free_port); api_port=$(free_port)
  while [[ $peer_port == "$etcd_port" ]]; do peer_port=$(free_port); done
  while [[ $api_port == "$etcd_port" || $api_port == "$peer_port" ]]; do api_port=$(free_port); done

  # env -i: etcd treats any ETCD_* environment variable as a flag. (env execs etcd, so $! is etcd's PID)
  env -i PATH=/usr/bin:/bin "$ETCD_BIN" --name k8s-local --data-dir "$run/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "k8s-local=http://127.0.0.1:$peer_port" --initial-cluster-state new \
    --unsafe-no-fsync --log-level warn >"$run/etcd.log" 2>&1 < /dev/null &
  echo $! > "$run/etcd.pid"

  # wait for etcd /health (client port also serves /health and /metrics)
  local eok=0
  for _ in $(seq 1 150); do
    if curl -fsS "http://127.0.0.1:$etcd_port/health" 2>/dev/null | grep -q '"health":"true"'; then eok=1; break; fi
    alive "$(cat "$run/etcd.pid")" || break
    sleep 0.1
  done
  if [[ $eok != 1 ]]; then
    log "etcd did not become healthy; last log lines:"; tail -20 "$run/etcd.log" >&2
    cmd_down "$run" keep; return 1
  fi
  local t_etcd; t_etcd=$(date +%s%N)

  printf 'etcd_port=%q\napi_port=%q\nkas_extra_args=%q\n' "$etcd_port" "$api_port" "${KAS_EXTRA_ARGS:-}" > "$run/kas.env"
  write_kubeconfig "$run" "$api_port"
  if ! start_kas "$run"; then
    cmd_down "$run" keep; return 1
  fi
  if [[ "${K8S_LOCAL_KCM:-0}" == 1 ]]; then
    # --secure-port=0: no serving port at all. Only controllers that make sense without kubelet/scheduler;
    # NOT pod-garbage-collector / node-lifecycle (they would delete or taint the fake Pods/Nodes tests create).
    "$KCM_BIN" --kubeconfig="$run/kubeconfig" --authentication-kubeconfig="$run/kubeconfig" --authorization-kubeconfig="$run/kubeconfig" \
      --controllers=serviceaccount-controller,namespace-controller,garbage-collector-controller,root-ca-certificate-publisher-controller \
      --leader-elect=false --bind-address=127.0.0.1 --secure-port=0 --root-ca-file="$run/pki/ca.crt" \
      --use-service-account-credentials=false >"$run/kube-controller-manager.log" 2>&1 < /dev/null &
    echo $! > "$run/kube-controller-manager.pid"
  fi
  cat > "$run/env" <<EOF
export KUBECONFIG=$run/kubeconfig
export K8S_LOCAL_RUN_DIR=$run
export K8S_LOCAL_API_URL=https://127.0.0.1:$api_port
export K8S_LOCAL_ETCD_URL=http://127.0.0.1:$etcd_port
export K8S_LOCAL_CA=$run/pki/ca.crt
export K8S_LOCAL_TOKEN=$(cat "$run/pki/admin.token")
EOF
  local t_end; t_end=$(date +%s%N)
  log "ready in $(( (t_end - t0) / 1000000 ))ms (kube-apiserver start->/readyz $(( (t_end - t_etcd) / 1000000 ))ms): api https://127.0.0.1:$api_port etcd http://127.0.0.1:$etcd_port run-dir $run"
  echo "$run/kubeconfig"
}

cmd_down() {
  local run=${1:?usage: down RUN_DIR} keep=${2:-} f
  for f in kube-controller-manager kube-apiserver etcd; do stop_proc "$run" "$f"; done
  [[ -n $keep ]] || rm -rf "$run"
}

buildlock() { mkdir -p "$CACHE"; exec 9>"$CACHE/.build.lock"; flock 9; }  # one build at a time per cache

case "${1:-}" in
  build) buildlock; build_etcd; build_kas; echo "$ETCD_BIN"; echo "$KAS_BIN"
         if [[ "${K8S_LOCAL_KCM:-0}" == 1 ]]; then build_kcm; echo "$KCM_BIN"; fi ;;
  up) shift; [[ -x $ETCD_BIN && -x $KAS_BIN ]] || (buildlock; build_etcd; build_kas); cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  stop-apiserver) stop_proc "${2:?usage: stop-apiserver RUN_DIR [TERM|KILL]}" kube-apiserver "${3:-TERM}" ;;
  start-apiserver) run=${2:?usage: start-apiserver RUN_DIR}
    if [[ -f $run/kube-apiserver.pid ]] && alive "$(cat "$run/kube-apiserver.pid")"; then log "kube-apiserver of $run is running"; exit 1; fi
    t0=$(date +%s%N); start_kas "$run"; log "kube-apiserver ready again in $(( ($(date +%s%N) - t0) / 1000000 ))ms" ;;
  *) echo "usage: $0 build | up [RUN_DIR] | down RUN_DIR | stop-apiserver RUN_DIR [TERM|KILL] | start-apiserver RUN_DIR" >&2; exit 2 ;;
esac
