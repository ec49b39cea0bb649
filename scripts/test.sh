#!/usr/bin/env bash
# (b) The whole test suite: install, build, run every test (unit tests next
# to the code, multi-process tests in tests/). Ends with "N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh || exit 1
scripts/install-sdk.sh > /dev/null || exit 1  # libgradsync.so, headers, pkg-config, `import gradsync`
log=$(mktemp)
scripts/bazel.sh test //... --test_output=errors --nocache_test_results "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//\S+\s+PASSED' "$log")
failed=$(grep -cE '^//\S+\s+(FAILED|TIMEOUT|NO STATUS|FLAKY)' "$log")
skipped=$(grep -cE '^//\S+\s+SKIPPED' "$log")
rm -f "$log"
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
exit "$rc"
