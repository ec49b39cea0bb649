#!/usr/bin/env bash
# scripts/install.sh as an operator runs it: under a fresh prefix every binary,
# unit, config, doc, dashboard and the SDK land where the script says, the
# units name the installed paths (and the doc they point at exists), a config
# edited by the operator survives a re-install, the installed `gradsync` finds
# its sibling binaries (a 2-rank cluster and a checked bench run from the
# prefix alone), and a C++ program outside the repo builds with
# `pkg-config --cflags --libs gradsync` and runs two ranks on that cluster.
# Then the Debian layout, staged with --destdir.
set -uo pipefail
fail() { echo "FAIL: $*"; exit 1; }
T="${TEST_TMPDIR:-$(mktemp -d)}"
ROOT="${TEST_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}/${TEST_WORKSPACE:-}"  # the runfiles tree
P="$T/opt/gradsync"
bins=(gradsync-coordinator gradsyncd gradsync gradsync-ps gradsync-ring-limit gradsync-membw
      gradsync-cuda-probe gradsync-rdma-probe)

bash "$ROOT/scripts/install.sh" --prefix "$P" --from "$ROOT" > "$T/install.log" 2>&1 \
  || fail "install.sh failed: $(cat "$T/install.log")"
for b in "${bins[@]}"; do
  [[ -x "$P/bin/$b" ]] || fail "binary not installed: bin/$b"
  "$P/bin/$b" --version > "$T/v" 2>&1 || fail "$b --version failed: $(cat "$T/v")"
  grep -q "^$b [0-9]" "$T/v" || fail "$b --version: $(cat "$T/v")"
done
for f in etc/gradsync/gradsyncd.conf etc/gradsync/gradsync-coordinator.conf etc/gradsync/gradsync-ps.conf \
         lib/systemd/system/gradsyncd.service lib/systemd/system/gradsync-coordinator.service \
         lib/systemd/system/gradsync-ps.service lib/sysusers.d/gradsync.conf \
         share/doc/gradsync/README.md share/doc/gradsync/operations.md share/doc/gradsync/security.md \
         share/gradsync/grafana/gradsync-dashboard.json share/gradsync/prometheus/prometheus.yml \
         lib/libgradsync.so.1 include/gradsync/client.h include/gradsync/c_api.h \
         lib/pkgconfig/gradsync.pc python/gradsync/__init__.py; do
  [[ -e "$P/$f" ]] || fail "not installed: $f"
