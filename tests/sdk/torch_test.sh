#!/usr/bin/env bash
# PyTorch through gradsync on a real local cluster (one gradsyncd, every rank
# on it as on one GPU node): the torch.distributed backend's tests, then a
# short run of examples/train_ddp.py (DDP on the digits data set, 4 ranks:
# gloo, the gradsync backend and gradsync's DDP comm hook with one seed),
# which must agree with gloo step by step (--check); then compressed training
# on two daemons, which must stay within the codecs' tolerance of gloo.
set -uo pipefail
abs() { [[ "$1" == /* ]] && echo "$1" || echo "$PWD/$1"; }
GRADSYNC="$(abs "$1")"
export GRADSYNC_LIB="$(abs "$2")"
fail() { echo "FAIL: $*"; exit 1; }
T="${TEST_TMPDIR:-$(mktemp -d)}"
ROOT="${TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}/${TEST_WORKSPACE:-}"
export PYTHONPATH="$ROOT/python"

source "$ROOT/tests/cluster_testing.sh"
start_cluster 1
export GRADSYNC_TENANT_TOKEN  # the cluster's tenant: every client presents its token
export GRADSYNC_DAEMON="$GRADSYNC_DAEMON_0"

/usr/bin/python3 "$ROOT/tests/sdk/torch_backend_test.py" 2>&1 | grep -v "deprecated" \
  || fail "torch backend tests failed"
[[ ${PIPESTATUS[0]} -eq 0 ]] || fail "torch backend tests failed"
out=$(/usr/bin/python3 "$ROOT/examples/train_ddp.py" --ranks 4 --epochs 1 --check 2>&1) \
  || fail "train_ddp.py --check failed: $out"
echo "$out"
grep -q "^# gradsync vs gloo: .*: agree" <<<"$out" || fail "no gradsync vs gloo agreement line"
grep -q "^# hook vs gloo: .*: agree" <<<"$out" || fail "no hook vs gloo agreement line"

# Compressed training (docs/compression.md): two daemons of a cluster of its
# own, every bucket through int8 or fp8 (backend) or bf16 (hook). The losses
# must follow gloo's within 0.05 at every step and the test accuracy within 2
# points (--codec_loss_tol, --codec_acc_tol), and differ from them: the
# gradients did go through a lossy codec. Top-k (10% of each bucket, error
# feedback in the daemons; through the hook, which names its buckets): within
# 0.3 at every step and 3 points of accuracy (--topk_loss_tol, --topk_acc_tol).
out=$(env -u GRADSYNC_DAEMON /usr/bin/python3 "$ROOT/examples/train_ddp.py" --gradsync "$GRADSYNC" \
      --ranks 2 --daemons 2 --epochs 2 \
      --modes gloo,gradsync+int8,hook+bf16,gradsync+fp8e4m3,hook+topk:0.1 \
      --check 2>&1) || fail "compressed train_ddp.py --check failed: $out"
echo "$out"
for m in gradsync+int8 hook+bf16 gradsync+fp8e4m3 hook+topk:0.1; do
  grep -q "^# $m vs gloo: .*: agree" <<<"$out" || fail "no $m vs gloo agreement line"
  grep -q "^# $m vs gloo: max |loss diff| 0.00e+00" <<<"$out" && fail "$m: losses identical to gloo's"
done
echo PASS
