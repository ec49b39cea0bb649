#!/usr/bin/env bash
# `gradsync bench` as nccl-tests is run on a cluster: one bench process per
# rank against an existing cluster (`gradsync cluster`), ranks and world size
# from a launcher's environment (torchrun's RANK/WORLD_SIZE), the coordinator
# named on the command line checked against the daemon's, the rendezvous wait
# bounded by --timeout_ms with progress while it waits, the table, CSV and SVG
# plot written by rank 0 (and the other rank saying so); then the timeline:
# `bench --timeline` and GRADSYNC_TIMELINE=1 give per-rank traces that
# `gradsync timeline merge` turns into one valid trace, a row per rank.
set -uo pipefail
GRADSYNC="$1"; [[ "$GRADSYNC" == /* ]] || GRADSYNC="$PWD/$GRADSYNC"
fail() { echo "FAIL: $*"; exit 1; }
T="${TEST_TMPDIR:-$(mktemp -d)}"
ROOT="${TEST_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}/${TEST_WORKSPACE:-}"
cd "$T"

source "$ROOT/tests/cluster_testing.sh"
start_cluster 2
export GRADSYNC_TENANT_TOKEN
common=(--coordinator="$GRADSYNC_COORDINATOR" --min_bytes=4K --max_bytes=64K --step_factor=4
        --iters=2 --warmup=1 --check --timeout_ms=30000)

# Two ranks, torchrun-style. Rank 1 starts first and waits: in joining order it
# would have been rank 0; its RANK keeps it rank 1.
RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 "$GRADSYNC" bench "${common[@]}" --daemon="$GRADSYNC_DAEMON_1" \
  --job=bench-env --csv="$T/r1.csv" > "$T/r1.out" 2> "$T/r1.err" &
r1=$!
# Rank 1 waits in the rendezvous once the coordinator counts it as a member
# (gradsync_coordinator_members; the metrics port is line 2 of the cluster's
# coordinator.port).
deadline=$((SECONDS + 30))
work=""
until [[ -n "$work" ]]; do
  work=$(sed -n 's/^# gradsync cluster: .* (logs in \(.*\)); Ctrl-C stops it$/\1/p' "$T/cluster.log")
  ((SECONDS < deadline)) || fail "no logs line from gradsync cluster: $(cat "$T/cluster.log")"
  [[ -n "$work" ]] || sleep 0.05
done
metrics_port=$(sed -n 2p "$work/coordinator.port")
members() { curl -sf "http://127.0.0.1:$metrics_port/metrics" | awk '$1 == "gradsync_coordinator_members" {print $2}'; }
until [[ "$(members)" == 1 ]]; do
  ((SECONDS < deadline)) && kill -0 $r1 2>/dev/null \
    || fail "rank 1 never joined (members '$(members)'): $(cat "$T/r1.out" "$T/r1.err")"
  sleep 0.05
done
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 "$GRADSYNC" bench "${common[@]}" --daemon="$GRADSYNC_DAEMON_0" \
  --job=bench-env --csv="$T/r0.csv" --plot="$T/r0.svg" > "$T/r0.out" 2> "$T/r0.err" \
  || fail "rank 0 exited $?: $(cat "$T/r0.out" "$T/r0.err")"
wait $r1 || fail "rank 1 exited $?: $(cat "$T/r1.out" "$T/r1.err")"
cat "$T/r0.out"
grep -q "^# this process: rank 0 of 2, job 'bench-env'" "$T/r0.out" || fail "rank 0 header: $(cat "$T/r0.out")"
grep -q "^# this process: rank 1 of 2, job 'bench-env'" "$T/r1.out" || fail "rank 1 header: $(cat "$T/r1.out")"
grep -q "existing cluster, coordinator $GRADSYNC_COORDINATOR" "$T/r0.out" || fail "no coordinator in the header"
[[ $(grep -cE '^ +[0-9]+ +[0-9]+ +f32 +sum +[a-z]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +0$' "$T/r0.out") -eq 3 ]] \
  || fail "rank 0 did not print 3 checked rows"
grep -q '^# OK: 0 wrong elements' "$T/r0.out" || fail "rank 0: no OK line"
grep -q '^# Avg bus bandwidth' "$T/r0.out" || fail "rank 0: no summary line"
grep -qE '^ +bytes' "$T/r1.out" && fail "rank 1 printed a table too: $(cat "$T/r1.out")"
grep -q "rank 1: --csv and --plot are written by rank 0" "$T/r1.err" || fail "rank 1 skipped --csv silently: $(cat "$T/r1.err")"
[[ ! -e "$T/r1.csv" ]] || fail "rank 1 wrote a CSV"
[[ $(tail -n +2 "$T/r0.csv" | wc -l) -eq 3 ]] || fail "rank 0's CSV: $(cat "$T/r0.csv")"
grep -q "joining job 'bench-env' (2 ranks) at coordinator $GRADSYNC_COORDINATOR" "$T/r1.err" \
  || fail "no progress while joining: $(cat "$T/r1.err")"
python3 - "$T/r0.svg" <<'PY' || fail "the plot is not a valid SVG with 3 points"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
assert root.tag == ns + "svg", root.tag
assert len(root.findall(ns + "circle")) == 3, len(root.findall(ns + "circle"))
line = [p for p in root.findall(ns + "polyline") if p.get("class") == "busbw"]
assert len(line) == 1 and len(line[0].get("points").split()) == 3
PY

# The coordinator named must be the daemon's: another one fails at once, naming both.
start=$SECONDS
out=$("$GRADSYNC" bench --coordinator=127.0.0.1:1 --world_size=1 --job=wrong \
      --daemon="$GRADSYNC_DAEMON_0" --min_bytes=8 --max_bytes=8 2>&1) && fail "a wrong --coordinator succeeded: $out"
grep -q "joins jobs at coordinator '$GRADSYNC_COORDINATOR', not at '127.0.0.1:1'" <<<"$out" \
  || fail "unclear wrong-coordinator error: $out"
((SECONDS - start < 10)) || fail "the wrong coordinator took $((SECONDS - start)) s to fail"
# Another spelling of the same coordinator is the same coordinator.
port=${GRADSYNC_COORDINATOR##*:}
"$GRADSYNC" bench --coordinator="localhost:$port" --world_size=1 --job=spelling \
  --daemon="$GRADSYNC_DAEMON_0" --min_bytes=8 --max_bytes=8 --iters=1 --warmup=0 > "$T/sp.out" 2>&1 \
  || fail "localhost:$port was refused for $GRADSYNC_COORDINATOR: $(cat "$T/sp.out")"

# The rendezvous wait follows --timeout_ms, with progress while it waits.
start=$SECONDS
out=$(RANK=0 WORLD_SIZE=2 "$GRADSYNC" bench --coordinator="$GRADSYNC_COORDINATOR" --job=alone \
      --daemon="$GRADSYNC_DAEMON_0" --min_bytes=8 --max_bytes=8 --timeout_ms=6000 2>&1) \
  && fail "a bench whose other rank never came succeeded"
elapsed=$((SECONDS - start))
((elapsed >= 5 && elapsed < 20)) || fail "the rendezvous gave up after ${elapsed} s, not ~6 s: $out"
grep -q "still waiting for the other ranks of job 'alone'" <<<"$out" || fail "no progress while waiting: $out"
# Launcher variables that are not numbers, and a missing job id.
out=$(RANK=x WORLD_SIZE=2 "$GRADSYNC" bench --coordinator="$GRADSYNC_COORDINATOR" --job=j 2>&1) \
  && fail "RANK=x accepted"
grep -q "\$RANK='x' is not an integer" <<<"$out" || fail "unclear RANK error: $out"
out=$(WORLD_SIZE=2 "$GRADSYNC" bench --coordinator="$GRADSYNC_COORDINATOR" 2>&1) && fail "no --job accepted"
grep -q -- "--job (or \$GRADSYNC_JOB) is required" <<<"$out" || fail "unclear --job error: $out"
out=$("$GRADSYNC" bench --ranks=1 --plot="$T/p.png" 2>&1) && fail "--plot .png accepted"
grep -q "name the file \*.svg" <<<"$out" || fail "unclear --plot error: $out"

# Timelines: `bench --timeline` merges the embedded cluster's traces itself.
mkdir -p "$T/tl" && cd "$T/tl"
"$GRADSYNC" bench --ranks=3 --job=tl --timeline --min_bytes=4K --max_bytes=16K --iters=2 --warmup=0 \
  --limits=false > "$T/tl.out" 2>&1 || fail "bench --timeline exited $?: $(cat "$T/tl.out")"
grep -q "^# timeline: tl.timeline.json" "$T/tl.out" || fail "no timeline line: $(cat "$T/tl.out")"
check_trace() {  # FILE RANKS: valid JSON, one row per rank named "rank R", ops on every row
  python3 - "$1" "$2" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
ranks = int(sys.argv[2])
names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
assert names == {r: "rank %d" % r for r in range(ranks)}, names
for r in range(ranks):
    ops = [e for e in events if e["pid"] == r and e.get("ph") == "X"]
    assert ops, "no op events on row %d" % r
PY
}
check_trace tl.timeline.json 3 || fail "tl.timeline.json is not one row per rank"
# GRADSYNC_TIMELINE=1 switches it on without a flag; `gradsync timeline merge` on the kept traces.
GRADSYNC_TIMELINE=1 "$GRADSYNC" bench --ranks=2 --job=envtl --keep_logs --min_bytes=4K --max_bytes=4K \
  --iters=1 --warmup=0 --limits=false > "$T/env.out" 2>&1 || fail "GRADSYNC_TIMELINE=1 bench: $(cat "$T/env.out")"
logs=$(sed -n 's/^# cluster logs: //p' "$T/env.out")
ls "$logs"/timeline/*envtl*.trace.json > /dev/null 2>&1 || fail "GRADSYNC_TIMELINE=1 wrote no traces in $logs/timeline"
"$GRADSYNC" timeline merge --out="$T/env.json" "$logs/timeline" > "$T/merge.out" 2>&1 \
  || fail "timeline merge: $(cat "$T/merge.out")"
grep -q "one row each (rank 0, rank 1)" "$T/merge.out" || fail "merge summary: $(cat "$T/merge.out")"
check_trace "$T/env.json" 2 || fail "the merged trace is not one row per rank"
rm -rf "$logs"
out=$(GRADSYNC_TIMELINE=maybe "$GRADSYNC" bench --ranks=1 --min_bytes=8 --max_bytes=8 --limits=false 2>&1) \
  && fail "GRADSYNC_TIMELINE=maybe accepted"
grep -q "GRADSYNC_TIMELINE='maybe': expected 1 or 0" <<<"$out" || fail "unclear GRADSYNC_TIMELINE error: $out"
echo PASS
