#!/usr/bin/env bash
# Installs the client SDK under a prefix: libgradsync.so, its headers, the
# pkg-config file and the Python package.
#
#   scripts/install-sdk.sh [--prefix DIR] [--python_dir DIR] [--no_build] [--lib FILE]
#                          [--destdir DIR]
#
#   DIR/lib/libgradsync.so.1 (+ libgradsync.so)   the C API and the C++ SDK
#   DIR/include/gradsync/{c_api.h,client.h,common/types.h,common/op_desc.h}
#   DIR/lib/pkgconfig/gradsync.pc                 pkg-config --cflags --libs gradsync
#   PYDIR/gradsync/                               import gradsync (default: Debian's
#                                                 /usr/local/lib/python3.X/dist-packages
#                                                 for the default prefix,
#                                                 /usr/lib/python3/dist-packages for /usr,
#                                                 else DIR/python)
# --destdir DIR stages the files under DIR; the paths written into them are the
# final ones (DIR left out).
#
# A C program:   cc app.c $(pkg-config --cflags --libs gradsync)
# A C++ program: c++ -std=c++17 app.cc $(pkg-config --cflags --libs gradsync)
# (with PKG_CONFIG_PATH=DIR/lib/pkgconfig for a prefix pkg-config does not search).
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=/usr/local
pydir=""
build=1
lib=""
destdir=""
while (($#)); do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --prefix=*) prefix="${1#*=}"; shift ;;
    --python_dir) pydir="$2"; shift 2 ;;
    --python_dir=*) pydir="${1#*=}"; shift ;;
    --no_build) build=0; shift ;;
    --lib) lib="$2"; build=0; shift 2 ;;  # an already built libgradsync.so (tests)
    --lib=*) lib="${1#*=}"; build=0; shift ;;
    --destdir) destdir="$2"; shift 2 ;;
    --destdir=*) destdir="${1#*=}"; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-sdk: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -z "$pydir" ]]; then
  if [[ "$prefix" == /usr/local ]]; then
    pydir=$(/usr/bin/python3 -c 'import sys; print("/usr/local/lib/python%d.%d/dist-packages" % sys.version_info[:2])')
  elif [[ "$prefix" == /usr ]]; then pydir=/usr/lib/python3/dist-packages
  else pydir="$prefix/python"; fi
fi
if ((build)); then
  scripts/bazel.sh build //sdk:libgradsync.so >&2
fi
[[ -n "$lib" ]] || lib="$(pwd)/bazel-bin/sdk/libgradsync.so"
[[ -f "$lib" ]] || { echo "install-sdk: $lib not built" >&2; exit 1; }
version=$(sed -n 's/^GRADSYNC_VERSION=//p' sdk/VERSION)

D="$destdir"
install -d "$D$prefix/lib/pkgconfig" "$D$prefix/include/gradsync/common" "$D$pydir"
install -m 0755 "$lib" "$D$prefix/lib/libgradsync.so.1"
ln -sf libgradsync.so.1 "$D$prefix/lib/libgradsync.so"
install -m 0644 client/c_api.h client/client.h "$D$prefix/include/gradsync/"
install -m 0644 common/types.h common/op_desc.h "$D$prefix/include/gradsync/common/"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" sdk/gradsync.pc.in \
  > "$D$prefix/lib/pkgconfig/gradsync.pc"
rm -rf "$D$pydir/gradsync"
cp -rL python/gradsync "$D$pydir/gradsync"
find "$D$pydir/gradsync" -name __pycache__ -prune -exec rm -rf {} +
# The package finds the library it was installed with.
printf '%s\n' "$prefix/lib/libgradsync.so.1" > "$D$pydir/gradsync/_libpath.txt"
echo "install-sdk: installed under ${D:+$D (staged) for }$prefix (python package in $pydir)"
