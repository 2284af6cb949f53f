#!/bin/bash
# A stand-in for ssh, for Open MPI's rsh launcher (`mpirun --mca plm_rsh_agent THIS_SCRIPT`):
# Open MPI calls it as `AGENT HOST COMMAND...`, where COMMAND is a shell command line in words
# (`PATH=...; export PATH; ... orted -mca ...`), as it would hand it to ssh. The "host" is a
# network namespace on this machine: KILN_NETNS_HOSTS maps host names (the names in the
# hostfile, here IP addresses) to namespaces and host names, "HOST=NAMESPACE:HOSTNAME ..."
# (":HOSTNAME" optional). The command runs in that namespace, in a UTS namespace of its own
# with that host name when one is given (so that each "host" has its own name, as real hosts do),
# through a login-less bash, as ssh would run it. KILN_NETNS_LOCAL_DIR, when set, names a
# directory that stays local to mpirun's own host: the hosts started here see an empty tmpfs in
# its place (a mount namespace of their own), as hosts without a shared file system would.
# Used by tests/cli/mpi_two_hosts.sh.
set -u
host=${1:?usage: netns-agent.sh HOST COMMAND...}
shift
[ $# -gt 0 ] || { echo "netns-agent.sh: no command for $host" >&2; exit 255; }
ns= name=
for entry in ${KILN_NETNS_HOSTS:-}; do
  if [ "${entry%%=*}" = "$host" ]; then
    ns=${entry#*=}
    name=
    case $ns in *:*) name=${ns#*:} ns=${ns%%:*} ;; esac
  fi
done
if [ -z "$ns" ]; then
  echo "netns-agent.sh: no namespace for host '$host' in KILN_NETNS_HOSTS='${KILN_NETNS_HOSTS:-}'" >&2
  exit 255  # what ssh returns when it cannot reach the host
fi
local_dir=${KILN_NETNS_LOCAL_DIR:-}
if [ -n "$name" ] || [ -n "$local_dir" ]; then
  # "$*": ssh, too, joins its words with spaces for the remote shell.
  exec ip netns exec "$ns" unshare --uts ${local_dir:+--mount} bash -c '
    { [ -z "$0" ] || hostname "$0"; } &&
      { [ -z "$2" ] || mount -t tmpfs kiln-not-shared "$2"; } && exec bash -c "$1"' \
    "$name" "$*" "$local_dir"
fi
exec ip netns exec "$ns" bash -c "$*"
