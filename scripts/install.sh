#!/usr/bin/env bash
# Installs gradsync: every binary, the systemd units, the default configs, the
# docs the units point at, the Grafana dashboard and Prometheus examples, and
# the client SDK (libgradsync.so, headers, pkg-config file, Python package).
#
#   scripts/install.sh [--prefix DIR] [--layout debian] [--destdir DIR] [--sysconfdir DIR]
#                      [--from DIR] [--no_sdk]
#
#   --prefix DIR      where it goes (default /usr/local)
#   --layout debian   the packaged layout: prefix /usr, configs in /etc, units in
#                     /lib/systemd/system (what deploy/Dockerfile and the units expect)
#   --destdir DIR     stage under DIR (image builds, packaging): files land in
#                     DIR/PREFIX/..., paths written into files name PREFIX/...
#   --sysconfdir DIR  configs go to DIR/gradsync (default /etc for /usr and
#                     /usr/local, else PREFIX/etc); an existing config is kept
#   --from DIR        take the binaries from DIR laid out like bazel-bin (default:
#                     build them with `scripts/bazel.sh build -c opt` and use bazel-bin)
#   --no_sdk          skip the SDK
#
#   BINDIR=PREFIX/bin                       gradsync-coordinator gradsyncd gradsync gradsync-ps
#                                           gradsync-ring-limit gradsync-membw
#                                           gradsync-cuda-probe gradsync-rdma-probe
#   SYSCONFDIR/gradsync/*.conf              default configs (kept if present)
#   UNITDIR/*.service                       ExecStart and Documentation rewritten for BINDIR/DOCDIR
#   SYSUSERSDIR/gradsync.conf               the gradsync system user
#   DOCDIR=PREFIX/share/doc/gradsync        README.md and docs/*.md
#   PREFIX/share/gradsync/grafana/          gradsync-dashboard.json
#   PREFIX/share/gradsync/prometheus/       prometheus.yml, prometheus-kubernetes.yml
#   PREFIX/lib, PREFIX/include, PREFIX/lib/pkgconfig, Python package: scripts/install-sdk.sh
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=/usr/local
layout=""
destdir=""
sysconfdir=""
from=""
sdk=1
while (($#)); do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --prefix=*) prefix="${1#*=}"; shift ;;
    --layout) layout="$2"; shift 2 ;;
    --layout=*) layout="${1#*=}"; shift ;;
    --destdir) destdir="$2"; shift 2 ;;
    --destdir=*) destdir="${1#*=}"; shift ;;
    --sysconfdir) sysconfdir="$2"; shift 2 ;;
    --sysconfdir=*) sysconfdir="${1#*=}"; shift ;;
    --from) from="$2"; shift 2 ;;
    --from=*) from="${1#*=}"; shift ;;
    --no_sdk) sdk=0; shift ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$layout" in
  "") ;;
  debian) prefix=/usr ;;
  *) echo "install: unknown --layout '$layout' (debian)" >&2; exit 2 ;;
esac
[[ "$prefix" == /* ]] || { echo "install: --prefix must be absolute, not '$prefix'" >&2; exit 2; }
if [[ -z "$sysconfdir" ]]; then
  case "$prefix" in /usr|/usr/local) sysconfdir=/etc ;; *) sysconfdir="$prefix/etc" ;; esac
fi
if [[ "$layout" == debian ]]; then
  unitdir=/lib/systemd/system sysusersdir=/usr/lib/sysusers.d
else
  unitdir="$prefix/lib/systemd/system" sysusersdir="$prefix/lib/sysusers.d"
fi
bindir="$prefix/bin" docdir="$prefix/share/doc/gradsync" sharedir="$prefix/share/gradsync"

binaries=(server/gradsync-coordinator worker/gradsyncd cli/gradsync ps/gradsync-ps
          bench/gradsync-ring-limit bench/gradsync-membw cuda/gradsync-cuda-probe
          transport/gradsync-rdma-probe)
if [[ -z "$from" ]]; then
  targets=()
  for b in "${binaries[@]}"; do targets+=("//${b%/*}:${b##*/}"); done
  ((sdk)) && targets+=(//sdk:libgradsync.so)
  scripts/bazel.sh build -c opt "${targets[@]}" >&2
  from="$(pwd)/bazel-bin"
fi
for b in "${binaries[@]}"; do
  [[ -x "$from/$b" ]] || { echo "install: $from/$b is not built" >&2; exit 1; }
done

D="$destdir"
install -d "$D$bindir" "$D$sysconfdir/gradsync" "$D$unitdir" "$D$sysusersdir" "$D$docdir" \
  "$D$sharedir/grafana" "$D$sharedir/prometheus"
for b in "${binaries[@]}"; do install -m 0755 "$from/$b" "$D$bindir/"; done
for c in deploy/config/*.conf; do
  if [[ -e "$D$sysconfdir/gradsync/${c##*/}" ]]; then
    echo "install: kept the existing $sysconfdir/gradsync/${c##*/}" >&2
  else
    install -m 0644 "$c" "$D$sysconfdir/gradsync/"
  fi
done
for u in deploy/systemd/*.service; do
  sed -e "s|/usr/bin/|$bindir/|g" -e "s|/etc/gradsync/|$sysconfdir/gradsync/|g" \
      -e "s|file:/usr/share/doc/gradsync/|file:$docdir/|g" "$u" > "$D$unitdir/${u##*/}"
  chmod 0644 "$D$unitdir/${u##*/}"
done
install -m 0644 deploy/systemd/gradsync.sysusers.conf "$D$sysusersdir/gradsync.conf"
install -m 0644 README.md docs/*.md "$D$docdir/"
install -m 0644 deploy/grafana/gradsync-dashboard.json "$D$sharedir/grafana/"
install -m 0644 deploy/prometheus/*.yml "$D$sharedir/prometheus/"

if ((sdk)); then
  lib="$from/sdk/libgradsync.so"
  [[ -f "$lib" ]] || { echo "install: $lib is not built" >&2; exit 1; }
  pyargs=()
  [[ -n "$destdir" ]] && pyargs=(--destdir "$destdir")
  scripts/install-sdk.sh --prefix "$prefix" --lib "$lib" "${pyargs[@]}" >&2
fi
echo "installed gradsync under ${destdir:+$destdir (staged) for }$prefix: binaries in $bindir," \
     "configs in $sysconfdir/gradsync, units in $unitdir, docs in $docdir"
