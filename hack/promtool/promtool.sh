#!/usr/bin/env bash
# promtool.sh — prints the path of promtool, taken (once, cached) from
# Debian's prometheus package without installing it: `apt-get download`
# and `dpkg-deb -x`, so no Prometheus server is installed or started.
# Cached under $MESHCA_CACHE/promtool, keyed by the package's version.
set -euo pipefail
cache=${MESHCA_CACHE:-$HOME/.cache/meshca}/promtool
candidate() { apt-cache policy prometheus 2>/dev/null | awk '$1 == "Candidate:" && $2 != "(none)" {print $2}'; }
version=$(candidate)
if [[ -z $version ]]; then
  sudo=""
  [[ $(id -u) == 0 ]] || sudo=sudo
  echo "promtool: updating apt's package lists" >&2
  $sudo apt-get update -qq >&2
  version=$(candidate)
fi
[[ -n $version ]] || { echo "promtool: apt knows no prometheus package" >&2; exit 1; }
bin=$cache/bin/promtool-${version//[^A-Za-z0-9.+-]/_}
if [[ ! -x $bin ]]; then
  mkdir -p "$cache/bin"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "promtool: fetching prometheus $version from Debian" >&2
  (cd "$tmp" && apt-get download -qq "prometheus=$version" >&2)
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
  cp "$tmp/x/usr/bin/promtool" "$bin.tmp"
  mv "$bin.tmp" "$bin"
fi
echo "$bin"
