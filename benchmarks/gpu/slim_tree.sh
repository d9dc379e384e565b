#!/usr/bin/env bash
# A device call carries the whole checkout (tracked files and untracked ones git does not ignore) beside its carried
# paths, within 64 MiB; the committed raw runs (benchmarks/*/raw) are most of the checkout. For a run's calls, this
# checks out a throwaway branch without them: the code is the current commit's (pass it as RUN_COMMIT), and a call
# can carry about 58 MiB of a load's pieces instead of about 34.
#   bash benchmarks/gpu/slim_tree.sh          on branch gpu-slim-<commit>, the raw runs removed; prints <commit>
#   bash benchmarks/gpu/slim_tree.sh back     back on the branch it left; the throwaway branch deleted
set -euo pipefail
cd "$(dirname "$0")/../.."
state=$(git rev-parse --git-dir)/slim-tree-from
if [ "${1:-}" = back ]; then
  [ -f "$state" ] || { echo "slim_tree.sh: not on a slim branch (no $state)" >&2; exit 1; }
  from=$(cat "$state") slim=$(git branch --show-current)
  # run from anywhere but the slim branch, "back" would delete the branch it is on (or another one)
  [ "$slim" = "gpu-slim-${slim#gpu-slim-}" ] && [ "$slim" != "$from" ] \
    || { echo "slim_tree.sh: on $slim, not a gpu-slim-* branch; check out the slim branch first" >&2; exit 1; }
  git checkout -q "$from"
  git branch -q -D "$slim"
  rm -f "$state"
  echo "back on $from"
  exit 0
fi
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "slim_tree.sh: commit or stash changes first" >&2; exit 1; }
[ ! -f "$state" ] || { echo "slim_tree.sh: already on a slim branch ($(cat "$state") left)" >&2; exit 1; }
commit=$(git rev-parse --short HEAD)
git branch --show-current > "$state"
git checkout -q -b "gpu-slim-$commit"
git ls-files -z benchmarks | grep -z -E '^benchmarks/[^/]+/raw/' | xargs -0 git rm -q --
git commit -q -m "slim checkout for device calls (code at $commit; not for merging)"
echo "$commit: $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes tracked"
