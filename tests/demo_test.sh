#!/usr/bin/env bash
# `gradsync demo` end to end: a small run must pass its checks and exit 0; an
# interrupted run (SIGINT, like Ctrl-C) must leave no process and no
# shared-memory segment behind.
set -uo pipefail
GRADSYNC="$1"
fail() { echo "FAIL: $*"; exit 1; }
segments() { ls /dev/shm 2>/dev/null | grep '^gradsync\.' | sort; }
# Segments present now that were not there before (older ones may be swept).
new_segments() { comm -13 <(echo "$before") <(segments) | grep . ; }

before=$(segments)
out=$("$GRADSYNC" demo --ranks=3 --max_bytes=1M --iters=1 --warmup=0 2>&1)
rc=$?
echo "$out"
[[ $rc -eq 0 ]] || fail "demo exited $rc"
grep -q '^OK: ' <<<"$out" || fail "no OK summary"
[[ $(grep -cE ' OK$' <<<"$out") -ge 10 ]] || fail "expected at least 10 checked rows"
grep -qE ' FAIL$' <<<"$out" && fail "a row failed"
new_segments >/dev/null && fail "shared memory left behind: $(new_segments)"

# Interrupt a long run while allreduces are in flight: once the first row is
# printed (its case done, the next one running), with the cluster's processes
# (coordinator and daemons, all started before any op) as children.
"$GRADSYNC" demo --ranks=4 --max_bytes=64M --iters=50 >"$TEST_TMPDIR/int.log" 2>&1 &
pid=$!
deadline=$((SECONDS + 60))
until grep -qE ' f32 +sum ' "$TEST_TMPDIR/int.log"; do
  ((SECONDS < deadline)) && kill -0 "$pid" 2>/dev/null || fail "no f32 row within 60 s: $(cat "$TEST_TMPDIR/int.log")"
  sleep 0.05
done
children=$(pgrep -P "$pid" | tr '\n' ' ')
[[ -n "$children" ]] || fail "demo started no children"
kill -INT "$pid"
wait "$pid"
rc=$?
cat "$TEST_TMPDIR/int.log" | tail -5
[[ $rc -eq 130 ]] || fail "interrupted demo exited $rc, expected 130"
# The children were the demo's to stop; they may take a moment to vanish.
deadline=$((SECONDS + 10))
for c in $children; do
  while kill -0 "$c" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "child $c still running 10 s after Ctrl-C"
    sleep 0.05
  done
done
new_segments >/dev/null && fail "shared memory left behind after Ctrl-C: $(new_segments)"
echo "PASS"
