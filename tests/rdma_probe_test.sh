#!/usr/bin/env bash
# gradsync-rdma-probe: on the verbs emulation it lists the device, the port
# (state, link layer, LID, MTU, speed), the GID table with the index gradsyncd
# uses (RoCE: the IPv4-mapped RoCE v2 entry) and GPUDirect; on this host's
# libibverbs it says why there is no RDMA (or lists the NICs) and exits
# accordingly. Argument: the probe binary.
set -u
probe="$1"
fail=0
expect() {  # OUTPUT PATTERN WHAT
  if ! grep -qE -- "$2" <<<"$1"; then echo "FAIL: $3: no line matching '$2' in:"; echo "$1"; fail=1; fi
}
out="$("$probe" --emulation=roce)"; rc=$?
[[ $rc == 0 ]] || { echo "FAIL: --emulation=roce exited $rc"; fail=1; }
expect "$out" '^1 RDMA device\(s\) \(emulated\):$' "device count"
expect "$out" '^    port 1: ACTIVE, Ethernet, lid 0x0, mtu 4096, 4x HDR \(200 Gb/s\)$' "port line"
expect "$out" '^      GID 3: ::ffff:10\.0\.0\.1 +RoCE v2 +<- gradsyncd uses this one' "chosen RoCE GID"
expect "$out" '^      GID 1: fe80:.* +RoCE v2 *$' "link-local RoCE v2 GID, not chosen"
expect "$out" '^GPUDirect RDMA: no \(emulated verbs\)$' "GPUDirect"
expect "$out" '^gradsyncd --transport=auto uses emu_roce0 port 1 \(GID index 3\)$' "the choice"
out="$("$probe" --emulation=ib)"
expect "$out" '^    port 1: ACTIVE, InfiniBand, lid 0x1, mtu 4096' "IB port line"
expect "$out" '^      GID 0: fe80:.* +IB +<- gradsyncd uses this one' "IB GID"
out="$("$probe")"; rc=$?
if [[ $rc == 0 ]]; then
  expect "$out" '^GPUDirect RDMA: (yes|no) \(' "GPUDirect on a host with RDMA"
else
  expect "$out" '^RDMA unavailable: ' "the reason there is no RDMA"
  expect "$out" 'runs over TCP' "the fallback"
fi
"$probe" --bogus >/dev/null 2>&1; rc=$?
[[ $rc == 2 ]] || { echo "FAIL: an unknown argument exited $rc, not 2"; fail=1; }
[[ $fail == 0 ]] && echo "PASS"
exit $fail
