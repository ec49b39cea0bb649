#!/usr/bin/env bash
# The test suite again, built with AddressSanitizer and UndefinedBehavior
# Sanitizer (--config=asan, .bazelrc): any report fails the test. Targets
# tagged no_asan (Debian's python3 or programs built outside Bazel loading
# libgradsync.so, and the Dockerfile's library check) are left out. Ends with
# "asan: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
scripts/bazel.sh test --config=asan --test_tag_filters=-no_asan //... --test_output=errors \
  --nocache_test_results "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//\S+\s+PASSED' "$log")
failed=$(grep -cE '^//\S+\s+(FAILED|TIMEOUT|NO STATUS|FLAKY)' "$log")
rm -f "$log"
echo "asan: ${passed} passed, ${failed} failed"
exit "$rc"
