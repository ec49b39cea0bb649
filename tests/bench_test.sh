#!/usr/bin/env bash
# `gradsync bench` end to end on an embedded cluster: the nccl-tests-style
# table and CSV (a row per size, every field well formed, #wrong 0 with
# --check), the link limits printed before the table, each collective, the
# node path, --blocking's daemon split, and clear errors for bad flags.
set -uo pipefail
GRADSYNC="$1"  # finds gradsyncd, the coordinator and the limit tools in the runfiles
fail() { echo "FAIL: $*"; exit 1; }
NUM='[0-9]+(\.[0-9]+)?'
T="${TEST_TMPDIR:-/tmp}"

# The table, the CSV and --check: 3 sizes of allreduce on 3 ranks.
out=$("$GRADSYNC" bench --ranks=3 --min_bytes=4K --max_bytes=64K --step_factor=4 --iters=2 \
      --warmup=1 --check --limits=false --csv="$T/b.csv" 2>&1) || fail "bench exited $?: $out"
echo "$out"
for b in 4096 16384 65536; do
  grep -qE "^ +$b +$((b / 4)) +f32 +sum +[a-z]+ +$NUM +$NUM +$NUM +0\$" <<<"$out" \
    || fail "no checked row for $b bytes"
done
grep -q '^# OK: 0 wrong elements' <<<"$out" || fail "no OK line"
grep -qE "^# Avg bus bandwidth    : $NUM\$" <<<"$out" || fail "no nccl-tests summary line"
[[ $(head -1 "$T/b.csv") == "op,ranks,bytes,count,dtype,redop,algo,time_us,algbw_gbps,busbw_gbps,wrong" ]] \
  || fail "bad CSV header: $(head -1 "$T/b.csv")"
[[ $(tail -n +2 "$T/b.csv" | grep -cE "^allreduce,3,[0-9]+,[0-9]+,f32,sum,[a-z]+,$NUM,$NUM,$NUM,0\$") -eq 3 ]] \
  || fail "expected 3 CSV rows: $(cat "$T/b.csv")"

# Out of place: two more columns (the input copied in before every op), checked too.
for mode in "" --blocking; do
  out=$("$GRADSYNC" bench --ranks=2 --min_bytes=64K --max_bytes=64K --iters=2 --warmup=1 --check \
        --out_of_place --limits=false $mode --csv="$T/oop.csv" 2>&1) || fail "oop bench $mode exited $?: $out"
  echo "$out"
  grep -qE "^ +bytes +count +type +redop +algo +time\(us\) +algbw\(GB/s\) +busbw\(GB/s\) +oop_time\(us\) +oop_busbw +#wrong\$" <<<"$out" \
    || fail "no out-of-place header ($mode)"
  grep -qE "^ +65536 +16384 +f32 +sum +[a-z]+ +$NUM +$NUM +$NUM +$NUM +$NUM +0\$" <<<"$out" || fail "no oop row ($mode)"
  [[ $(head -1 "$T/oop.csv") == *",wrong,oop_time_us,oop_busbw_gbps" ]] || fail "oop CSV header: $(head -1 "$T/oop.csv")"
done

# The limits before the table, measured in the same run.
out=$("$GRADSYNC" bench --ranks=2 --min_bytes=1M --max_bytes=1M --iters=1 --warmup=0 2>&1) \
  || fail "bench with limits exited $?: $out"
echo "$out"
grep -q "not found" <<<"$out" && fail "a limit tool was not found: $out"
limits_line=$(grep -n '^# limits measured in this run' <<<"$out" | cut -d: -f1)
table_line=$(grep -n '^ *bytes  *count' <<<"$out" | cut -d: -f1)
[[ -n "$limits_line" && -n "$table_line" && $limits_line -lt $table_line ]] \
  || fail "no limits block before the table"

# Every collective, a forced algorithm, another dtype and redop.
for op in reduce_scatter allgather broadcast reduce alltoall; do
  out=$("$GRADSYNC" bench --op=$op --ranks=3 --min_bytes=96K --max_bytes=96K --iters=1 \
        --warmup=0 --check --limits=false --root=2 2>&1) || fail "$op exited $?: $out"
  grep -qE "^ +98304 .* 0\$" <<<"$out" || fail "$op: no checked row: $out"
done
out=$("$GRADSYNC" bench --ranks=4 --algo=ring --dtype=bf16 --redop=max --min_bytes=1M \
      --max_bytes=1M --iters=1 --warmup=0 --check --limits=false 2>&1) || fail "ring bf16 exited $?: $out"
grep -qE "^ +1048576 +524288 +bf16 +max +ring .* 0\$" <<<"$out" || fail "no ring bf16 max row: $out"

# The node path, timed op by op with compute gaps: the split follows each row.
# The daemon combines the ranks in memory (hier), chosen or forced.
for algo in auto hier; do
  out=$("$GRADSYNC" bench --ranks=4 --ranks_per_daemon=4 --min_bytes=8 --max_bytes=8 --iters=20 \
        --warmup=2 --blocking --gap_us=200 --algo=$algo --check --limits=false 2>&1) \
    || fail "node bench ($algo) exited $?: $out"
  echo "$out"
  grep -qE "^ +8 +2 +f32 +sum +hier +$NUM .* 0\$" <<<"$out" || fail "no hier row ($algo)"
  grep -qE "^# 8 bytes: daemon-side medians over all ranks' ops: $NUM us queued" <<<"$out" \
    || fail "no daemon split line ($algo)"
done

# Bad flags: a clear error and a non-zero exit.
out=$("$GRADSYNC" bench --ranks=2 --min_bytes=8 --max_bytes=8 --gap_us=10 2>&1)
[[ $? -eq 2 ]] || fail "--gap_us without --blocking was accepted"
grep -q -- "--gap_us must be >= 0 and needs --blocking" <<<"$out" || fail "unclear --gap_us error: $out"
out=$("$GRADSYNC" bench --ranks=2 --min_bytes=8 --max_bytes=8 --iters=1 --algo=bogus --limits=false 2>&1)
[[ $? -ne 0 ]] || fail "an unknown algorithm was accepted"
grep -q "unknown algorithm 'bogus' (choose one of ring, rhd, rd, tree, pairwise, oneshot)" <<<"$out" \
  || fail "unclear --algo error: $out"
grep -qE "^ +8 +2 +f32 +sum +- +- +- +- +-\$" <<<"$out" || fail "a failed size printed figures: $out"
# One rank: nothing crosses a link, so busbw is 0 (nccl-tests' 2(n-1)/n).
out=$("$GRADSYNC" bench --ranks=1 --min_bytes=4K --max_bytes=4K --iters=1 --warmup=0 \
      --limits=false 2>&1) || fail "1-rank bench exited $?: $out"
grep -qE "busbw = algbw \* 0\.000 " <<<"$out" || fail "1-rank busbw factor is not 0: $out"
grep -qE "^ +4096 +1024 +f32 +sum +[a-z]+ +$NUM +$NUM +0\.000 +-\$" <<<"$out" \
  || fail "1-rank row with a non-zero busbw: $out"
# An existing cluster needs the bench job's world size.
out=$("$GRADSYNC" bench --coordinator=127.0.0.1:1 2>&1)
[[ $? -ne 0 ]] || fail "--coordinator without --world_size was accepted"
grep -q -- "--world_size is required with --coordinator" <<<"$out" \
  || fail "unclear --world_size error: $out"
echo "PASS"
