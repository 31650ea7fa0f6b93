#!/usr/bin/env bash
# Open MPI's rsh agent for a cluster of tests/cluster/cluster.sh (OMPI_MCA_plm_rsh_agent, set by
# `cluster.sh env`): Open MPI calls it as `node-rsh.sh [options] HOST COMMAND...`, as it would
# call ssh; it runs COMMAND through /bin/sh in HOST's namespaces (network and hostname).
# HOST is a node's name or address. Needs TESSERA_CLUSTER_DIR (from `cluster.sh env`).
#
# It behaves as ssh does when the node dies: the nodes share this machine's process space, so
# the remote command is this script's own child, and its death would otherwise tell mpirun at
# once what ssh to a dead host never tells it. When the command ends while HOST's link is down
# (cluster.sh kill or cut), this script does not return while its caller lives.
set -euo pipefail
: "${TESSERA_CLUSTER_DIR:?node-rsh.sh: TESSERA_CLUSTER_DIR is not set (eval \"\$(cluster.sh env)\")}"
while (($#)) && [[ $1 == -* ]]; do shift; done
host=${1:?node-rsh.sh: no host}
shift
# An address -> the node's name, from the cluster's block in /etc/hosts.
if [[ $host =~ ^[0-9.]+$ ]]; then
  host=$(awk -v a="$host" '$1 == a { print $2; exit }' /etc/hosts)
fi
host=${host%%.*}
uts=$TESSERA_CLUSTER_DIR/uts/$host
[[ -e /run/netns/$host && -e $uts ]] || {
  echo "node-rsh.sh: no node '$host' in the cluster of $TESSERA_CLUSTER_DIR" >&2
  exit 255
}
nsenter --net="/run/netns/$host" --uts="$uts" -- /bin/sh -c "$*" &
child=$!
# Ending this "connection" ends the remote command, as sshd does when its client goes.
trap 'kill -TERM "$child" 2>/dev/null' TERM INT HUP
while :; do
  status=0
  # (Quiet: bash would report the remote command's death by SIGKILL on mpirun's stderr.)
  { wait "$child" || status=$?; } 2>/dev/null
  kill -0 "$child" 2>/dev/null || break
done
# The host end of the node's veth, seen from the root namespace's sysfs in every namespace.
# It waits as long as whoever called it (mpirun or an orted) lives.
if [[ $(cat "/sys/class/net/$host/operstate" 2>/dev/null) != up ]]; then
  while kill -0 "$PPID" 2>/dev/null; do sleep 1; done
  exit 255
fi
exit "$status"
