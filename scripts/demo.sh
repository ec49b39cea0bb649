#!/usr/bin/env bash
# (a) The main job: install, build, and run `gradsync demo` (a local cluster
# of 1 coordinator + 4 daemons on loopback doing checked allreduces).
# Extra arguments go to `gradsync demo` (e.g. --ranks=8 --max_bytes=256M).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/install-sdk.sh > /dev/null  # libgradsync.so, headers, pkg-config, `import gradsync`
scripts/bazel.sh build //cli:gradsync //server:gradsync-coordinator //worker:gradsyncd
exec bazel-bin/cli/gradsync demo "$@"
