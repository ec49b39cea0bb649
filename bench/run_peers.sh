#!/usr/bin/env bash
# run_peers.sh: the limits and peers that gradsync's allreduce bus bandwidth is
# compared against, measured in one go on this host. Prints result lines
# (`name,key=value,...`), human-readable lines ("# ..."), and for a run that
# failed or timed out an `error,run=...,ranks=...,rc=...` line. Format and
# formulas: bench/README.md.
#
#   bench/run_peers.sh --ranks 2,4 --min_bytes 4K --max_bytes 64M --step_factor 4 \
#                      --iters 5 --warmup 2
#
# Runs (--run, comma-separated; default all):
#   ring       gradsync-ring-limit: a plain TCP ring, no reduction, per --ranks
#   link       gradsync-ring-limit --single_stream_throughput: one-way TCP, 1 and --streams streams
#   membw      gradsync-membw: single-thread a += b (f32) and memcpy
#   gloo       bench/peers/gloo_allreduce.py (PyTorch gloo), per --ranks
#   mpi_tcp    bench/peers/mpi_allreduce.c, Open MPI, TCP over loopback, per --ranks
#   mpi_vader  the same, Open MPI shared memory (vader), per --ranks
#
# Installs what it needs first (apt-get, only for packages dpkg says are missing):
# python3-torch, openmpi-bin, libopenmpi-dev. Builds the two C++ tools with Bazel
# (//bench only) and the MPI program with mpicc into a temporary directory.
# Every run has a wall-clock limit (--timeout, seconds); only 127.0.0.1 is used.
set -uo pipefail

usage() {
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  cat <<'EOF'
Flags:
  --ranks LIST        world sizes, e.g. 2,4 (default 4)
  --min_bytes B       smallest message, K/M/G suffixes (default 4K)
  --max_bytes B       largest message (default 64M)
  --step_factor F     size multiplier (default 4)
  --sizes LIST        explicit sizes, e.g. 8,1M,64M (overrides min/max/step)
  --iters I           timed iterations per size (default 5)
  --warmup W          untimed iterations per size (default 2)
  --streams S         ring/link: sockets per neighbour pair (default 1; link always also runs 1)
  --spin_us US        ring/link: spin this long before blocking in poll() (default 0 = block,
                      like gradsync); results are then named ring_limit_spin / tcp_link_spin
  --no_latency        do not add the 8-byte (latency) size to ring, gloo and mpi
  --run LIST          which runs (default ring,link,membw,gloo,mpi_tcp,mpi_vader)
  --timeout SEC       limit for each run (default 600)
  --bin_dir DIR       use gradsync-ring-limit and gradsync-membw from DIR (no Bazel build)
  --no_install        never call apt-get (fail if a package is missing)
EOF
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RANKS="4"
MIN_BYTES="4K"
MAX_BYTES="64M"
STEP=4
SIZES=""
ITERS=5
WARMUP=2
STREAMS=1
SPIN_US=0
LATENCY=1
RUNS="ring,link,membw,gloo,mpi_tcp,mpi_vader"
TIMEOUT=600
BIN_DIR=""
INSTALL=1

need_value() { [[ $# -ge 2 ]] || { echo "run_peers.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  flag="$1"
  case "$flag" in
    --*=*) set -- "${flag%%=*}" "${flag#*=}" "${@:2}"; continue ;;
  esac
  case "$flag" in
    --ranks) need_value "$@"; RANKS="$2"; shift 2 ;;
    --min_bytes) need_value "$@"; MIN_BYTES="$2"; shift 2 ;;
    --max_bytes) need_value "$@"; MAX_BYTES="$2"; shift 2 ;;
    --step_factor) need_value "$@"; STEP="$2"; shift 2 ;;
    --sizes) need_value "$@"; SIZES="$2"; shift 2 ;;
    --iters) need_value "$@"; ITERS="$2"; shift 2 ;;
    --warmup) need_value "$@"; WARMUP="$2"; shift 2 ;;
    --streams) need_value "$@"; STREAMS="$2"; shift 2 ;;
    --spin_us) need_value "$@"; SPIN_US="$2"; shift 2 ;;
    --latency) LATENCY=1; shift ;;
    --no_latency) LATENCY=0; shift ;;
    --run) need_value "$@"; RUNS="$2"; shift 2 ;;
    --timeout) need_value "$@"; TIMEOUT="$2"; shift 2 ;;
    --bin_dir) need_value "$@"; BIN_DIR="$2"; shift 2 ;;
    --no_install) INSTALL=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_peers.sh: unknown flag $flag (see --help)" >&2; exit 2 ;;
  esac
