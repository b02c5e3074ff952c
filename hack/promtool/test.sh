#!/usr/bin/env bash
# test.sh — make test-alerts: meshca's alerts as the chart ships them, run
# through promtool.
#
# The real helm (integration/scripts/helm.sh) renders the PrometheusRule as
# release "ca" in istio-system, so the rules select the job ca-meshca, the
# Service's name; its spec (the groups) becomes a plain rule file, which
# `"$promtool" check rules` checks and the *_test.yaml files beside this script
# test with `promtool test rules`. Every alert must be named by a test.
# promtool comes from Debian's prometheus package (promtool.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$root/hack/promtool
helm=$("$root/integration/scripts/helm.sh" build)
promtool=$("$here/promtool.sh")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

HELM_CACHE_HOME=$tmp/home/cache HELM_CONFIG_HOME=$tmp/home/config HELM_DATA_HOME=$tmp/home/data \
  "$helm" template ca "$root/deploy/charts/meshca" --namespace istio-system \
  --set prometheusRule.enabled=true --show-only templates/prometheusrule.yaml > "$tmp/rule.yaml"
# The spec's lines, two spaces less indented: the groups list at the top.
awk '/^spec:$/ { on = 1; next } on { sub(/^  /, ""); print }' "$tmp/rule.yaml" > "$tmp/alerts.rules.yaml"
grep -q '^groups:$' "$tmp/alerts.rules.yaml" || { echo "test-alerts: no spec.groups in the rendered PrometheusRule" >&2; exit 1; }

"$promtool" check rules "$tmp/alerts.rules.yaml"

missing=()
for a in $(sed -n 's/^ *- alert: *//p' "$tmp/alerts.rules.yaml"); do
  grep -qE "alertname: +$a([,} ]|\$)" "$here"/*_test.yaml || missing+=("$a")
done
[[ ${#missing[@]} -eq 0 ]] || { echo "test-alerts: no test in hack/promtool for ${missing[*]}" >&2; exit 1; }

cp "$here"/*_test.yaml "$tmp/"
cd "$tmp" && "$promtool" test rules ./*_test.yaml
