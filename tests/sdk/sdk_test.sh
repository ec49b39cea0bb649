#!/usr/bin/env bash
# The SDK as users get it: scripts/install-sdk.sh installs libgradsync.so, its
# headers, gradsync.pc and the Python package under a fresh prefix; a C and a
# C++ program are built outside the workspace with `pkg-config --cflags --libs
# gradsync` and run as two ranks against a real local cluster (`gradsync
# cluster`); then the Python package's tests run against the same cluster.
set -uo pipefail
abs() { [[ "$1" == /* ]] && echo "$1" || echo "$PWD/$1"; }
GRADSYNC="$(abs "$1")" LIB="$(abs "$2")"
fail() { echo "FAIL: $*"; exit 1; }
T="${TEST_TMPDIR:-$(mktemp -d)}"
ROOT="${TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}/${TEST_WORKSPACE:-}"  # the runfiles tree
PREFIX="$T/prefix"

bash "$ROOT/scripts/install-sdk.sh" --prefix "$PREFIX" --lib "$LIB" || fail "install-sdk failed"
for f in lib/libgradsync.so.1 lib/libgradsync.so include/gradsync/c_api.h include/gradsync/client.h \
         include/gradsync/common/types.h include/gradsync/common/op_desc.h lib/pkgconfig/gradsync.pc python/gradsync/__init__.py; do
  [[ -e "$PREFIX/$f" ]] || fail "not installed: $f"
done
# Only the C API and the SDK's namespace are exported.
leaked=$(nm -DC --defined-only "$PREFIX/lib/libgradsync.so.1" | awk '{ $1=""; $2=""; print }' |
         grep -vE '^ *(gs_|gradsync::|GRADSYNC_)' | head -5)
[[ -z "$leaked" ]] || fail "libgradsync.so exports more than its API: $leaked"
nm -DC --defined-only "$PREFIX/lib/libgradsync.so.1" | grep -qE 'gradsync::(transport|internal|ps)::' \
  && fail "internal namespaces exported"

export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
cd "$T"
cc -O1 -Wall -Werror -o ext_c "$ROOT/tests/sdk/external_c.c" $(pkg-config --cflags --libs gradsync) \
  || fail "the C program did not build against the installed SDK"
c++ -std=c++17 -O1 -Wall -Werror -o ext_cpp "$ROOT/tests/sdk/external_cpp.cc" \
  $(pkg-config --cflags --libs gradsync) || fail "the C++ program did not build against the installed SDK"
# The .pc puts the prefix on the program's RUNPATH, and the loader resolves the
# library there (LD_LIBRARY_PATH, which outranks RUNPATH, is the caller's choice
# and is left out of this check).
readelf -d ext_c | grep -E 'R(UN)?PATH' | grep -qF "$PREFIX/lib" \
  || fail "ext_c's RUNPATH lacks $PREFIX/lib: $(readelf -d ext_c | grep -E 'R(UN)?PATH')"
resolved=$(env -u LD_LIBRARY_PATH -u LD_PRELOAD ldd ext_c | awk '/libgradsync/ { print $3 }')
[[ -n "$resolved" && "$(realpath "$resolved")" == "$(realpath "$PREFIX/lib/libgradsync.so.1")" ]] \
  || fail "ext_c loads '$resolved', not $PREFIX/lib/libgradsync.so.1: $(env -u LD_LIBRARY_PATH ldd ext_c 2>&1)"

"$GRADSYNC" cluster --ranks=2 --env_file="$T/cluster.env" > "$T/cluster.log" 2>&1 &
cluster=$!
trap 'kill $cluster 2>/dev/null; wait $cluster 2>/dev/null' EXIT
for _ in $(seq 200); do [[ -f "$T/cluster.env" ]] && break; sleep 0.1; done
[[ -f "$T/cluster.env" ]] || fail "gradsync cluster did not come up: $(cat "$T/cluster.log")"
source "$T/cluster.env"
export GRADSYNC_TENANT_TOKEN  # the cluster's tenant: every client presents its token

for prog in ext_c ext_cpp; do
  env -u LD_LIBRARY_PATH ./$prog "$GRADSYNC_DAEMON_0" "job-$prog-$$" 2 0 > "$T/$prog.0" 2>&1 &
  r0=$!
  env -u LD_LIBRARY_PATH ./$prog "$GRADSYNC_DAEMON_1" "job-$prog-$$" 2 1 > "$T/$prog.1" 2>&1 || fail "$prog rank 1: $(cat "$T/$prog.1")"
  wait $r0 || fail "$prog rank 0: $(cat "$T/$prog.0")"
  grep -q '^ok ' "$T/$prog.0" && grep -q '^ok ' "$T/$prog.1" || fail "$prog did not print ok"
  echo "$prog: $(grep '^ok' "$T/$prog.0")"
done
grep -q "bad dtype refused: .*dtype" "$T/ext_c.0" || fail "no clear error for a bad dtype: $(cat "$T/ext_c.0")"

# The installed Python package (it finds the library it was installed with).
cd "$T"
GRADSYNC_DAEMONS="$GRADSYNC_DAEMONS" PYTHONPATH="$PREFIX/python" \
  /usr/bin/python3 "$ROOT/tests/sdk/python_sdk_test.py" 2>&1 || fail "python package tests failed"
PYTHONPATH="$PREFIX/python" /usr/bin/python3 -c \
  "import gradsync, gradsync._capi as c; c.lib(); assert c._lib._name == '$PREFIX/lib/libgradsync.so.1', c._lib._name" \
  || fail "the package did not load the installed library"
echo PASS
