#!/usr/bin/env bash
# commitlint.sh — make check: every commit after the history rule began
# (issue 24) has a subject of at most 72 characters, written `area: what
# changed` (an area of at most 40 characters: packages, paths or file names
# such as README, comma separated); the why
# goes in the body. Commits before BASE are left as they are.
#   hack/commitlint.sh [revision-range]   # default BASE..HEAD
set -euo pipefail
BASE=3a2d74b8ea8c745532f7319e4eb0dbe1adf62e92   # the last commit before the rule
cd "$(dirname "$0")/.."
git rev-parse --git-dir >/dev/null 2>&1 || { echo "commitlint: not a git checkout; nothing to check" >&2; exit 0; }
range=${1:-}
if [[ -z $range ]]; then
  if git cat-file -e "$BASE^{commit}" 2>/dev/null; then
    range=$BASE..HEAD
  else
    # A shallow clone without BASE: the newest commit alone is checked.
    range=HEAD~1..HEAD
  fi
fi
bad=0
while IFS=' ' read -r hash subject; do
  if (( ${#subject} > 72 )); then
    echo "commitlint: $hash: subject of ${#subject} characters (at most 72; the why goes in the body): $subject" >&2
    bad=1
  elif ! [[ $subject =~ ^[A-Za-z0-9][a-zA-Z0-9/._,\ -]{0,39}:\ [^\ ] ]]; then
    echo "commitlint: $hash: subject is not \"area: what changed\": $subject" >&2
    bad=1
  fi
done < <(git log --no-merges --format='%h %s' "$range")
exit $bad
