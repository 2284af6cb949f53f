# Two "hosts" on one machine for Open MPI, sourced by tests/cli/mpi_two_hosts.sh and bench/mpi:
# two network namespaces joined by a veth pair (10.213.7.1/24 and .2/24, the veth named kiln0 in
# both), each with a host name of its own (kiln-host1, kiln-host2); mpirun runs in the first and
# starts the second host's daemon through tests/support/netns-agent.sh (`ip netns exec`) instead
# of ssh, with TCP only on the veth subnet. Nothing is added to the machine's own network.
#   netns_hosts_up DIR   makes the hosts (needs root); DIR receives the agent and the hostfile.
#                        On failure returns 1 with the reason in NETNS_ERR, and NETNS_SKIP=1
#                        when this machine cannot make namespaces at all (no `ip`, no
#                        CAP_SYS_ADMIN) rather than failing half-way.
#   netns_hosts_down     removes them, killing what still runs there; safe to call twice and
#                        before netns_hosts_up (callers put it in their EXIT trap).
#   netns_on_hosts [MPIRUN OPTIONS...] COMMAND...
#                        mpirun -np 2 in the first namespace, one rank per host, under
#                        `timeout NETNS_TIMEOUT` (default 120 s); BTL (default self,tcp) names the
#                        BTLs. It runs in the background and is waited for, so that a signal's
#                        trap runs at once instead of after mpirun.
#   netns_counters       "RX TX": the veth's byte counters on the second host.
# The namespaces are named kiln-h1-PID and kiln-h2-PID after the sourcing shell; netns_hosts_up
# first deletes those whose process is gone (a run killed before its trap could run).
NETNS_NET=10.213.7
NETNS_IP1=$NETNS_NET.1
NETNS_IP2=$NETNS_NET.2
NETNS_IF=kiln0
NETNS1=kiln-h1-$$
NETNS2=kiln-h2-$$
NETNS_DIR=
NETNS_ERR=
NETNS_SKIP=0

netns_hosts_down() {
  local ns pid
  for ns in "$NETNS1" "$NETNS2"; do
    if [ -e "/var/run/netns/$ns" ]; then
      # Processes started there (a daemon left over after a timeout) keep the namespace alive
      # after its name is gone; deleting it also removes the veth.
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
  return 0
}

netns_hosts_up() {
  NETNS_DIR=$1
  NETNS_SKIP=0
  if [ "$(id -u)" -ne 0 ]; then
    NETNS_ERR="not root (creating network namespaces needs it)"
    NETNS_SKIP=1
    return 1
  fi
  if ! command -v ip >/dev/null 2>&1; then
    NETNS_ERR="ip not found (scripts/install-deps installs iproute2)"
    NETNS_SKIP=1
    return 1
  fi
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^kiln-h[12]-[0-9]+$/ { print $1 }'); do
    kill -0 "${ns##*-}" 2>/dev/null || ip netns del "$ns" 2>/dev/null || true
  done
  if ! NETNS_ERR=$(ip netns add "$NETNS1" 2>&1); then
    NETNS_ERR="cannot create a network namespace (ip netns add: $NETNS_ERR)"
    NETNS_SKIP=1
    return 1
  fi
  if ! NETNS_ERR=$({
    ip netns add "$NETNS2" &&
      ip link add "$NETNS_IF" netns "$NETNS1" type veth peer name "$NETNS_IF" netns "$NETNS2" &&
      ip -n "$NETNS1" addr add "$NETNS_IP1/24" dev "$NETNS_IF" &&
      ip -n "$NETNS2" addr add "$NETNS_IP2/24" dev "$NETNS_IF" &&
      for ns in "$NETNS1" "$NETNS2"; do
        ip -n "$ns" link set lo up && ip -n "$ns" link set "$NETNS_IF" up || exit 1
      done
  } 2>&1); then
    NETNS_ERR="setting up the two hosts: $NETNS_ERR"
    return 1
  fi
  # The agent as a file of its own, executable whatever the checkout did with its mode.
  cp "$(dirname "${BASH_SOURCE[0]}")/netns-agent.sh" "$NETNS_DIR/agent.sh" &&
    chmod +x "$NETNS_DIR/agent.sh" &&
    printf '%s slots=1\n%s slots=1\n' "$NETNS_IP1" "$NETNS_IP2" > "$NETNS_DIR/hostfile" || {
    NETNS_ERR="cannot write the agent and the hostfile into $NETNS_DIR"
    return 1
  }
  # How the agent finds a host's namespace and name; mpirun's environment reaches it.
  export KILN_NETNS_HOSTS="$NETNS_IP1=$NETNS1:kiln-host1 $NETNS_IP2=$NETNS2:kiln-host2"
}

netns_on_hosts() {
  timeout -k 5 "${NETNS_TIMEOUT:-120}" ip netns exec "$NETNS1" unshare --uts \
    bash -c 'hostname kiln-host1 && exec "$@"' - \
    mpirun -np 2 --hostfile "$NETNS_DIR/hostfile" --mca plm_rsh_agent "$NETNS_DIR/agent.sh" \
    --mca pml ob1 --mca btl "${BTL:-self,tcp}" \
    --mca btl_tcp_if_include "$NETNS_NET.0/24" --mca oob_tcp_if_include "$NETNS_NET.0/24" \
    --allow-run-as-root --oversubscribe --bind-to none "$@" &
  wait $!
}

netns_counters() {
  ip netns exec "$NETNS2" cat "/sys/class/net/$NETNS_IF/statistics/rx_bytes" \
    "/sys/class/net/$NETNS_IF/statistics/tx_bytes" | paste -sd ' '
}
