# progress.sh — sourced by the build scripts, so that a long, cold build
# says it is alive: `go build -v` names each package as it compiles it,
# and while the build runs a line every $MESHCA_PROGRESS_INTERVAL seconds
# (default 30) gives the time spent and the packages compiled so far.
# The package names themselves are kept out of the terminal; a failed
# build prints the end of its output.
#
#   progress LABEL go build -v ARGS...

progress() {
  local label=$1; shift
  local out every=${MESHCA_PROGRESS_INTERVAL:-30} t0=$SECONDS rc=0 pid waited=0
  out=$(mktemp)
  "$@" >"$out" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    waited=$((waited + 1))
    if (( waited % every == 0 )) && kill -0 "$pid" 2>/dev/null; then
      echo "[$label] compiling: $(progress_elapsed $((SECONDS - t0))), $(progress_count "$out") packages so far$(progress_downloads "$out")" >&2
    fi
  done
  wait "$pid" || rc=$?
  if (( rc != 0 )); then
    echo "[$label] build failed (exit $rc) after $(progress_elapsed $((SECONDS - t0))); its last lines:" >&2
    tail -n 60 "$out" >&2
  else
    echo "[$label] compiled $(progress_count "$out") packages in $(progress_elapsed $((SECONDS - t0)))" >&2
  fi
  rm -f "$out"
  return "$rc"
}

# progress_count: the lines of go build -v that name a package.
progress_count() { grep -cE '^[A-Za-z0-9._~/-]+$' "$1" || true; }

# progress_downloads: ", N modules downloaded" when the build fetched any.
progress_downloads() {
  local n; n=$(grep -c '^go: downloading ' "$1" || true)
  (( n > 0 )) && echo ", $n modules downloaded"
  return 0
}

progress_elapsed() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
