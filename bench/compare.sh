#!/usr/bin/env bash
# compare.sh: gradsync's allreduce next to Gloo, Open MPI and the limits, measured back to
# back on this host, and written up as markdown tables with ratios from the same run.
#
#   bench/compare.sh                                 # the default matrix (see docs/performance.md)
#   bench/compare.sh --ranks 4 --sizes 1M,64M --paths net --repeat 1
#
# Two paths (--paths net,node):
#   net   one gradsyncd per rank (`gradsync bench --ranks N`), TCP over loopback. Beside it:
#         gradsync --algo ring (sizes >= --ring_from), gradsync-ring-limit (a plain ring of
#         N processes, --streams TCP streams per neighbour, the same bytes, no reduction),
#         Gloo (PyTorch, /usr/bin/python3) and Open MPI over TCP (--mca btl tcp,self).
#   node  N clients sharing one gradsyncd (`gradsync bench --ranks N --ranks_per_daemon N`,
#         the hierarchical path). Beside it: Open MPI shared memory (--mca btl vader,self)
#         and gradsync-membw (one pass of a += b, single thread).
# For every size the programs run one right after the other, so they share the machine
# state. 8-byte latency (--latency, on by default) is measured for all of them:
#   - the peers time blocking one-at-a-time ops after a barrier (mean and median of
#     --lat_iters iterations, slowest rank);
#   - gradsync is measured twice: `--iters N` back to back (N ops submitted, then all
#     waited for; time / N: a throughput figure, ops overlap in the pipeline), and
#     `--blocking --iters N` (each op alone after a barrier, submit + wait, slowest rank,
#     median over the iterations): timed like the peers, and what compares with them;
#   - with --gap_us G (default 1000), gradsync --blocking and Open MPI again with every rank
#     sleeping G us before each op (compute between a step's allreduces): what an op costs
#     when the threads that carry it may have gone to sleep.
# The key points (--key_ranks ranks at --key_bytes, and the 8-byte latency at --key_ranks)
# run --repeat times in all; the report shows the median over the repetitions.
#
# Load: before each batch (one size of one path) it waits for idle CPUs; a batch during which
# other processes used more than --max_foreign % of the CPUs is run again (--retries).
#
# Writes into --out DIR: results.txt (every result line, `name,key=value,...`, tagged with
# rep= and try= and, where the tool printed it, median_us/min_us/max_us; a `load` line per
# batch), discarded.txt (the same for batches that were run again), log.txt (everything the
# tools printed, `uptime` and the CPU share others used), bin/ (the binaries measured, copied
# so a concurrent rebuild cannot swap them mid-run) and report.md (bench/compare_report.py
# results.txt). Only 127.0.0.1 is used.
#
set -uo pipefail

