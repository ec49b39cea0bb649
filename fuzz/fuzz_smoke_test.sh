#!/usr/bin/env bash
# Builds every libFuzzer target and runs each for 20000 executions from its
# corpus: any crash, leak or sanitizer report fails the test.
set -euo pipefail
script=$(readlink -f bench/fuzz.sh)  # the source tree, not the runfiles links
exec "$script" --runs 20000 --out "${TEST_TMPDIR:-/tmp}/fuzz"
