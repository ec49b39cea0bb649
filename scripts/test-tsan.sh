#!/usr/bin/env bash
# The test suite again, built with ThreadSanitizer (--config=tsan, .bazelrc)
# and run against Debian's Abseil and gRPC rebuilt with it
# (scripts/build-tsan-libs.sh, run first; found through LD_LIBRARY_PATH): any
# report fails the test. tools/tsan.supp holds the suppressions (third-party
# code only). Targets tagged no_tsan (Debian's python3 or programs built
# outside Bazel loading libgradsync.so or the rebuilt libraries, and the
# Dockerfile's library check) are left out. Arguments: bazel flags, and
# targets (default //...). Ends with "tsan: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
scripts/build-tsan-libs.sh || exit 1
libs="${GRADSYNC_TSAN_LIBS:-/var/cache/gradsync-tsan}"
flags=()
targets=()
for a in "$@"; do
  if [[ "$a" == //* ]]; then targets+=("$a"); else flags+=("$a"); fi
done
((${#targets[@]})) || targets=(//...)
log=$(mktemp)
scripts/bazel.sh test --config=tsan --test_tag_filters=-no_tsan --test_output=errors \
  --test_env=LD_LIBRARY_PATH="$libs/abseil/lib:$libs/grpc/lib" \
  --test_env=TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tools/tsan.supp" \
  --nocache_test_results "${flags[@]}" -- "${targets[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//\S+\s+PASSED' "$log")
failed=$(grep -cE '^//\S+\s+(FAILED|TIMEOUT|NO STATUS|FLAKY)' "$log")
rm -f "$log"
echo "tsan: ${passed} passed, ${failed} failed"
exit "$rc"
