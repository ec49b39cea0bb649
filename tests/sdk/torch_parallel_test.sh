#!/usr/bin/env bash
# ZeroRedundancyOptimizer and a 2 x 2 pipeline x data parallel shape over the
# gradsync backend (tests/sdk/torch_parallel_test.py), on a local cluster of
# two daemons (ranks 0, 1 on the first, 2, 3 on the second).
# Args: the gradsync CLI, libgradsync.so.
set -uo pipefail
abs() { [[ "$1" == /* ]] && echo "$1" || echo "$PWD/$1"; }
GRADSYNC="$(abs "$1")"
export GRADSYNC_LIB="$(abs "$2")"
fail() { echo "FAIL: $*"; exit 1; }
T="${TEST_TMPDIR:-$(mktemp -d)}"
ROOT="${TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}/${TEST_WORKSPACE:-}"
export PYTHONPATH="$ROOT/python" HOME="$T" TMPDIR="$T"

source "$ROOT/tests/cluster_testing.sh"
start_cluster 2
export GRADSYNC_DAEMONS GRADSYNC_TENANT_TOKEN
out=$(/usr/bin/python3 "$ROOT/tests/sdk/torch_parallel_test.py" 2>&1)
rc=$?
echo "$out" | grep -v "deprecated"
[[ $rc -eq 0 ]] || fail "torch_parallel_test.py failed"
[[ $(grep -c "match the single process run" <<<"$out") -eq 4 ]] || fail "not every rank matched"
echo PASS
