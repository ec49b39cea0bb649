#!/usr/bin/env bash
# Runs bazel with the project's startup options (no long-lived server on CI).
# Records the source's git commit in common/build_commit.inc (ignored by git)
# for `--version`, rewriting it only when it changed so nothing else rebuilds.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
commit="$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
if [[ "$commit" != unknown ]] && ! git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null; then
  commit="$commit-dirty"
fi
inc="$ROOT/common/build_commit.inc"
want="\"$commit\""
if [[ ! -f "$inc" || "$(cat "$inc")" != "$want" ]]; then
  printf '%s\n' "$want" > "$inc.tmp" && mv -f "$inc.tmp" "$inc"
fi
exec bazel --max_idle_secs=60 "$@"
