#!/usr/bin/env bash
# hack/test-integration.sh: the integration module's tests, as
# `make test-integration` runs them.
#
# integration/e2e is most of the time: its tests run one after the other
# against one apiserver for about 19 minutes, and spend much of it waiting
# on clocks (rotations, renewals, leases), using under one core. So it
# runs as MESHCA_E2E_SHARDS processes (default 2), each with its own etcd,
# kube-apiserver and meshca builds, each taking every n-th test in the
# order `-test.list` gives them (source order), so a new test is in a
# shard without being named anywhere. Beside them the module's other
# packages run one at a time (go test -p 1), and then, with
# MESHCA_TEST_ISTIO=1 (make test's TEST_ISTIO=1), integration/istioclient's
# (make test-istio's step, folded in here: it ends before the shards do).
# Each process's output is printed when it ends, as go test prints a
# package's: a passing one's as a line, a failing one's whole.
#
#   GO                  go command (default go)
#   GOTEST_FLAGS        go test flags (default -race -count=1); -v and
#                       -count=N also reach the e2e binaries
#   MESHCA_E2E_SHARDS   e2e processes (default 2; 1 runs it as one)
#   MESHCA_TEST_TIMEOUT each process's limit (default 20m)
#   MESHCA_TEST_ISTIO   1: also integration/istioclient, as make
#                       test-istio runs it (no -race)
set -euo pipefail
cd "$(dirname "$0")/../integration"
GO=${GO:-go}
shards=${MESHCA_E2E_SHARDS:-2}
timeout=${MESHCA_TEST_TIMEOUT:-20m}
read -r -a flags <<<"${GOTEST_FLAGS:--race -count=1}"
[[ "$shards" =~ ^[1-9][0-9]?$ ]] || { echo "MESHCA_E2E_SHARDS=$shards: want 1 to 99" >&2; exit 2; }

pkg=github.com/meshca/meshca/integration/e2e
tmp=$(mktemp -d)
trap 'jobs -p | xargs -r kill 2>/dev/null; rm -rf "$tmp"' EXIT

# The e2e test binary is built once; go test's own flags that the binary
# takes are turned into its -test.* ones.
build=() run=() verbose=0
for f in "${flags[@]}"; do
	case $f in
	-v) run+=(-test.v) verbose=1 ;;
	-count=*) run+=("-test.count=${f#-count=}") ;;
	*) build+=("$f") ;;
	esac
done
"$GO" test -c "${build[@]}" -o "$tmp/e2e.test" ./e2e
mapfile -t tests < <(cd e2e && "$tmp/e2e.test" -test.list '^Test' | grep '^Test')
[ "${#tests[@]}" -gt 0 ] || { echo "hack/test-integration.sh: $pkg lists no tests" >&2; exit 1; }

# start WHAT CMD...: runs CMD in the background, its output to a file of
# its own; WHAT names an e2e shard for its ok or FAIL line, and is empty
# for the other packages, whose go test prints its own.
declare -A what=() started=() out=()
start() {
	local f=$tmp/out.${#out[@]}
	"${@:2}" >"$f" 2>&1 &
	what[$!]=$1 started[$!]=$(date +%s) out[$!]=$f
}

mapfile -t others < <("$GO" list ./... | grep -vx "$pkg")
others() {
	local rc=0
	"$GO" test "${flags[@]}" -p 1 -timeout "$timeout" "${others[@]}" || rc=$?
	if [ "${MESHCA_TEST_ISTIO:-0}" = 1 ]; then
		(cd istioclient && "$GO" test -count=1 -timeout "$timeout" ./...) || rc=$?
	fi
	return "$rc"
}
start "" others
for ((i = 0; i < shards; i++)); do
	mine=()
	for ((j = i; j < ${#tests[@]}; j += shards)); do mine+=("${tests[j]}"); done
	[ "${#mine[@]}" -gt 0 ] || continue
	re=$(IFS='|'; echo "^(${mine[*]})\$")
	start "$pkg [shard $((i + 1)) of $shards: ${#mine[@]} tests]" \
		bash -c 'cd e2e && exec "$0" "$@"' "$tmp/e2e.test" -test.run "$re" -test.timeout "$timeout" "${run[@]}"
done

rc=0
while [ "${#out[@]}" -gt 0 ]; do
	prc=0
	wait -n -p pid "${!out[@]}" || prc=$?
	took=$(($(date +%s) - started[$pid]))
	if [ -z "${what[$pid]}" ] || [ "$prc" -ne 0 ] || [ "$verbose" = 1 ]; then
		cat "${out[$pid]}"
	fi
	if [ -n "${what[$pid]}" ]; then
		if [ "$prc" -eq 0 ]; then
			printf 'ok  \t%s\t%ds\n' "${what[$pid]}" "$took"
		else
			printf 'FAIL\t%s\t%ds\n' "${what[$pid]}" "$took"
		fi
	fi
	unset "out[$pid]"
	[ "$prc" -eq 0 ] || rc=$prc
done
exit "$rc"
