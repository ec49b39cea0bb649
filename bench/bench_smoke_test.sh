#!/usr/bin/env bash
# gradsync-ring-limit and gradsync-membw end to end on loopback: every size gets
# exactly one well-formed result line, the tools exit 0, and no child process
# outlives them (also when the run times out).
set -uo pipefail
RING="$1"
MEMBW="$2"
fail() { echo "FAIL: $*"; exit 1; }
NUM='[0-9]+(\.[0-9]+)?(e[-+][0-9]+)?'
# Waits (up to 30 s) until process $1 has $2 children; prints them.
await_children() {
  local deadline=$((SECONDS + 30)) kids
  while :; do
    kids=$(pgrep -P "$1" | tr '\n' ' ')
    [[ $(wc -w <<<"$kids") -ge $2 ]] && break
    ((SECONDS < deadline)) && kill -0 "$1" 2>/dev/null || break
    sleep 0.02
  done
  echo "$kids"
}
# Waits (up to 10 s) until none of the processes named in $1 exists.
gone() {
  local deadline=$((SECONDS + 10)) k
  for k in $1; do
    while kill -0 "$k" 2>/dev/null; do
      ((SECONDS < deadline)) || return 1
      sleep 0.02
    done
  done
}

out=$("$RING" --ranks=3 --streams=2 --sizes=8,100K,1M --iters=3 --warmup=1 --segment_bytes=64K \
      --timeout_ms=60000 2>&1) || fail "ring exited $?: $out"
echo "$out"
for b in 8 102400 1048576; do
  grep -qE "^ring_limit,ranks=3,streams=2,bytes=$b,time_us=$NUM,busbw_gbps=$NUM\$" <<<"$out" \
    || fail "no ring_limit line for $b bytes"
done
[[ $(grep -c '^ring_limit,' <<<"$out") -eq 3 ]] || fail "expected 3 ring_limit lines"
grep -vE '^(ring_limit,|# )' <<<"$out" && fail "unexpected output lines"

out=$("$RING" --ranks=2 --bytes=1M --iters=2 --warmup=0 --timeout_ms=60000 2>&1) \
  || fail "2-rank ring exited $?: $out"
grep -qE "^ring_limit,ranks=2,streams=1,bytes=1048576,time_us=$NUM,busbw_gbps=$NUM\$" <<<"$out" \
  || fail "no 2-rank line: $out"

out=$("$RING" --ranks=4 --sizes=4K --iters=3 --warmup=1 --spin_us=50 --timeout_ms=60000 2>&1) \
  || fail "spinning ring exited $?: $out"
grep -qE "^ring_limit_spin,ranks=4,streams=1,bytes=4096,time_us=$NUM,busbw_gbps=$NUM\$" <<<"$out" \
  || fail "no ring_limit_spin line: $out"

out=$("$RING" --single_stream_throughput --streams=3 --sizes=64K,4M --iters=2 --warmup=1 \
      --timeout_ms=60000 2>&1) || fail "link exited $?: $out"
echo "$out"
for s in 1 3; do
  for b in 65536 4194304; do
    grep -qE "^tcp_link,streams=$s,bytes=$b,time_us=$NUM,gbps=$NUM\$" <<<"$out" \
      || fail "no tcp_link line for $s streams, $b bytes"
  done
done

out=$("$MEMBW" --sizes=4K,1M --iters=2 --warmup=1 2>&1) || fail "membw exited $?: $out"
echo "$out"
for op in add_f32 memcpy; do
  for b in 4096 1048576; do
    grep -qE "^membw,op=$op,bytes=$b,time_us=$NUM,gbps=$NUM\$" <<<"$out" \
      || fail "no membw line for $op $b"
  done
done

# A run that cannot finish in time fails, and leaves no process behind.
"$RING" --ranks=4 --sizes=64M --iters=1000 --warmup=0 --timeout_ms=1500 >/dev/null 2>&1 &
pid=$!
kids=$(await_children "$pid" 4)
[[ $(wc -w <<<"$kids") -eq 4 ]] || fail "expected 4 ring children, saw '$kids'"
wait "$pid"
rc=$?
[[ $rc -ne 0 ]] || fail "an over-deadline run exited 0"
gone "$kids" || fail "a child of '$kids' outlived the timed-out run by 10 s"

# Killing the parent takes the children with it (PR_SET_PDEATHSIG).
"$RING" --ranks=3 --sizes=64M --iters=1000 --warmup=0 --timeout_ms=60000 >/dev/null 2>&1 &
pid=$!
kids=$(await_children "$pid" 3)
[[ $(wc -w <<<"$kids") -eq 3 ]] || fail "expected 3 ring children, saw '$kids'"
kill -KILL "$pid"
wait "$pid" 2>/dev/null
gone "$kids" || fail "a child of '$kids' outlived its killed parent by 10 s"
echo "PASS"