usage() {
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  cat <<'EOF'
Flags:
  --ranks LIST        world sizes (default 2,4,8)
  --sizes LIST        sizes for world sizes below --few_from (default 4K,64K,1M,16M,64M,256M)
  --few_sizes LIST    sizes for world sizes >= --few_from (default: the same as --sizes)
  --few_from N        (default 8)
  --paths LIST        net,node (default both)
  --ring_from B       also run gradsync --algo ring for sizes >= B (default 1M)
  --streams S         ring limit: TCP streams per neighbour (default 2, gradsyncd's --tcp_streams)
  --gs_tcp_streams S  pass --tcp_streams S to gradsync bench (default: not passed, the daemon's
                      default applies: up to 2 streams, 1 or 2 as the link probe finds)
  --latency / --no_latency   8-byte latency runs (default on)
  --lat_iters I       iterations of the 8-byte runs (default 1000)
  --gap_us G          8-byte runs after G us of idle per op too, gradsync and Open MPI (default
                      1000; 0: skip)
  --key_ranks N       (default 4)   --key_bytes B (default 64M)
  --repeat R          runs of the key points in all, including the sweep (default 3)
  --out DIR           (default /tmp/gradsync-compare-YYYYmmdd-HHMMSS)
  --bin_dir DIR       use gradsync, gradsyncd, gradsync-coordinator, gradsync-ring-limit and
                      gradsync-membw from DIR (no Bazel build)
  --old_bin_dir DIR   an older build's gradsync, gradsyncd and gradsync-coordinator: every
                      gradsync point also runs with them, next to this build's in the same batch
                      (interleaved in every repetition, taking turns going first); the report
                      compares the two
  --timeout SEC       limit for each single run (default 600)
  --quiet_wait SEC    before each batch, wait up to SEC for the CPUs to be >= 85% idle (default 180)
  --max_foreign PCT   a batch during which other processes used more than PCT% of the CPUs is
                      discarded (kept in discarded.txt) and run again (default 10)
  --retries K         at most K such re-runs per batch; then the last one is kept (default 2)
EOF
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RANKS="2,4,8"
SIZES="4K,64K,1M,16M,64M,256M"
FEW_SIZES="4K,64K,1M,16M,64M,256M"
FEW_FROM=8
PATHS="net,node"
RING_FROM="1M"
STREAMS=2
GS_STREAMS=0
LATENCY=1
LAT_ITERS=1000
GAP_US=1000
KEY_RANKS=4
KEY_BYTES="64M"
REPEAT=3
OUT=""
BIN_DIR=""
OLD_BIN_DIR=""
TIMEOUT=600
QUIET_WAIT=180
MAX_FOREIGN=10
RETRIES=2

need_value() { [[ $# -ge 2 ]] || { echo "compare.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  flag="$1"
  case "$flag" in
    --*=*) set -- "${flag%%=*}" "${flag#*=}" "${@:2}"; continue ;;
  esac
  case "$flag" in
    --ranks) need_value "$@"; RANKS="$2"; shift 2 ;;
    --sizes) need_value "$@"; SIZES="$2"; shift 2 ;;
    --few_sizes) need_value "$@"; FEW_SIZES="$2"; shift 2 ;;
    --few_from) need_value "$@"; FEW_FROM="$2"; shift 2 ;;
    --paths) need_value "$@"; PATHS="$2"; shift 2 ;;
    --ring_from) need_value "$@"; RING_FROM="$2"; shift 2 ;;
    --streams) need_value "$@"; STREAMS="$2"; shift 2 ;;
    --gs_tcp_streams) need_value "$@"; GS_STREAMS="$2"; shift 2 ;;
    --latency) LATENCY=1; shift ;;
    --no_latency) LATENCY=0; shift ;;
    --lat_iters) need_value "$@"; LAT_ITERS="$2"; shift 2 ;;
    --gap_us) need_value "$@"; GAP_US="$2"; shift 2 ;;
    --key_ranks) need_value "$@"; KEY_RANKS="$2"; shift 2 ;;
    --key_bytes) need_value "$@"; KEY_BYTES="$2"; shift 2 ;;
    --repeat) need_value "$@"; REPEAT="$2"; shift 2 ;;
    --out) need_value "$@"; OUT="$2"; shift 2 ;;
    --bin_dir) need_value "$@"; BIN_DIR="$2"; shift 2 ;;
    --old_bin_dir) need_value "$@"; OLD_BIN_DIR="$2"; shift 2 ;;
    --timeout) need_value "$@"; TIMEOUT="$2"; shift 2 ;;
    --quiet_wait) need_value "$@"; QUIET_WAIT="$2"; shift 2 ;;
    --max_foreign) need_value "$@"; MAX_FOREIGN="$2"; shift 2 ;;
    --retries) need_value "$@"; RETRIES="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare.sh: unknown flag $flag (see --help)" >&2; exit 2 ;;
  esac
done

# Binary sizes: 4K = 4096, 64M = 67108864.
to_bytes() {
  local t="${1^^}" m=1
  case "$t" in
    *K) m=1024; t="${t%K}" ;; *M) m=$((1 << 20)); t="${t%M}" ;; *G) m=$((1 << 30)); t="${t%G}" ;;
  esac
  [[ "$t" =~ ^[0-9]+$ ]] || { echo "compare.sh: bad size '$1'" >&2; exit 2; }
  echo $((t * m))
}
for v in "$STREAMS" "$GS_STREAMS" "$LAT_ITERS" "$KEY_RANKS" "$REPEAT" "$TIMEOUT" "$FEW_FROM" "$QUIET_WAIT" "$MAX_FOREIGN" "$RETRIES"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "compare.sh: '$v' is not a number" >&2; exit 2; }
done
IFS=',' read -r -a RANK_LIST <<<"$RANKS"
for n in "${RANK_LIST[@]}"; do
  [[ "$n" =~ ^[0-9]+$ && "$n" -ge 2 ]] || { echo "compare.sh: bad rank count '$n'" >&2; exit 2; }