done
# Each unit starts the installed binary with the installed config and points at an installed doc.
for u in "$P"/lib/systemd/system/*.service; do
  name=$(basename "$u" .service)
  grep -qx "ExecStart=$P/bin/$name --config=$P/etc/gradsync/$name.conf" "$u" \
    || fail "$u: $(grep ExecStart "$u")"
  doc=$(sed -n 's|^Documentation=file:||p' "$u")
  [[ -n "$doc" && -f "$doc" ]] || fail "$u points at a doc that is not installed: '$doc'"
  grep -q "/usr/bin/\|/usr/share/doc" "$u" && fail "$u still names /usr paths: $(grep '/usr/' "$u")"
done
python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$P/share/gradsync/grafana/gradsync-dashboard.json" \
  || fail "the installed dashboard is not JSON"

# An operator's config edit survives a re-install.
echo "# edited by the operator" >> "$P/etc/gradsync/gradsyncd.conf"
bash "$ROOT/scripts/install.sh" --prefix "$P" --from "$ROOT" > "$T/install2.log" 2>&1 \
  || fail "re-install failed: $(cat "$T/install2.log")"
grep -q "edited by the operator" "$P/etc/gradsync/gradsyncd.conf" || fail "re-install overwrote the config"
grep -q "kept the existing $P/etc/gradsync/gradsyncd.conf" "$T/install2.log" \
  || fail "re-install did not say it kept the config: $(cat "$T/install2.log")"

# The installed CLI runs a cluster from the prefix alone (no Bazel tree on its search path).
cd "$T"
env -u GRADSYNC_BIN_DIR "$P/bin/gradsync" cluster --ranks=2 --env_file="$T/cluster.env" > "$T/cluster.log" 2>&1 &
cluster=$!
trap 'kill $cluster 2>/dev/null; wait $cluster 2>/dev/null' EXIT
for _ in $(seq 300); do [[ -f "$T/cluster.env" ]] && break; sleep 0.1; done
[[ -f "$T/cluster.env" ]] || fail "the installed gradsync cluster did not come up: $(cat "$T/cluster.log")"
for pid in $(pgrep -P $cluster); do
  exe=$(readlink "/proc/$pid/exe")
  [[ "$exe" == "$P/bin/"* ]] || fail "the installed gradsync started $exe, not a binary from $P/bin"
done
source "$T/cluster.env"
export GRADSYNC_TENANT_TOKEN

export PKG_CONFIG_PATH="$P/lib/pkgconfig"
c++ -std=c++17 -O1 -Wall -Werror -o ext_cpp "$ROOT/tests/sdk/external_cpp.cc" \
  $(pkg-config --cflags --libs gradsync) || fail "a C++ program did not build with pkg-config"
env -u LD_LIBRARY_PATH ./ext_cpp "$GRADSYNC_DAEMON_0" "job-install-$$" 2 0 > "$T/r0" 2>&1 &
r0=$!
env -u LD_LIBRARY_PATH ./ext_cpp "$GRADSYNC_DAEMON_1" "job-install-$$" 2 1 > "$T/r1" 2>&1 || fail "rank 1: $(cat "$T/r1")"
wait $r0 || fail "rank 0: $(cat "$T/r0")"
grep -q '^ok ' "$T/r0" && grep -q '^ok ' "$T/r1" || fail "the program did not print ok"
kill $cluster; wait $cluster 2>/dev/null; trap - EXIT

# bench from the prefix: the limits phase finds gradsync-ring-limit and gradsync-membw beside it.
env -u GRADSYNC_BIN_DIR "$P/bin/gradsync" bench --ranks=2 --min_bytes=4096 --max_bytes=4096 --iters=2 \
  --warmup=1 --check > "$T/bench.log" 2>&1 || fail "installed bench failed: $(cat "$T/bench.log")"
grep -q "not found" "$T/bench.log" && fail "installed bench lacks a binary: $(grep 'not found' "$T/bench.log")"
grep -q "plain TCP ring of 2 processes" "$T/bench.log" || fail "no ring limit: $(cat "$T/bench.log")"
grep -q "# OK: 0 wrong elements" "$T/bench.log" || fail "bench not exact: $(cat "$T/bench.log")"

# The Debian layout, staged: the paths in the files are the final ones.
S="$T/stage"
bash "$ROOT/scripts/install.sh" --layout debian --destdir "$S" --from "$ROOT" > "$T/deb.log" 2>&1 \
  || fail "debian layout failed: $(cat "$T/deb.log")"
for b in "${bins[@]}"; do [[ -x "$S/usr/bin/$b" ]] || fail "debian: usr/bin/$b missing"; done
for u in gradsyncd gradsync-coordinator gradsync-ps; do
  cmp -s "$S/lib/systemd/system/$u.service" "$ROOT/deploy/systemd/$u.service" \
    || fail "debian: $u.service differs from deploy/systemd (the units are written for this layout)"
done
for f in etc/gradsync/gradsyncd.conf usr/lib/sysusers.d/gradsync.conf usr/share/doc/gradsync/operations.md \
         usr/share/gradsync/grafana/gradsync-dashboard.json usr/lib/libgradsync.so.1 \
         usr/include/gradsync/client.h usr/lib/python3/dist-packages/gradsync/__init__.py; do
  [[ -e "$S/$f" ]] || fail "debian: not installed: $f"
done
grep -qx "prefix=/usr" "$S/usr/lib/pkgconfig/gradsync.pc" || fail "debian: gradsync.pc: $(head -1 "$S/usr/lib/pkgconfig/gradsync.pc")"
grep -qx "/usr/lib/libgradsync.so.1" "$S/usr/lib/python3/dist-packages/gradsync/_libpath.txt" \
  || fail "debian: the Python package names $(cat "$S/usr/lib/python3/dist-packages/gradsync/_libpath.txt")"
echo PASS
