#!/usr/bin/env bash
# A subset of torch's own distributed test suite (tests/torch_suite/
# run_torch_suite.py) against the gradsync backend on a real local cluster of
# 3 daemons, one rank each: the tests gradsync passes today must keep passing.
# The whole suite (and gloo beside it) is run by hand: docs/python.md.
set -uo pipefail
abs() { [[ "$1" == /* ]] && echo "$1" || echo "$PWD/$1"; }
GRADSYNC="$(abs "$1")"
export GRADSYNC_LIB="$(abs "$2")"
fail() { echo "FAIL: $*"; exit 1; }
T="${TEST_TMPDIR:-$(mktemp -d)}"
ROOT="${TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}/${TEST_WORKSPACE:-}"
export PYTHONPATH="$ROOT/python" HOME="$T" TMPDIR="$T"

source "$ROOT/tests/cluster_testing.sh"
start_cluster 3
export GRADSYNC_DAEMONS GRADSYNC_TENANT_TOKEN

SUBSET='^test_(all_reduce_sum|all_reduce_max|broadcast|reduce_sum|all_gather|barrier|get_rank|destroy_group'
# gather and scatter: the whole family but the CUDA tests (which skip: "Only Nccl supports CUDA gather").
SUBSET+='|gather|gather_checks|gather_full_group|gather_group|gather_object|gather_object_subgroup'
SUBSET+='|scatter|scatter_checks|scatter_complex|scatter_full_group|scatter_group|scatter_object_list'
# A barrier that times out raises what torch matches a timeout by (" Timed out ").
SUBSET+='|barrier_timeout_group|barrier_timeout_full_group'
SUBSET+='|send_recv|send_recv_any_source|send_recv_with_tag|isend|irecv|batch_isend_irecv_gloo'
SUBSET+='|batch_isend_irecv_gloo_tags|send_recv_autograd_profiler|send_recv_torch_profiler'
SUBSET+='|send_recv_any_source_autograd_profiler|send_recv_any_source_torch_profiler'
SUBSET+='|send_recv_with_tag_autograd_profiler|send_recv_with_tag_torch_profiler'
SUBSET+='|isend_autograd_profiler|isend_torch_profiler'
SUBSET+='|all_reduce_coalesced_(sum|product|min|max|max_complex_unsupported)'
SUBSET+='|all_reduce_coalesced_(group|full_group)_(sum|product|min|max)'
SUBSET+='|all_gather_coalesced_(simple|complex|group|full_group|with_empty)'
SUBSET+='|monitored_barrier_(gloo|gloo_subgroup|gloo_rank_0_timeout|failure_order|wait_all_ranks)'
SUBSET+='|sparse_all_reduce_sum)$'
out=$(/usr/bin/python3 "$ROOT/tests/torch_suite/run_torch_suite.py" --backend gradsync --world 3 \
        -k "$SUBSET" 2>&1)
rc=$?
grep -E '^(PASS|FAIL|ERROR|SKIP|#) ' <<<"$out"
[[ $rc -eq 0 ]] || fail "torch's suite failed on gradsync: $(tail -40 <<<"$out")"
grep -qE '^# gradsync at world size 3: 61 tests: 61 pass' <<<"$out" || fail "not 61 of 61 passed"
echo PASS