done
sizes_for() {  # ranks -> byte sizes, one per line
  local list="$SIZES"
  [[ "$1" -ge "$FEW_FROM" ]] && list="$FEW_SIZES"
  local s
  for s in ${list//,/ }; do to_bytes "$s"; done
}
want_path() { [[ ",$PATHS," == *",$1,"* ]]; }
RING_FROM_B=$(to_bytes "$RING_FROM")
KEY_B=$(to_bytes "$KEY_BYTES")

# Iterations by size: enough to average out small sizes, few for the big ones.
iters_for() {
  local b=$1
  if ((b <= 65536)); then echo "50 5"
  elif ((b <= 1048576)); then echo "20 3"
  elif ((b <= 16777216)); then echo "5 2"
  elif ((b <= 67108864)); then echo "3 1"
  else echo "2 1"; fi
}

[[ -n "$OUT" ]] || OUT="/tmp/gradsync-compare-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT/bin" || exit 1
RES="$OUT/results.txt"
LOG="$OUT/log.txt"
: >"$RES"
: >"$LOG"
TMP="$(mktemp -d /tmp/gradsync-compare.XXXXXX)"
CHILD=""
cleanup() { rm -rf "$TMP"; }
on_signal() {
  if [[ -n "$CHILD" ]]; then kill -TERM "$CHILD" 2>/dev/null; wait "$CHILD" 2>/dev/null; fi
  exit "$1"
}
trap cleanup EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

say() { echo "# compare: $*" | tee -a "$LOG" >&2; }

# ---------------------------------------------------------------------------
# Packages, binaries.
MISSING=()
for p in python3-torch openmpi-bin libopenmpi-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || MISSING+=("$p")
done
if [[ ${#MISSING[@]} -gt 0 ]]; then
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  say "installing ${MISSING[*]}"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q \
      --no-install-recommends "${MISSING[@]}"; } >>"$LOG" 2>&1 || { say "apt-get install failed"; exit 1; }
fi
if [[ -z "$BIN_DIR" ]]; then
  say "building //cli:gradsync //bench/..."
  (cd "$ROOT" && scripts/bazel.sh build //cli:gradsync //bench/...) >>"$LOG" 2>&1 \
    || { say "bazel build failed (see $LOG)"; exit 1; }
  BB="$ROOT/bazel-bin"
  SRC=("$BB/cli/gradsync" "$BB/worker/gradsyncd" "$BB/server/gradsync-coordinator"
       "$BB/bench/gradsync-ring-limit" "$BB/bench/gradsync-membw")
else
  SRC=()
  for b in gradsync gradsyncd gradsync-coordinator gradsync-ring-limit gradsync-membw; do
    SRC+=("$BIN_DIR/$b")
  done
fi
cp -f "${SRC[@]}" "$OUT/bin/" || { say "missing binaries"; exit 1; }
chmod u+w "$OUT/bin/"*
mpicc -O2 -o "$OUT/bin/mpi_allreduce" "$ROOT/bench/peers/mpi_allreduce.c" >>"$LOG" 2>&1 \
  || { say "mpicc failed"; exit 1; }
GS="$OUT/bin/gradsync"
export GRADSYNC_BIN_DIR="$OUT/bin"   # gradsync bench starts the gradsyncd and coordinator copied here
OLD_GS=""
if [[ -n "$OLD_BIN_DIR" ]]; then
  mkdir -p "$OUT/old"
  cp -f "$OLD_BIN_DIR/gradsync" "$OLD_BIN_DIR/gradsyncd" "$OLD_BIN_DIR/gradsync-coordinator" \
    "$OUT/old/" || { say "missing binaries in $OLD_BIN_DIR"; exit 1; }
  chmod u+w "$OUT/old/"*
  OLD_GS="$OUT/old/gradsync"
fi
RING="$OUT/bin/gradsync-ring-limit"
MEMBW="$OUT/bin/gradsync-membw"
MPI="$OUT/bin/mpi_allreduce"
GLOO="$ROOT/bench/peers/gloo_allreduce.py"
MPI_COMMON=(--oversubscribe --bind-to none --mca pml ob1 --mca oob_tcp_if_include lo
            --mca btl_tcp_if_include lo)
if [[ $(id -u) -eq 0 ]]; then
  MPI_COMMON=(--allow-run-as-root "${MPI_COMMON[@]}")
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# The machine, for the write-up.
{
  echo "machine,nproc=$(nproc),kernel=$(uname -r),cpu=$(lscpu | sed -n 's/^Model name: *//p' | tr ' ,' '__'),mem_gb=$(free -g | awk '/^Mem:/{print $2}')"
  if [[ -z "$BIN_DIR" ]]; then
    echo "source,commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null),dirty_files=$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | wc -l),built=$(date +%FT%T)"
  else
    echo "source,commit=prebuilt_in_${BIN_DIR//[,= ]/_},dirty_files=unknown,built=$(date -r "$BIN_DIR/gradsyncd" +%FT%T)"
  fi
  echo "binaries,gradsyncd_sha256=$(sha256sum "$OUT/bin/gradsyncd" | cut -c1-16),gradsync_sha256=$(sha256sum "$OUT/bin/gradsync" | cut -c1-16)"
  [[ -n "$OLD_GS" ]] && echo "old_binaries,dir=${OLD_BIN_DIR//[,= ]/_},gradsyncd_sha256=$(sha256sum "$OUT/old/gradsyncd" | cut -c1-16),version=$("$OLD_GS" version 2>/dev/null | head -1 | tr ' ,=' '___')"
  echo "versions,mpi=$(mpirun --version 2>/dev/null | head -1 | awk '{print $NF}'),torch=$(/usr/bin/python3 -c 'import torch;print(torch.__version__)' 2>/dev/null)"
  echo "config,ranks=${RANKS//,/+},sizes=${SIZES//,/+},few_sizes=${FEW_SIZES//,/+},streams=$STREAMS,gs_tcp_streams=$GS_STREAMS,lat_iters=$LAT_ITERS,gap_us=$GAP_US,repeat=$REPEAT,key_ranks=$KEY_RANKS,key_bytes=$KEY_B"
} >>"$RES"

# ---------------------------------------------------------------------------
# Running and recording.
bounded() {  # runs "$@" under timeout; stdout to $TMP/out
  timeout -k 10 "$TIMEOUT" "$@" >"$TMP/out" 2>"$TMP/err" &
  CHILD=$!
  wait "$CHILD"
  local rc=$?
  CHILD=""
  cat "$TMP/out" "$TMP/err" >>"$LOG"
  return $rc
}
# Copies result lines of $TMP/out into results.txt with tags; a "# ... (median M, min A, max B)"
# line right after a result line is folded into it.
record() {  # tags
  awk -v tags="$1" '
    function flush() { if (pending != "") { print pending tags; pending = "" } }
    /^[a-z_]+,[a-z_]+=/ && $0 !~ / / { flush(); pending = $0; next }
    /^#.*\(median [0-9.]+, min [0-9.]+, max [0-9.]+\)/ && pending != "" {
      match($0, /\(median [0-9.]+, min [0-9.]+, max [0-9.]+\)/)
      split(substr($0, RSTART + 1, RLENGTH - 2), p, /[ ,]+/)
      pending = pending ",median_us=" p[2] ",min_us=" p[4] ",max_us=" p[6]; flush(); next }
    END { flush() }' "$TMP/out" >>"$BRES"
}
fail() {  # what ranks bytes rc
  echo "error,run=$1,ranks=$2,bytes=$3,rc=$4,rep=$REP" >>"$BRES"
  say "FAILED: $1 ranks=$2 bytes=$3 rc=$4 (see $LOG)"
}
# Load around a batch. Before it: wait (up to --quiet_wait s) until the CPUs are at least 85%
# idle over 0.5 s, and note the load average. After it: the share of both CPUs that others
# used during the batch (busy time from /proc/stat minus the CPU time of our reaped children,
# i.e. the programs measured) and the hypervisor's steal time.
cpu_sample() {  # -> "busy idle steal ours" in clock ticks
  local c; c=($(head -1 /proc/stat))
  local ours; ours=$(awk '{print $16 + $17}' "/proc/$$/stat")
  echo "$((c[1] + c[2] + c[3] + c[6] + c[7])) $((c[4] + c[5])) ${c[8]} $ours"
}
BATCH=""
BATCH_FOREIGN=0
BRES="$TMP/batch.txt"
BATCH_START=()
IDLE_BEFORE=0
LOAD_BEFORE=""
batch_begin() {  # label (no commas)
  BATCH="$1"
  local waited=0 a b
  while :; do
    a=($(cpu_sample)); sleep 0.5; b=($(cpu_sample))
    local tot=$((b[0] - a[0] + b[1] - a[1] + b[2] - a[2]))
    IDLE_BEFORE=$(( (b[1] - a[1]) * 100 / (tot > 0 ? tot : 1) ))
    ((IDLE_BEFORE >= 85 || waited >= QUIET_WAIT * 2)) && break
    ((waited == 0)) && echo "# waiting for the CPUs to be idle ($IDLE_BEFORE% idle; busy:" \
      "$(ps -eo pcpu=,comm= --sort=-pcpu | awk '$1 > 20 {printf "%s(%s%%) ", $2, $1}'))" >>"$LOG"
    waited=$((waited + 1))
  done
  LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' '/')
  echo "# ---- $BATCH rep $REP: $(uptime | sed 's/^ *//'), idle ${IDLE_BEFORE}% of the CPUs over 0.5 s" \
    "(waited $((waited / 2)) s)" >>"$LOG"
  BATCH_START=($(cpu_sample))
  BATCH_T0=$(date +%s.%N)
}
batch_end() {
  local e; e=($(cpu_sample))
  local busy=$((e[0] - BATCH_START[0])) idle=$((e[1] - BATCH_START[1])) steal=$((e[2] - BATCH_START[2]))
  local ours=$((e[3] - BATCH_START[3]))
  local tot=$((busy + idle + steal)); ((tot > 0)) || tot=1
  local foreign=$(( (busy - ours) * 100 / tot )); ((foreign < 0)) && foreign=0
  BATCH_FOREIGN=$foreign
  local secs; secs=$(awk -v a="$BATCH_T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
  echo "load,batch=$BATCH,load=$LOAD_BEFORE,idle_before_pct=$IDLE_BEFORE,foreign_pct=$foreign,steal_pct=$((steal * 100 / tot)),ours_pct=$((ours * 100 / tot)),secs=$secs,rep=$REP" >>"$BRES"
  echo "# ---- end of $BATCH: ${secs} s; CPU share used by others ${foreign}%, by the programs measured $((ours * 100 / tot))%, steal $((steal * 100 / tot))%" >>"$LOG"
  local top
  top=$(ps -eo pcpu=,comm= --sort=-pcpu | awk '$1 > 20 {printf "%s(%s%%) ", $2, $1}')
  [[ -n "$top" ]] && echo "# busy processes now: $top" >>"$LOG"
}

# gradsync bench: one size, result line built from its --csv; with --old_bin_dir, the
# same again with the old build right after.
# The two builds take turns going first (odd repetitions: this build), so
# that whatever the first run of a pair pays or gains is shared alike.
gs_run() {  # path(net|node) ranks bytes algo(auto|ring) iters warmup timing(b2b|blocking|gap)
  if [[ -n "$OLD_GS" ]] && ((REP % 2 == 0)); then
    gs_run_build old "$OLD_GS" "$OUT/old" "$@"
    gs_run_build new "$GS" "$OUT/bin" "$@"
  else
    gs_run_build new "$GS" "$OUT/bin" "$@"
    [[ -n "$OLD_GS" ]] && gs_run_build old "$OLD_GS" "$OUT/old" "$@"
  fi
  return 0
}
gs_run_build() {  # build(new|old) gradsync bin_dir, then gs_run's arguments
  local build=$1 gs=$2 bin=$3; shift 3
  local path=$1 n=$2 b=$3 algo=$4 it=$5 wu=$6 timing=$7
  local rpd=1; [[ $path == node ]] && rpd=$n
  rm -f "$TMP/gs.csv"
  local streams=()
  ((GS_STREAMS > 0)) && streams=(--tcp_streams "$GS_STREAMS")
  [[ $timing == blocking ]] && streams+=(--blocking)
  [[ $timing == gap ]] && streams+=(--blocking --gap_us "$GAP_US")
  GRADSYNC_BIN_DIR="$bin" bounded "$gs" bench --ranks "$n" --ranks_per_daemon "$rpd" \
    --min_bytes "$b" --max_bytes "$b" --iters "$it" --warmup "$wu" --algo "$algo" "${streams[@]}" \
    --limits=false --csv "$TMP/gs.csv"
  local rc=$?
  if [[ $rc -ne 0 || ! -s "$TMP/gs.csv" ]]; then fail "gradsync_${build}_${path}_${algo}" "$n" "$b" "$rc"; return; fi
  tail -n +2 "$TMP/gs.csv" | awk -F, -v p="$path" -v a="$algo" -v t="$timing" -v it="$it" \
    -v rep="$REP" -v build="$build" '{
      printf "gradsync,path=%s,req=%s,timing=%s,ranks=%s,bytes=%s,time_us=%s,busbw_gbps=%s,algo=%s,iters=%s", p, a, t, $2, $3, $8, $10, $7, it
      printf ",build=%s,rep=%s\n", build, rep }' >>"$BRES"
}
ring_run() {  # ranks bytes iters warmup [spin_us]
  bounded "$RING" --ranks "$1" --streams "$STREAMS" --bytes "$2" --iters "$3" --warmup "$4" \
    --spin_us "${5:-0}" --timeout_ms $(( (TIMEOUT - 5) * 1000 ))
  local rc=$?; [[ $rc -eq 0 ]] || fail ring_limit "$1" "$2" "$rc"; record ",rep=$REP"
}
gloo_run() {  # ranks bytes iters warmup
  bounded /usr/bin/python3 "$GLOO" --ranks "$1" --sizes "$2" --iters "$3" --warmup "$4" \
    --timeout_s $((TIMEOUT - 5))
  local rc=$?; [[ $rc -eq 0 ]] || fail gloo "$1" "$2" "$rc"; record ",rep=$REP"
}
mpi_run() {  # transport(tcp|vader) ranks bytes iters warmup [gap_us: labelled <transport>_gap]
  local label=$1 gap=()
  [[ -n "${6:-}" ]] && { label="$1_gap"; gap=(--gap_us "$6"); }
  bounded mpirun "${MPI_COMMON[@]}" --mca btl "$1,self" -np "$2" "$MPI" --transport "$label" \
    --sizes "$3" --iters "$4" --warmup "$5" "${gap[@]}"
  local rc=$?; [[ $rc -eq 0 ]] || fail "mpi_$1" "$2" "$3" "$rc"; record ",rep=$REP"
}
membw_run() {  # bytes iters warmup
  bounded "$MEMBW" --sizes "$1" --iters "$2" --warmup "$3" --ops add_f32
  local rc=$?; [[ $rc -eq 0 ]] || fail membw 1 "$1" "$rc"; record ",rep=$REP"
}

# One size of one path, every program back to back.
net_size() {  # ranks bytes
  local n=$1 b=$2 it wu; read -r it wu <<<"$(iters_for "$b")"
  # auto and the forced ring take turns going first, as the builds do.
  if ((REP % 2 == 0 && b >= RING_FROM_B)); then
    gs_run net "$n" "$b" ring "$it" "$wu" b2b
    gs_run net "$n" "$b" auto "$it" "$wu" b2b
  else
    gs_run net "$n" "$b" auto "$it" "$wu" b2b
    ((b >= RING_FROM_B)) && gs_run net "$n" "$b" ring "$it" "$wu" b2b
  fi
  ring_run "$n" "$b" "$it" "$wu"
  gloo_run "$n" "$b" "$it" "$wu"
  mpi_run tcp "$n" "$b" "$it" "$wu"
}
node_size() {  # ranks bytes
  local n=$1 b=$2 it wu; read -r it wu <<<"$(iters_for "$b")"
  gs_run node "$n" "$b" auto "$it" "$wu" b2b
  mpi_run vader "$n" "$b" "$it" "$wu"
  membw_run "$b" "$it" "$wu"
}
# 8-byte latency of one path: gradsync back to back and each op alone (--blocking), then the peers.
latency() {  # path ranks
  local path=$1 n=$2 k
  gs_run "$path" "$n" 8 auto "$LAT_ITERS" 50 b2b
  gs_run "$path" "$n" 8 auto "$LAT_ITERS" 50 blocking
  if [[ $path == net ]]; then
    ring_run "$n" 8 "$LAT_ITERS" 50
    ring_run "$n" 8 "$LAT_ITERS" 50 1000   # spinning up to 1 ms first, like gradsyncd --spin_us
    gloo_run "$n" 8 "$LAT_ITERS" 50
    mpi_run tcp "$n" 8 "$LAT_ITERS" 50
  else
    mpi_run vader "$n" 8 "$LAT_ITERS" 50
  fi
  if ((GAP_US > 0)); then
    gs_run "$path" "$n" 8 auto "$LAT_ITERS" 50 gap
    if [[ $path == net ]]; then mpi_run tcp "$n" 8 "$LAT_ITERS" 50 "$GAP_US"
    else mpi_run vader "$n" 8 "$LAT_ITERS" 50 "$GAP_US"; fi
  fi
}
# Runs one batch; if other processes used more than --max_foreign % of the CPUs meanwhile,
# its results go to discarded.txt and it runs again (at most --retries more times).
run_batch() {  # label function args...
  local label=$1 try; shift
  for ((try = 1; ; ++try)); do
    : >"$BRES"
    batch_begin "$label"
    "$@"
    batch_end
    if ((BATCH_FOREIGN <= MAX_FOREIGN || try > RETRIES)); then
      sed "s/\$/,try=$try/" "$BRES" >>"$RES"
      break
    fi
    sed "s/\$/,try=$try/" "$BRES" >>"$OUT/discarded.txt"
    say "$label: other processes used ${BATCH_FOREIGN}% of the CPUs meanwhile; discarded, running it again"
  done
}

START=$(date +%s)
say "results in $OUT ($(uptime | sed 's/^ *//'))"
REP=1
for n in "${RANK_LIST[@]}"; do
  for b in $(sizes_for "$n"); do
    want_path net && { say "net  ranks=$n bytes=$b"; run_batch "net:ranks=$n:bytes=$b" net_size "$n" "$b"; }
    want_path node && { say "node ranks=$n bytes=$b"; run_batch "node:ranks=$n:bytes=$b" node_size "$n" "$b"; }
  done
  if [[ $LATENCY -eq 1 ]]; then
    want_path net && { say "latency net  ranks=$n"; run_batch "latency:net:ranks=$n" latency net "$n"; }
    want_path node && { say "latency node ranks=$n"; run_batch "latency:node:ranks=$n" latency node "$n"; }
  fi
done
# The key points again, for medians over --repeat runs.
for ((REP = 2; REP <= REPEAT; ++REP)); do
  want_path net && { say "repeat $REP: net  ranks=$KEY_RANKS bytes=$KEY_B"
    run_batch "net:ranks=$KEY_RANKS:bytes=$KEY_B" net_size "$KEY_RANKS" "$KEY_B"; }
  want_path node && { say "repeat $REP: node ranks=$KEY_RANKS bytes=$KEY_B"
    run_batch "node:ranks=$KEY_RANKS:bytes=$KEY_B" node_size "$KEY_RANKS" "$KEY_B"; }
  if [[ $LATENCY -eq 1 ]]; then
    want_path net && { say "repeat $REP: latency net  ranks=$KEY_RANKS"
      run_batch "latency:net:ranks=$KEY_RANKS" latency net "$KEY_RANKS"; }
    want_path node && { say "repeat $REP: latency node ranks=$KEY_RANKS"
      run_batch "latency:node:ranks=$KEY_RANKS" latency node "$KEY_RANKS"; }
  fi
done
say "done in $(( $(date +%s) - START )) s"
/usr/bin/python3 "$ROOT/bench/compare_report.py" "$RES" >"$OUT/report.md" \
  || { say "compare_report.py failed"; exit 1; }
say "report: $OUT/report.md"
grep -q '^error,' "$RES" && exit 1
exit 0
