#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with Debian's clang (ASan + UBSan +
# libFuzzer) and runs each, starting from its corpus in fuzz/corpus/TARGET.
#
#   bench/fuzz.sh [--runs N] [--target NAME]... [--out DIR] [--update_corpus]
#
#   --runs N          executions per target (default 1000000)
#   --target NAME     only these targets (default: all of fuzz/*_fuzz.cc)
#   --out DIR         build and scratch directory (default /tmp/gradsync-fuzz)
#   --update_corpus   keep the new inputs the run found in fuzz/corpus/
#
# Prints one line per target: "TARGET: N executions, K crashes" and exits 1 if
# any target crashed (its reproducer is kept in DIR/TARGET/ and named).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=1000000
out=/tmp/gradsync-fuzz
update=0
targets=()
while (($#)); do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --runs=*) runs="${1#*=}"; shift ;;
    --target) targets+=("$2"); shift 2 ;;
    --target=*) targets+=("${1#*=}"); shift ;;
    --out) out="$2"; shift 2 ;;
    --out=*) out="${1#*=}"; shift ;;
    --update_corpus) update=1; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fuzz: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

CXX=${CXX:-clang++}
if ! command -v "$CXX" >/dev/null; then
  echo "fuzz: $CXX not found (apt-get install clang)" >&2
  exit 2
fi

# The sources each target links (the parser and what it needs).
declare -A SRCS=(
  [wire_fuzz]="transport/wire.cc common/digest.cc common/net.cc"
  [fd_request_fuzz]="ipc/fd_registration.cc common/net.cc"
  [config_fuzz]="common/config_file.cc"
  [op_queue_fuzz]="ipc/op_queue.cc ipc/doorbell.cc common/types.cc"
  [step_header_fuzz]="ps/protocol.cc ps/slicer.cc transport/wire.cc common/digest.cc common/net.cc common/types.cc"
  [coordinator_request_fuzz]="server/job_join.cc server/job_membership.cc server/job_registry.cc server/job_validation.cc server/shard_registry.cc common/logging.cc @PROTO@"
  [worker_request_fuzz]="worker/submit_validation.cc collective/op_validation.cc collective/codec_request.cc kernels/codec.cc kernels/topk.cc kernels/cpu_reduce.cc kernels/scaled_convert.cc common/logging.cc server/job_validation.cc collective/planner.cc collective/plan_code.cc collective/algorithm.cc collective/cost_model.cc collective/stream_tuner.cc common/types.cc @PROTO@"
  [signature_fuzz]="collective/op_signature.cc collective/codec_request.cc kernels/codec.cc kernels/topk.cc kernels/cpu_reduce.cc kernels/scaled_convert.cc common/logging.cc collective/algorithm.cc collective/planner.cc collective/cost_model.cc collective/stream_tuner.cc common/types.cc"
)
if ((${#targets[@]} == 0)); then
  for f in fuzz/*_fuzz.cc; do targets+=("$(basename "$f" .cc)"); done
fi

ABSL=$(pkg-config --libs absl_strings absl_str_format absl_status absl_statusor \
  absl_synchronization absl_time absl_flags absl_flags_reflection absl_hash absl_raw_hash_set)
FLAGS=(-std=c++17 -O1 -g -I. -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -fno-omit-frame-pointer -DNDEBUG)
mkdir -p "$out"
# The request messages, for the targets that read them (@PROTO@ in SRCS).
gen="$out/gen"
mkdir -p "$gen"
protoc -I. --cpp_out="$gen" proto/common.proto proto/coordinator.proto proto/worker.proto
PROTO="$gen/proto/common.pb.cc $gen/proto/coordinator.pb.cc $gen/proto/worker.pb.cc"
FLAGS+=(-I"$gen")
failed=0
for t in "${targets[@]}"; do
  if [[ -z "${SRCS[$t]:-}" ]]; then
    echo "fuzz: no sources listed for $t in bench/fuzz.sh" >&2
    exit 2
  fi
  bin="$out/$t"
  # shellcheck disable=SC2086
  srcs=${SRCS[$t]//@PROTO@/$PROTO}
  if ! "$CXX" "${FLAGS[@]}" "fuzz/$t.cc" $srcs -o "$bin" $ABSL -lprotobuf -lcrypto -lpthread \
      >"$out/$t.build.log" 2>&1; then
    echo "$t: build failed (log: $out/$t.build.log)"
    tail -20 "$out/$t.build.log" >&2
    failed=1
    continue
  fi
  corpus="fuzz/corpus/$t"
  scratch="$out/$t.corpus"
  rm -rf "$scratch" "$out/$t"-crash-* "$out/$t"-leak-* "$out/$t"-timeout-*
  mkdir -p "$scratch" "$corpus"
  cp -r "$corpus/." "$scratch/" 2>/dev/null || true
  log="$out/$t.log"
  rc=0
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$bin" -runs="$runs" -max_len=4096 -artifact_prefix="$out/$t-" "$scratch" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/.*Done \([0-9]*\) runs.*/\1/p' "$log" | tail -1)
  crashes=$({ ls "$out/$t"-crash-* "$out/$t"-leak-* "$out/$t"-timeout-* 2>/dev/null || true; } | wc -l)
  if ((rc != 0 && crashes == 0)); then crashes=1; fi
  echo "$t: ${execs:-0} executions, $crashes crashes"
  if ((crashes > 0)); then
    failed=1
    echo "  reproducer in $out ($t-crash-*); log: $log" >&2
    grep -m5 -e "ERROR:" -e "runtime error" -e "SUMMARY" "$log" >&2 || true
  fi
  if ((update)); then cp -n "$scratch"/* "$corpus"/ 2>/dev/null || true; fi
done
exit "$failed"
