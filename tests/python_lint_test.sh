#!/usr/bin/env bash
# pyflakes over every Python file the test carries (the package, its tests,
# the benchmarks, examples and deploy checks): no unused imports or names, no
# undefined names. pyflakes3 is Debian's (scripts/install-deps.sh).
set -uo pipefail
ROOT="${TEST_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}/${TEST_WORKSPACE:-}"
cd "$ROOT"
mapfile -t files < <(find -L . -name '*.py' -not -path './external/*' | sort)
((${#files[@]} >= 10)) || { echo "FAIL: only ${#files[@]} Python files found: ${files[*]}"; exit 1; }
if ! out=$(pyflakes3 "${files[@]}" 2>&1); then
  echo "FAIL: pyflakes:"; echo "$out"; exit 1
fi
echo "PASS: ${#files[@]} files clean"
