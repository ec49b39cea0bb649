#!/usr/bin/env bash
# The Python package installed the usual way: scripts/build-wheel.sh builds the
# wheel (the package and its own libgradsync.so), pip installs it into a fresh
# virtual environment that sees Debian's numpy and torch, the package loads the
# bundled library, and the Python SDK's tests pass from that environment
# against a real local cluster; pip uninstall removes it.
set -uo pipefail
abs() { [[ "$1" == /* ]] && echo "$1" || echo "$PWD/$1"; }
GRADSYNC="$(abs "$1")" LIB="$(abs "$2")"
fail() { echo "FAIL: $*"; exit 1; }
T="${TEST_TMPDIR:-$(mktemp -d)}"
ROOT="${TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}/${TEST_WORKSPACE:-}"  # the runfiles tree
export HOME="$T" PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INDEX=1

version=$(sed -n 's/^GRADSYNC_VERSION=//p' "$ROOT/sdk/VERSION")
whl=$(bash "$ROOT/scripts/build-wheel.sh" --lib "$LIB" --out "$T/dist" 2>"$T/build.log") \
  || fail "build-wheel failed: $(cat "$T/build.log")"
[[ "$(basename "$whl")" == "gradsync-$version-py3-none-linux_x86_64.whl" ]] || fail "wheel named '$whl'"
listing=$(/usr/bin/python3 -c "import sys, zipfile; print('\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))" "$whl")
for f in gradsync/__init__.py gradsync/torch.py gradsync/_lib/libgradsync.so; do
  grep -q "/$f\$\|^$f\$" <<<"$listing" || fail "the wheel lacks $f: $listing"
done
/usr/bin/python3 - "$whl" "$LIB" <<'PY' || fail "the wheel's libgradsync.so is not the one built"
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
name = next(n for n in z.namelist() if n.endswith("gradsync/_lib/libgradsync.so"))
sys.exit(0 if z.read(name) == open(sys.argv[2], "rb").read() else 1)
PY
/usr/bin/python3 -m venv --system-site-packages "$T/venv" > "$T/venv.log" 2>&1 \
  || fail "python3 -m venv failed: $(cat "$T/venv.log")"
PY="$T/venv/bin/python"
"$T/venv/bin/pip" install -q --no-deps "$whl" > "$T/pip.log" 2>&1 || fail "pip install failed: $(cat "$T/pip.log")"
cd "$T"  # not the source tree: the import must find the installed package
"$PY" -c "
import gradsync, gradsync._capi as c
assert gradsync.__file__.startswith('$T/venv/'), gradsync.__file__
c.lib()
assert c._lib._name.startswith('$T/venv/') and c._lib._name.endswith('gradsync/_lib/libgradsync.so'), c._lib._name
import importlib.metadata as m
assert m.version('gradsync') == '$version', m.version('gradsync')
" 2>&1 || fail "the installed package does not load its own library"

source "$ROOT/tests/cluster_testing.sh"
start_cluster 2
export GRADSYNC_DAEMONS GRADSYNC_TENANT_TOKEN
env -u GRADSYNC_LIB -u PYTHONPATH "$PY" "$ROOT/tests/sdk/python_sdk_test.py" > "$T/sdk.log" 2>&1 \
  || fail "the Python SDK tests failed from the virtual environment: $(tail -30 "$T/sdk.log")"
tail -1 "$T/sdk.log"

"$T/venv/bin/pip" uninstall -q -y gradsync > "$T/uninstall.log" 2>&1 || fail "pip uninstall: $(cat "$T/uninstall.log")"
# A gradsync installed system-wide (scripts/install-sdk.sh) may still be seen
# through --system-site-packages; the environment's own copy must be gone.
left=$("$PY" -c "import gradsync; print(gradsync.__file__)" 2>/dev/null)
[[ "$left" == "$T/venv/"* ]] && fail "gradsync still installed in the environment after pip uninstall: $left"
ls -d "$T"/venv/lib/python3*/site-packages/gradsync* 2>/dev/null && fail "pip uninstall left files behind"
echo PASS
