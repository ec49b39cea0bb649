#!/usr/bin/env bash
# Builds the installed Debian 12 Abseil and gRPC again from Debian's own source
# packages (same versions, same patches: same SONAMEs, same inline namespace
# absl::debian3), with -fsanitize=thread, into $GRADSYNC_TSAN_LIBS/{abseil,grpc}/lib
# (default /var/cache/gradsync-tsan). scripts/test-tsan.sh puts both first on
# LD_LIBRARY_PATH, so ThreadSanitizer sees what synchronizes gradsync's threads:
#  - Abseil, all its libraries. absl::Mutex, CondVar and Notification (and
#    SpinLock, call_once) carry TSan annotations: uninstrumented, TSan never
#    sees a Mutex synchronize. And the atomics of other libraries hand data
#    between threads too: absl::Status's reference count (the last Unref
#    frees a status other threads read), the random pool's call_once and
#    spin locks, which gRPC uses from all its threads.
#  - gRPC: libgpr, libgrpc, libgrpc++ (+ reflection, upb, address_sorting).
#    gRPC hands calls, messages and statuses between its threads through
#    lock-free queues and atomics; uninstrumented, every object passed that
#    way (a ServerContext, a request, an absl::Status) shows up as a race.
# Each library is checked against the system's: the same SONAME, and every
# symbol the system library defines (other than weak template copies, which
# depend on inlining) defined too. Run as root (it may add the deb-src entry
# and install dpkg-dev, cmake and the build dependencies). Does nothing for a
# package whose libraries (for the installed version) are already there.
# About 5 minutes for Abseil and 20 minutes for gRPC on 2 cores.
set -euo pipefail
root="${GRADSYNC_TSAN_LIBS:-/var/cache/gradsync-tsan}"
sysdir=/usr/lib/x86_64-linux-gnu
export DEB_BUILD_MAINT_OPTIONS=hardening=+bindnow  # debian/rules of both packages
tsan=(-fsanitize=thread -O1)

need() {  # installs the packages that are missing
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]} == 0)) || apt-get install -y -q --no-install-recommends "${missing[@]}"
}

strong_symbols() {  # the dynamic symbols a library defines, without weak ones
  nm -D --defined-only "$1" | awk '$2 != "W" && $2 != "V" && $2 != "u" {print $3}' | sort
}

# build SOURCE BINARY_PACKAGE CFLAGS_EXTRA CMAKE_TARGETS CMAKE_OPTIONS...
build() {
  local src="$1" bin="$2" cflags="$3" targets="$4"
  shift 4
  local ver dest work
  ver="$(dpkg-query -W -f='${source:Version}' "$bin")"
  dest="$root/$src/lib"
  [[ "$(cat "$dest/.built" 2>/dev/null)" == "$ver $targets" ]] && return 0
  echo "build-tsan-libs: building $src $ver with ThreadSanitizer into $dest"
  if ! apt-cache showsrc "$src" 2>/dev/null | grep -x "Version: $ver" > /dev/null; then
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
      > /etc/apt/sources.list.d/gradsync-deb-src.sources
    apt-get update -q
  fi
  need dpkg-dev cmake make g++
  work="$(mktemp -d)"
  (cd "$work" && apt-get source -q "$src=$ver" > source.log 2>&1) ||
    { echo "apt-get source $src=$ver failed: $work/source.log" >&2; exit 1; }
  local flags
  flags="$(dpkg-buildflags --get CPPFLAGS) $(dpkg-buildflags --get CXXFLAGS) ${tsan[*]} $cflags"
  cmake -S "$(find "$work" -maxdepth 1 -type d -name "$src-*")" -B "$work/build" \
    -DCMAKE_BUILD_TYPE=None -DCMAKE_INSTALL_PREFIX=/usr -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_SHARED_LINKER_FLAGS="$(dpkg-buildflags --get LDFLAGS) -fsanitize=thread" \
    "$@" > "$work/cmake.log" 2>&1 || { echo "cmake failed: $work/cmake.log" >&2; exit 1; }
  # shellcheck disable=SC2086
  cmake --build "$work/build" -j "${JOBS:-$(nproc)}" --target $targets > "$work/build.log" 2>&1 ||
    { echo "build failed: $work/build.log" >&2; exit 1; }

  mkdir -p "$dest"
  rm -f "$dest"/lib* "$dest"/.built
  local lib name soname missing
  while IFS= read -r lib; do
    name="$(basename "$lib")"
    soname="$(objdump -p "$lib" | awk '$1 == "SONAME" {print $2}')"
    [[ "$soname" == "$(objdump -p "$sysdir/$name" | awk '$1 == "SONAME" {print $2}')" ]] ||
      { echo "$name: SONAME $soname differs from $sysdir/$name" >&2; exit 1; }
    missing="$(comm -23 <(strong_symbols "$sysdir/$name") <(strong_symbols "$lib"))"
    [[ -z "$missing" ]] || { echo "$name lacks symbols of $sysdir/$name: $missing" >&2; exit 1; }
    cp "$lib" "$dest/$name"
    ln -sf "$name" "$dest/$soname"
  done < <(find "$work/build" -name 'lib*.so.*' -type f)
  rm -rf "$work"
  echo "$ver $targets" > "$dest/.built"
  echo "build-tsan-libs: $(find "$dest" -type f -name 'lib*' | wc -l) $src libraries in $dest"
}

build abseil libabsl20220623 "-g" all -DCMAKE_CXX_STANDARD=17
nm -D --defined-only "$root/abseil/lib/libabsl_synchronization.so.20220623" | c++filt |
  grep -c 'absl::debian3::Mutex::Lock()' > /dev/null || { echo "no absl::debian3::Mutex" >&2; exit 1; }

# gRPC's CMake needs the C++ plugin (for grpc++_reflection's generated code)
# and so libprotoc; the other build dependencies are what gradsync links.
need libprotoc-dev libc-ares-dev libre2-dev libssl-dev zlib1g-dev libabsl-dev libprotobuf-dev \
  protobuf-compiler
# -g1: line tables (file:line in reports) for its 800 files, not full debug info.
build grpc libgrpc29 "-g1" "gpr grpc grpc++ grpc++_reflection" -DgRPC_BUILD_TESTS=OFF \
  -DgRPC_ABSL_PROVIDER=package -DgRPC_CARES_PROVIDER=package -DgRPC_PROTOBUF_PROVIDER=package \
  -DgRPC_RE2_PROVIDER=package -DgRPC_SSL_PROVIDER=package -DgRPC_ZLIB_PROVIDER=package \
  -DgRPC_BENCHMARK_PROVIDER=package -DgRPC_BACKWARDS_COMPATIBILITY_MODE=OFF \
  -DgRPC_BUILD_GRPC_CPP_PLUGIN=ON \
  -DgRPC_BUILD_GRPC_CSHARP_PLUGIN=OFF -DgRPC_BUILD_GRPC_NODE_PLUGIN=OFF \
  -DgRPC_BUILD_GRPC_OBJECTIVE_C_PLUGIN=OFF -DgRPC_BUILD_GRPC_PHP_PLUGIN=OFF \
  -DgRPC_BUILD_GRPC_PYTHON_PLUGIN=OFF -DgRPC_BUILD_GRPC_RUBY_PLUGIN=OFF
