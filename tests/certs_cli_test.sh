#!/usr/bin/env bash
# `gradsync certs`: a lab CA and role certificates, one node certificate per
# --nodes name (its own CN, OU node, signed by the same CA), one PS certificate
# per --ps_names name (OU ps), and --revoke
# writing a cumulative, CA-signed CRL that OpenSSL's own verifier honours.
set -euo pipefail
gradsync=$(readlink -f "$1")
dir="${TEST_TMPDIR:-/tmp}/certs-cli"
rm -rf "$dir"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$gradsync" certs --dir="$dir" > "$dir.out" || fail "certs"
for role in coordinator node ps operator; do
  [[ -f "$dir/$role.pem" && -f "$dir/$role.key" ]] || fail "no $role certificate"
done
"$gradsync" certs --dir="$dir" --nodes=node-a,node-b > "$dir.nodes" || fail "certs --nodes"
grep -q "^node node-a --tls_cert=$dir/node-a.pem" "$dir.nodes" || fail "node-a not printed: $(cat "$dir.nodes")"
for n in node-a node-b; do
  subject=$(openssl x509 -in "$dir/$n.pem" -noout -subject -nameopt RFC2253)
  [[ "${subject#subject=}" == "CN=$n,OU=node,O=gradsync" ]] || fail "$n subject is '$subject'"
  openssl verify -CAfile "$dir/ca.pem" "$dir/$n.pem" >/dev/null || fail "$n is not signed by the CA"
done
[[ $(grep -c "^CA " "$dir.nodes" || true) == 0 ]] || fail "--nodes on an existing dir made a new CA"
"$gradsync" certs --dir="$dir" --ps_names=shard-a > "$dir.ps" || fail "certs --ps_names"
grep -q "^ps shard-a *--tls_cert=$dir/shard-a.pem" "$dir.ps" || fail "shard-a not printed: $(cat "$dir.ps")"
subject=$(openssl x509 -in "$dir/shard-a.pem" -noout -subject -nameopt RFC2253)
[[ "${subject#subject=}" == "CN=shard-a,OU=ps,O=gradsync" ]] || fail "shard-a subject is '$subject'"
openssl verify -CAfile "$dir/ca.pem" "$dir/shard-a.pem" >/dev/null || fail "shard-a is not signed by the CA"
[[ $(grep -c "^CA " "$dir.ps" || true) == 0 ]] || fail "--ps_names on an existing dir made a new CA"

"$gradsync" certs --dir="$dir" --revoke="$dir/node-a.pem" > "$dir.revoke" || fail "certs --revoke"
hash=$(openssl x509 -in "$dir/ca.pem" -noout -hash)
[[ -f "$dir/crl/$hash.r0" ]] || fail "no $dir/crl/$hash.r0: $(ls "$dir/crl")"
crl_check() { openssl verify -crl_check -CAfile "$dir/ca.pem" -CRLfile "$1" "$2" >/dev/null 2>&1; }
crl_check "$dir/crl/$hash.r0" "$dir/node-a.pem" && fail "node-a still verifies after --revoke"
crl_check "$dir/crl/$hash.r0" "$dir/node-b.pem" || fail "node-b was revoked too"

"$gradsync" certs --dir="$dir" --revoke="$dir/node-b.pem" > /dev/null || fail "second --revoke"
[[ -f "$dir/crl/$hash.r1" ]] || fail "no $hash.r1"
crl_check "$dir/crl/$hash.r1" "$dir/node-a.pem" && fail "r1 forgot node-a"
crl_check "$dir/crl/$hash.r1" "$dir/node-b.pem" && fail "r1 does not list node-b"
crl_check "$dir/crl/$hash.r1" "$dir/operator.pem" || fail "operator revoked"

# A certificate of another CA is refused, naming the cause.
other="${dir}-other"
rm -rf "$other"
"$gradsync" certs --dir="$other" > /dev/null
if "$gradsync" certs --dir="$dir" --revoke="$other/node.pem" 2> "$dir.err"; then
  fail "revoked a certificate of another CA"
fi
grep -q "was not issued by the CA in $dir" "$dir.err" || fail "error was: $(cat "$dir.err")"
echo PASS
