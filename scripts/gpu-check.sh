#!/usr/bin/env bash
# The GPU check (docs/building.md): on a machine with an NVIDIA GPU and
# driver, one command that builds with CUDA, runs every CUDA test with
# GRADSYNC_REQUIRE_CUDA=1 (a missing GPU fails instead of skipping): the
# kernels, the scaled conversions and the wire codecs bit-exact against the
# CPU, a 4-rank
# allreduce of device buffers bit-exact for every dtype (tests:device_buffer_test:
# 4 gradsyncd on GPU 0, in place on the GPU and on host twins), and prints the
# figures of tests:gpu_bench as markdown tables: reduce-kernel GB/s next to
# cudaMemcpy D2D GB/s, staging GB/s next to pinned-copy GB/s, device-buffer
# allreduce busbw in place and on host twins.
#
#   scripts/gpu-check.sh                  build here (needs Bazel, nvcc, the
#                                         Debian packages of install-deps.sh)
#   scripts/gpu-check.sh --bundle FILE    build here, pack the binaries and the
#                                         shared libraries they need into FILE
#                                         (.tar.gz) for a GPU machine without
#                                         the toolchain; runs nothing
#   scripts/gpu-check.sh --run-bundle DIR run the check from an unpacked bundle
#
# Exit status: 0 when every test passed and the bench ran.
set -uo pipefail
[[ "${1:-}" == --run-bundle ]] && bundle_dir=$(cd "${2:?--run-bundle DIR}" && pwd)
cd "$(dirname "$0")/.."
ROOT=$PWD
BINARIES=(cuda/cuda_reduce_test cuda/cuda_convert_test cuda/cuda_codec_test
          tests/device_buffer_test tests/gpu_bench
          worker/gradsyncd server/gradsync-coordinator ps/gradsync-ps)

run_checks() {  # $1: directory holding the binaries
  local bin=$1 rc=0
  export GRADSYNC_BIN_DIR=$bin GRADSYNC_REQUIRE_CUDA=1
  command -v nvidia-smi > /dev/null && nvidia-smi -L
  for t in cuda_reduce_test cuda_convert_test cuda_codec_test device_buffer_test; do
    echo "== $t"
    local start=$SECONDS
    local log=/tmp/gpu-check-$t.log status
    timeout 300 "$bin/$t" > "$log" 2>&1
    status=$?
    grep -vE '^[IWE][0-9]{4} ' "$log" | grep -E '^\[|Skipped|Failure|rror|no usable' | tail -60
    if ((status != 0)); then echo "FAILED: $t (exit $status; log $log)"; rc=1; else echo "PASSED: $t ($((SECONDS - start)) s)"; fi
  done
  echo "== gpu_bench"
  timeout 300 "$bin/gpu_bench" || { echo "FAILED: gpu_bench"; rc=1; }
  return $rc
}

case "${1:-}" in
  --run-bundle)
    dir=$bundle_dir
    export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    run_checks "$dir/bin"
    exit $?
    ;;
esac

scripts/install-deps.sh > /dev/null || exit 1
targets=()
for b in "${BINARIES[@]}"; do targets+=("//${b%/*}:${b##*/}"); done
echo "== building with CUDA (--config=cuda)"
scripts/bazel.sh build --config=cuda "${targets[@]}" 2>&1 | tail -3
[[ ${PIPESTATUS[0]} -eq 0 ]] || exit 1
bazel_bin=$(scripts/bazel.sh info --config=cuda bazel-bin 2>/dev/null)

if [[ "${1:-}" == --bundle ]]; then
  out=$(realpath -m "${2:?--bundle FILE}")
  stage=$(mktemp -d)
  mkdir -p "$stage/gpu-check/bin" "$stage/gpu-check/lib"
  for b in "${BINARIES[@]}"; do cp "$bazel_bin/$b" "$stage/gpu-check/bin/"; done
  # Every shared library but glibc's own (the GPU machine has a newer glibc).
  for b in "${BINARIES[@]}"; do  # the built ones: tests find Bazel's _solib_* by rpath
    ldd "$bazel_bin/$b" | awk '/=> \//{print $3}'
  done | sort -u | grep -vE '/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$stage/gpu-check/lib/"; done
  cp "$ROOT/scripts/gpu-check.sh" "$stage/gpu-check/"
  tar -C "$stage" -czf "$out" gpu-check && rm -rf "$stage"
  echo "bundle: $out ($(du -h "$out" | cut -f1)); on the GPU machine:"
  echo "  tar xzf $(basename "$out") && gpu-check/gpu-check.sh --run-bundle gpu-check"
  exit 0
fi

# The binaries live in their packages' folders; LocalCluster finds the
# daemons through GRADSYNC_BIN_DIR, so link them into one.
links=$(mktemp -d)
for b in "${BINARIES[@]}"; do ln -s "$bazel_bin/$b" "$links/"; done
run_checks "$links"
rc=$?
rm -rf "$links"
exit $rc