done

for v in "$STEP" "$ITERS" "$WARMUP" "$STREAMS" "$SPIN_US" "$TIMEOUT"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "run_peers.sh: '$v' is not a number" >&2; exit 2; }
done
IFS=',' read -r -a RANK_LIST <<<"$RANKS"
for n in "${RANK_LIST[@]}"; do
  [[ "$n" =~ ^[0-9]+$ && "$n" -ge 2 ]] || { echo "run_peers.sh: bad rank count '$n'" >&2; exit 2; }
done
want() { [[ ",$RUNS," == *",$1,"* ]]; }
for r in ${RUNS//,/ }; do
  case "$r" in ring|link|membw|gloo|mpi_tcp|mpi_vader) ;;
    *) echo "run_peers.sh: unknown run '$r'" >&2; exit 2 ;;
  esac
done

log() { echo "# run_peers: $*"; }
FAILED=0
fail_line() {  # run ranks rc what
  echo "error,run=$1,ranks=$2,rc=$3"
  echo "# run_peers: $1 with $2 ranks failed (rc $3): $4" >&2
  FAILED=1
}

# ---------------------------------------------------------------------------
# Packages.
PKGS=()
want gloo && PKGS+=(python3-torch)
if want mpi_tcp || want mpi_vader; then PKGS+=(openmpi-bin libopenmpi-dev); fi
MISSING=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || MISSING+=("$p")
done
if [[ ${#MISSING[@]} -gt 0 ]]; then
  if [[ $INSTALL -eq 0 ]]; then
    echo "run_peers.sh: missing packages: ${MISSING[*]} (and --no_install given)" >&2; exit 1
  fi
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  log "installing ${MISSING[*]}"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q \
      --no-install-recommends "${MISSING[@]}"; } >&2 || {
    echo "run_peers.sh: apt-get install ${MISSING[*]} failed" >&2; exit 1; }
fi

# ---------------------------------------------------------------------------
# Builds.
TMP="$(mktemp -d /tmp/gradsync-run-peers.XXXXXX)"
CHILD=""
cleanup() { rm -rf "$TMP"; }
# On Ctrl-C / SIGTERM stop the run in flight (timeout forwards the signal to it;
# the tools take their own children down with them), then exit.
on_signal() {
  if [[ -n "$CHILD" ]]; then
    kill -TERM "$CHILD" 2>/dev/null
    wait "$CHILD" 2>/dev/null
  fi
  exit "$1"
}
trap cleanup EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

if want ring || want link || want membw; then
  if [[ -z "$BIN_DIR" ]]; then
    log "building //bench:gradsync-ring-limit //bench:gradsync-membw"
    (cd "$ROOT" && bazel build --jobs=1 //bench:gradsync-ring-limit //bench:gradsync-membw) >&2 \
      || { echo "run_peers.sh: bazel build failed" >&2; exit 1; }
    BIN_DIR="$(cd "$ROOT" && bazel info bazel-bin 2>/dev/null)/bench"
  fi
  RING_BIN="$BIN_DIR/gradsync-ring-limit"
  MEMBW_BIN="$BIN_DIR/gradsync-membw"
  [[ -x "$RING_BIN" && -x "$MEMBW_BIN" ]] || { echo "run_peers.sh: no binaries in $BIN_DIR" >&2; exit 1; }
fi
if want mpi_tcp || want mpi_vader; then
  mpicc -O2 -o "$TMP/mpi_allreduce" "$ROOT/bench/peers/mpi_allreduce.c" >&2 \
    || { echo "run_peers.sh: mpicc failed" >&2; exit 1; }
fi

# ---------------------------------------------------------------------------
# Runs. Every one is bounded by `timeout` (SIGTERM, then SIGKILL 10 s later).
SIZE_FLAGS=(--min_bytes "$MIN_BYTES" --max_bytes "$MAX_BYTES" --step_factor "$STEP")
[[ -n "$SIZES" ]] && SIZE_FLAGS=(--sizes "$SIZES")
ITER_FLAGS=(--iters "$ITERS" --warmup "$WARMUP")
LAT_FLAGS=()
[[ $LATENCY -eq 1 ]] && LAT_FLAGS=(--latency)

# The tools' own deadlines end 5 s before the hard limit, so they report first.
SOFT=$(( TIMEOUT > 10 ? TIMEOUT - 5 : TIMEOUT ))
# Runs a command under `timeout` in the background and waits for it, so that a
# signal to this script is handled at once (see on_signal).
bounded() {
  timeout -k 10 "$TIMEOUT" "$@" &
  CHILD=$!
  wait "$CHILD"
  local rc=$?
  CHILD=""
  return $rc
}

# Open MPI: run as root only when asked to, never leave loopback, force the
# ob1 PML so the chosen BTL is really used (not UCX/OFI), no core binding (the
# machine is shared, like gradsync's processes), oversubscription allowed.
MPI_COMMON=(--oversubscribe --bind-to none --mca pml ob1 --mca oob_tcp_if_include lo
            --mca btl_tcp_if_include lo)
if [[ $(id -u) -eq 0 ]]; then
  MPI_COMMON=(--allow-run-as-root "${MPI_COMMON[@]}")
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

if want membw; then
  bounded "$MEMBW_BIN" "${SIZE_FLAGS[@]}" "${ITER_FLAGS[@]}"
  rc=$?; [[ $rc -eq 0 ]] || fail_line membw 1 "$rc" "gradsync-membw"
fi
if want link; then
  bounded "$RING_BIN" --single_stream_throughput --streams "$STREAMS" --spin_us "$SPIN_US" \
    "${SIZE_FLAGS[@]}" "${ITER_FLAGS[@]}" --timeout_ms "$((SOFT * 1000))"
  rc=$?; [[ $rc -eq 0 ]] || fail_line link 2 "$rc" "gradsync-ring-limit --single_stream_throughput"
fi
for n in "${RANK_LIST[@]}"; do
  if want ring; then
    bounded "$RING_BIN" --ranks "$n" --streams "$STREAMS" --spin_us "$SPIN_US" "${SIZE_FLAGS[@]}" \
      "${LAT_FLAGS[@]}" "${ITER_FLAGS[@]}" --timeout_ms "$((SOFT * 1000))"
    rc=$?; [[ $rc -eq 0 ]] || fail_line ring "$n" "$rc" "gradsync-ring-limit"
  fi
  if want gloo; then
    bounded /usr/bin/python3 "$ROOT/bench/peers/gloo_allreduce.py" --ranks "$n" "${SIZE_FLAGS[@]}" \
      "${LAT_FLAGS[@]}" "${ITER_FLAGS[@]}" --timeout_s "$SOFT"
    rc=$?; [[ $rc -eq 0 ]] || fail_line gloo "$n" "$rc" "gloo_allreduce.py"
  fi
  if want mpi_tcp; then
    bounded mpirun "${MPI_COMMON[@]}" --mca btl tcp,self -np "$n" "$TMP/mpi_allreduce" \
      --transport tcp "${SIZE_FLAGS[@]}" "${LAT_FLAGS[@]}" "${ITER_FLAGS[@]}"
    rc=$?; [[ $rc -eq 0 ]] || fail_line mpi_tcp "$n" "$rc" "mpirun --mca btl tcp,self"
  fi
  if want mpi_vader; then
    bounded mpirun "${MPI_COMMON[@]}" --mca btl vader,self -np "$n" "$TMP/mpi_allreduce" \
      --transport vader "${SIZE_FLAGS[@]}" "${LAT_FLAGS[@]}" "${ITER_FLAGS[@]}"
    rc=$?; [[ $rc -eq 0 ]] || fail_line mpi_vader "$n" "$rc" "mpirun --mca btl vader,self"
  fi
done
exit $FAILED
