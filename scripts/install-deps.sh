#!/usr/bin/env bash
# Installs what gradsync needs to build and test on Debian 12 (run as root).
# Idempotent: packages already present are not touched, apt-get update runs
# only when something is missing.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap g++ pkg-config
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev libgrpc-dev
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev prometheus-cpp-dev
  libibverbs-dev libsystemd-dev zlib1g-dev systemd python3 python3-yaml procps
  # ip and tc: tests that shape their own network namespace (//tests:setup_liveness_test).
  iproute2
  # libcrypto: lab and test certificates for mutual TLS (common/certs.h); the openssl
  # command checks what `gradsync certs` writes (//tests:certs_cli_test).
  libssl-dev openssl
  # libFuzzer targets (fuzz/, bench/fuzz.sh, //fuzz:fuzz_smoke_test): clang with its runtimes.
  clang libclang-rt-14-dev
  # The Python package (python/gradsync) and its tests.
  python3-numpy
  # The wheel (scripts/build-wheel.sh, //tests:wheel_test): built offline with Debian's
  # setuptools and wheel, installed with pip into a venv; pyflakes (//tests:python_lint_test).
  python3-pip python3-venv python3-setuptools python3-wheel pyflakes3
  # PyTorch (the torch.distributed backend, the DDP hook, examples/train_ddp.py).
  python3-torch python3-sklearn
  # The Prometheus server (//tests:prometheus_test) and promtool (deploy/validate.sh).
  prometheus
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: missing packages (${missing[*]}); run as root" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
