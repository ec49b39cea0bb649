#!/usr/bin/env bash
# Every binary's --help lists its own flags (a flag it defines) and its
# --version names the version, the source commit and the build mode; `gradsync
# version` says the same. Arguments: pairs of BINARY FLAG_IT_DEFINES.
set -u
fail=0
while [[ $# -ge 2 ]]; do
  bin="$1" flag="$2"; shift 2
  name="$(basename "$bin")"
  help="$("$bin" --help 2>&1)"
  if ! grep -q -- "--$flag " <<<"$help"; then
    echo "FAIL: $name --help does not list --$flag:"; echo "$help" | head -20; fail=1
  fi
  # The servers and the CLI speak gRPC over TCP: their TLS flags are listed too.
  if [[ "$name" =~ ^(gradsync-coordinator|gradsyncd|gradsync-ps|gradsync)$ ]] &&
     ! grep -q -- "--tls_cert " <<<"$help"; then
    echo "FAIL: $name --help does not list --tls_cert"; fail=1
  fi
  if grep -q "No flags matched\|SetProgramUsageMessage() never called" <<<"$help"; then
    echo "FAIL: $name --help: $(grep -m1 'No flags matched\|never called' <<<"$help")"; fail=1
  fi
  version="$("$bin" --version 2>&1)"
  re="^$name [0-9]+\.[0-9]+\.[0-9]+ \(commit ([0-9a-f]{12}(-dirty)?|unknown), (un)?optimized, assertions (on|off)\)$"
  if ! [[ "$version" =~ $re ]]; then
    echo "FAIL: $name --version printed '$version'"; fail=1
  fi
  if [[ "$name" == gradsync ]]; then
    v2="$("$bin" version 2>&1)"
    [[ "$v2" == "$version" ]] || { echo "FAIL: gradsync version printed '$v2', --version '$version'"; fail=1; }
  fi
  echo "ok: $name: $version"
done
exit $fail
