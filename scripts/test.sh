#!/usr/bin/env bash
# (b) The whole test suite: install, build, run every test (unit tests next
# to the code, multi-process tests in tests/). Then the CUDA targets, the
# device-buffer test and the GPU bench are compiled with nvcc (--config=cuda)
# and the tests run (their GPU cases skip, saying why, without a GPU), so the
# CUDA code never rots on machines without one. Ends with
# "N passed, M failed, K skipped".
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh || exit 1
scripts/install-sdk.sh > /dev/null || exit 1  # libgradsync.so, headers, pkg-config, `import gradsync`
log=$(mktemp)
scripts/bazel.sh test //... --test_output=errors --nocache_test_results "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "== the CUDA targets, compiled with /usr/local/cuda/bin/nvcc (--config=cuda)"
  scripts/bazel.sh test --config=cuda //cuda/... //tests:device_buffer_test //tests:gpu_bench \
    --test_output=errors --nocache_test_results \
    2>&1 | sed 's|^\(//\S*\)|\1[cuda]|' | tee -a "$log"
  cuda_rc=${PIPESTATUS[0]}
  ((rc == 0)) && rc=$cuda_rc
else
  echo "== the CUDA targets were not compiled: no /usr/local/cuda/bin/nvcc here"
fi
passed=$(grep -cE '^//\S+\s+PASSED' "$log")
failed=$(grep -cE '^//\S+\s+(FAILED|TIMEOUT|NO STATUS|FLAKY)' "$log")
skipped=$(grep -cE '^//\S+\s+SKIPPED' "$log")
rm -f "$log"
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
exit "$rc"
