# Sourced by the shell tests that need a local cluster. start_cluster N starts
# `gradsync cluster --ranks=N` ($GRADSYNC; the caller sets it, $T and fail()),
# stops it when the test exits, waits (30 s at most) for its env file and
# sources it (GRADSYNC_COORDINATOR, GRADSYNC_DAEMONS, GRADSYNC_DAEMON_<r>,
# GRADSYNC_TENANT_TOKEN, ...).
start_cluster() {
  "$GRADSYNC" cluster --ranks="$1" --env_file="$T/cluster.env" > "$T/cluster.log" 2>&1 &
  cluster=$!
  trap 'kill $cluster 2>/dev/null; wait $cluster 2>/dev/null' EXIT
  for _ in $(seq 300); do [[ -f "$T/cluster.env" ]] && break; sleep 0.1; done
  [[ -f "$T/cluster.env" ]] || fail "gradsync cluster did not come up: $(cat "$T/cluster.log")"
  source "$T/cluster.env"
}
