#!/usr/bin/env bash
# Validates deploy/: systemd units, config files, Kubernetes manifests, the
# Prometheus example config and the Dockerfile. CI runs it as
# //deploy:validate_test; run it by hand from anywhere:
#
#   deploy/validate.sh [--coordinator BIN] [--gradsyncd BIN]
#
# With the binaries, config keys and container args are checked against
# their real flags (from --helpfull) and the Dockerfile's runtime packages
# against their shared libraries (ldd). A check whose tool is missing is
# skipped with a line saying what to install; the exit status is 1 only if a
# check ran and failed.
#
# Tools: systemd-analyze (package systemd), python3 with python3-yaml,
# optionally kubectl (kustomize build), promtool (package prometheus),
# apt-cache/dpkg/ldd (Debian base).
set -uo pipefail

DEPLOY_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
coordinator="" gradsyncd="" ps=""
while (($#)); do
  case "$1" in
    --coordinator) coordinator=$(realpath "$2"); shift 2 ;;
    --gradsyncd) gradsyncd=$(realpath "$2"); shift 2 ;;
    --ps) ps=$(realpath "$2"); shift 2 ;;
    *) echo "validate.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

failed=0
skipped=0
pass() { echo "PASS  $*"; }
fail() { echo "FAIL  $*"; failed=$((failed + 1)); }
skip() { echo "SKIP  $*"; skipped=$((skipped + 1)); }

tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/gradsync-validate.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# --- systemd units ----------------------------------------------------------
# `systemd-analyze verify` requires every ExecStart= binary to exist. The
# units name /usr/bin/gradsync-*; the check runs on copies that point at
# placeholder executables (an `exit 0` script per binary) in a temporary
# directory, so it needs nothing installed and checks only the units.
units=("$DEPLOY_DIR"/systemd/*.service)
if command -v systemd-analyze >/dev/null; then
  mkdir -p "$tmp/bin" "$tmp/units"
  for u in "${units[@]}"; do
    for b in $(sed -n 's|^ExecStart=-\{0,1\}/usr/bin/\([^ ]*\).*|\1|p' "$u"); do
      printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/$b"
      chmod +x "$tmp/bin/$b"
    done
    sed "s|/usr/bin/gradsync|$tmp/bin/gradsync|g" "$u" >"$tmp/units/$(basename "$u")"
  done
  # verify exits 0 on warnings such as unknown keys: any output is a failure.
  if out=$(cd "$tmp/units" && SYSTEMD_LOG_LEVEL=warning systemd-analyze verify ./*.service 2>&1) &&
     [[ -z "$out" ]]; then
    pass "systemd-analyze verify: ${#units[@]} units (ExecStart -> placeholder executables)"
  else
    fail "systemd-analyze verify:"
    echo "$out" | sed 's/^/      /'
  fi
  for u in "$tmp"/units/*.service; do
    name=$(basename "$u")
    if out=$(cd "$tmp/units" && systemd-analyze security --offline=true --threshold=25 \
               --no-pager "./$name" 2>&1); then
      pass "systemd-analyze security $name: $(echo "$out" | sed -n 's/.*Overall exposure level for [^:]*: //p')"
    else
      fail "systemd-analyze security $name (exposure above 2.5 or error):"
      echo "$out" | tail -5 | sed 's/^/      /'
    fi
  done
  # sysusers.d: parse it against an empty root; it must create the user
  # gradsyncd.service runs as.
  user=$(sed -n 's/^User=//p' "$DEPLOY_DIR/systemd/gradsyncd.service")
  mkdir -p "$tmp/root/etc"
  if out=$(systemd-sysusers --root="$tmp/root" --dry-run \
             "$DEPLOY_DIR/systemd/gradsync.sysusers.conf" 2>&1) &&
     grep -q "Creating user '$user'" <<<"$out"; then
    pass "systemd-sysusers --dry-run gradsync.sysusers.conf: creates '$user' (gradsyncd.service's User=)"
  else
    fail "gradsync.sysusers.conf does not create '$user', the User= of gradsyncd.service:"
    echo "$out" | sed 's/^/      /'
  fi
else
  skip "systemd units: systemd-analyze not found (apt-get install systemd)"
fi

# --- flags of the real binaries --------------------------------------------
flag_args=() binary_args=()
for pair in "gradsync-coordinator:$coordinator" "gradsyncd:$gradsyncd" "gradsync-ps:$ps"; do
  name=${pair%%:*} bin=${pair#*:}
  [[ -z "$bin" ]] && continue
  if [[ ! -x "$bin" ]]; then
    fail "$name binary '$bin' is not executable"
    continue
  fi
  "$bin" --helpfull 2>&1 | sed -n 's/^ *--\([A-Za-z0-9_]*\) (.*/\1/p' >"$tmp/$name.flags"
  if [[ ! -s "$tmp/$name.flags" ]]; then
    fail "$name --helpfull listed no flags"
    continue
  fi
  flag_args+=(--flags "$name=$tmp/$name.flags")
  binary_args+=(--binary "$bin")
done

# Flags the deploy files use that the binaries do not have yet; reported as
# PENDING, not as failures. (None at the moment.)
pending_args=()

# --- config files, k8s manifests, Dockerfile (python3 + python3-yaml) -----
python=/usr/bin/python3
[[ -x $python ]] || python=$(command -v python3 || true)
if [[ -n "$python" ]]; then
  if out=$("$python" "$DEPLOY_DIR/validate_deploy.py" --deploy_dir "$DEPLOY_DIR" \
             "${flag_args[@]}" "${binary_args[@]}" "${pending_args[@]}" 2>&1); then
    echo "$out" | sed 's/^/PASS  /; s/^PASS  SKIP /SKIP  /; s/^PASS  PENDING /NOTE  pending: /'
    grep -q '^SKIP ' <<<"$out" && skipped=$((skipped + 1))
  else
    fail "validate_deploy.py:"
    echo "$out" | sed 's/^/      /'
  fi
else
  skip "config/k8s/Dockerfile checks: python3 not found"
fi

# --- kustomize build ---------------------------------------------------------
if command -v kubectl >/dev/null; then
  # On a copy: kustomize refuses the symlinks of Bazel's runfiles.
  cp -rL "$DEPLOY_DIR/k8s" "$tmp/k8s"
  if out=$(HOME="$tmp" timeout 60 kubectl kustomize "$tmp/k8s" 2>&1); then
    pass "kubectl kustomize deploy/k8s: $(grep -c '^kind:' <<<"$out") objects"
  else
    fail "kubectl kustomize deploy/k8s:"
    echo "$out" | sed 's/^/      /'
  fi
else
  skip "kustomize build: kubectl not found (not in Debian; optional)"
fi

# --- Prometheus example configs -------------------------------------------
if command -v promtool >/dev/null; then
  for f in "$DEPLOY_DIR"/prometheus/*.yml; do
    name=prometheus/$(basename "$f")
    if out=$(promtool check config --syntax-only "$f" 2>&1); then
      pass "promtool check config $name"
    elif grep -q 'kubernetes_sd_configs not found' <<<"$out"; then
      # Debian builds Prometheus without Kubernetes service discovery.
      skip "promtool check config $name: this promtool has no Kubernetes discovery (Debian's)"
    else
      fail "promtool check config $name:"
      echo "$out" | sed 's/^/      /'
    fi
  done
else
  skip "prometheus/*.yml: promtool not found (apt-get install prometheus)"
fi

# --- Grafana dashboard ----------------------------------------------------
if [[ -n "${python:-}" ]]; then
  for f in "$DEPLOY_DIR"/grafana/*.json; do
    name=grafana/$(basename "$f")
    if out=$("$python" "$DEPLOY_DIR/grafana/check_dashboard.py" "$f" "$DEPLOY_DIR/../docs/metrics.md" \
             "$(command -v promtool || true)" 2>&1); then
      pass "$name: $(tail -1 <<<"$out")"
    else
      fail "$name:"
      echo "$out" | sed 's/^/      /'
    fi
  done
else
  skip "grafana/*.json: no python3"
fi

echo "validate.sh: $failed failed, $skipped skipped"
((failed == 0))
