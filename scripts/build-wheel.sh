#!/usr/bin/env bash
# Builds the gradsync Python package as a wheel that bundles libgradsync.so:
#
#   scripts/build-wheel.sh [--out DIR] [--lib FILE]
#
#   DIR/gradsync-VERSION-py3-none-linux_x86_64.whl   (default DIR: dist/)
#
# Then, in a virtual environment that sees Debian's torch and numpy:
#   /usr/bin/python3 -m venv --system-site-packages ~/venv
#   ~/venv/bin/pip install dist/gradsync-*.whl
#
# --lib FILE takes an already built libgradsync.so (else //sdk:libgradsync.so
# is built). Offline: Debian's setuptools and wheel build it (no build
# isolation, no index). The library links Debian 12's gRPC, protobuf and
# Abseil shared libraries, so the wheel runs where those are installed
# (scripts/install-deps.sh, or the runtime packages docs/python.md lists).
set -euo pipefail
cd "$(dirname "$0")/.."

out=dist
lib=""
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --out=*) out="${1#*=}"; shift ;;
    --lib) lib="$2"; shift 2 ;;
    --lib=*) lib="${1#*=}"; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-wheel: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -z "$lib" ]]; then
  scripts/bazel.sh build //sdk:libgradsync.so >&2
  lib="$(pwd)/bazel-bin/sdk/libgradsync.so"
fi
[[ -f "$lib" ]] || { echo "build-wheel: $lib not found" >&2; exit 1; }
version=$(sed -n 's/^GRADSYNC_VERSION=//p' sdk/VERSION)
[[ -n "$version" ]] || { echo "build-wheel: no GRADSYNC_VERSION in sdk/VERSION" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp python/pyproject.toml python/setup.py "$stage/"
cp docs/python.md "$stage/README.md"
echo "$version" > "$stage/VERSION"
mkdir -p "$stage/gradsync/_lib"
cp python/gradsync/*.py "$stage/gradsync/"
install -m 0755 "$lib" "$stage/gradsync/_lib/libgradsync.so"

mkdir -p "$out"
PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 /usr/bin/python3 -m pip wheel -q \
  --no-deps --no-build-isolation --no-index -w "$out" "$stage" >&2
ls "$out"/gradsync-"$version"-py3-none-*.whl
