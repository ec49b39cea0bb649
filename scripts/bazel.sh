#!/usr/bin/env bash
# Runs bazel with the project's startup options (no long-lived server on CI).
exec bazel --max_idle_secs=60 "$@"
