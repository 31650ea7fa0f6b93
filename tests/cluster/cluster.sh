#!/usr/bin/env bash
# A multi-node cluster on this one machine, for tests and by hand (docs/slurm.md):
#   cluster.sh up N           N nodes (1-16): a network namespace each, with its own hostname,
#                             an address on a private subnet, a veth to a bridge; a private Slurm
#                             (slurmctld in a namespace of its own, one slurmd per node, munge)
#   cluster.sh down           stop and remove everything `up` made, also a half-made cluster
#   cluster.sh status         nodes, links, daemons, Slurm's view
#   cluster.sh env            `export` lines for Slurm clients and mpirun across nodes
#   cluster.sh exec NODE CMD  run CMD on NODE (n1, n2, ..., ctl; `login` is the root namespace)
#   cluster.sh kill NODE      a node dies: its link goes down, every process on it is killed
#   cluster.sh cut NODE       its link goes down; its processes live on
#   cluster.sh heal NODE      link up again; a killed node's slurmd starts again
#   cluster.sh shape RATE|off tc tbf of RATE (e.g. 1gbit) on both ends of every node's link
#
# Environment: TESSERA_CLUSTER (the cluster's name, default tc: namespaces, links and hostnames
# are <name>-n1, <name>-ctl, ...), TESSERA_CLUSTER_SUBNET (the first three octets of its /24,
# default 10.77.0), TESSERA_CLUSTER_OWNER (recorded in the state, default "<user> by hand").
# Clusters of different names and subnets may be up at once; each one's state (munge key and
# socket, slurm.conf, spool, logs) is in /tmp/tessera-cluster.<name>.
#
# Shared between nodes, as on a real cluster's shared file system: files (/tmp, the build, runs),
# /dev/shm, the process space, the CPUs. Nothing in a node can reach beyond the subnet: no default
# route. Needs root, iproute2, util-linux (nsenter, unshare), munge and Slurm (tools/setup.sh).
# Exit codes: 0 done, 1 failed, 2 bad usage, 3 this machine cannot run a cluster (the reason is
# printed: no root, a missing program, namespaces refused), 4 (up) a cluster of that name exists.
set -euo pipefail

readonly name=${TESSERA_CLUSTER:-tc}
readonly subnet=${TESSERA_CLUSTER_SUBNET:-10.77.0}
readonly dir=/tmp/tessera-cluster.$name
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly here
readonly bridge=$name-br
readonly max_nodes=16

die() {
  echo "cluster: $*" >&2
  exit 1
}
usage() {
  echo "cluster: $*" >&2
  echo "usage: cluster.sh up N | down | status | env | exec NODE CMD... | kill NODE | cut NODE | heal NODE | shape RATE|off" >&2
  exit 2
}
cannot() {
  echo "cluster: cannot run here: $*" >&2
  exit 3
}
[[ $name =~ ^[a-z][a-z0-9]{0,5}$ ]] || usage "TESSERA_CLUSTER=$name: expected 1-6 lower-case letters or digits, a letter first"
[[ $subnet =~ ^10\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || usage "TESSERA_CLUSTER_SUBNET=$subnet: expected 10.X.Y"

# --- Names --------------------------------------------------------------------------------------
node_name() { echo "$name-n$1"; }
node_addr() { echo "$subnet.$((10 + $1))"; }
readonly ctl=$name-ctl ctl_addr=$subnet.2 login_addr=$subnet.1
# The nodes of the cluster that is up (from its state), one per line.
nodes() { [[ -f $dir/nodes ]] && cat "$dir/nodes"; }
# NODE as given on the command line (n2, <name>-n2, ctl) -> its namespace name.
resolve() {
  local node=$1
  [[ $node == ctl || $node =~ ^n[0-9]+$ ]] && node=$name-$node
  [[ $node == "$ctl" ]] || grep -qx -- "$node" "$dir/nodes" 2>/dev/null ||
    usage "no node '$1' in cluster $name (nodes: $(nodes | tr '\n' ' '))"
  echo "$node"
}
in_node() {
  local node=$1
  shift
  nsenter --net="/run/netns/$node" --uts="$dir/uts/$node" -- "$@"
}

# --- Environment of every command run in the cluster ---------------------------------------------
write_env() {
  cat >"$dir/env" <<EOF
export TESSERA_CLUSTER=$name TESSERA_CLUSTER_DIR=$dir
export SLURM_CONF=$dir/etc/slurm.conf
export OMPI_MCA_plm_rsh_agent=$here/node-rsh.sh
export OMPI_MCA_btl=vader,tcp,self
export OMPI_MCA_btl_tcp_if_include=$subnet.0/24 OMPI_MCA_oob_tcp_if_include=$subnet.0/24
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Ranks that share cores (every node shares the machine's) must yield while they wait.
export OMPI_MCA_mpi_yield_when_idle=1
# Slurm's PMIx fence as a ring: with its default, 13 of 140 srun --mpi=pmix launches of a bare
# MPI_Init + MPI_Allreduce program on 4 nodes x 2 ranks had a rank die of SIGSEGV in MPI_Init
# (Open MPI 4.1.4's TCP BTL got a message before its PML was ready: a peer had left the closing
# barrier early); with the ring, 0 of 180 (docs/slurm.md).
export SLURM_PMIX_FENCE=ring
EOF
}

# --- Bring-up -------------------------------------------------------------------------------------
check_prerequisites() {
  [[ $(id -u) -eq 0 ]] || cannot "needs root (network namespaces, Slurm's daemons)"
  local missing=() cmd
  for cmd in ip tc nsenter unshare flock findmnt setsid ps getent munged mungekey munge slurmctld slurmd sinfo \
    scontrol; do
    command -v "$cmd" >/dev/null || missing+=("$cmd")
  done
  ((${#missing[@]} == 0)) ||
    cannot "not installed: ${missing[*]} (tools/setup.sh installs iproute2, procps, util-linux, munge, Slurm)"
}

# A namespace with its own hostname, joined to the bridge: make_node NAME ADDRESS.
make_node() {
  local node=$1 addr=$2
  ip netns add "$node" || cannot "ip netns add $node failed (network namespaces refused?)"
  # The host end carries the node's name; the node sees eth0.
  ip link add "$node" type veth peer name eth0 netns "$node"
  ip link set "$node" master "$bridge" up
  ip -n "$node" addr add "$addr/24" dev eth0
  ip -n "$node" link set eth0 up
  ip -n "$node" link set lo up
  # A persistent UTS namespace: without it every node has the machine's hostname, slurmd cannot
  # tell which node it is and Open MPI's shared-memory segments of two nodes collide.
  touch "$dir/uts/$node"
  unshare --uts="$dir/uts/$node" hostname "$node"
}

# The marked block of /etc/hosts for this cluster (written in place: /etc/hosts may be a mount).
hosts_block() {
  echo "# BEGIN tessera-cluster $name"
  echo "$login_addr $name-login"
  echo "$ctl_addr $ctl"
  local node i=1
  for node in $(nodes); do
    echo "$(node_addr "$i") $node"
    i=$((i + 1))
  done
  echo "# END tessera-cluster $name"
}
remove_hosts_block() {
  grep -q "^# BEGIN tessera-cluster $name\$" /etc/hosts || return 0
  local kept
  kept=$(sed "/^# BEGIN tessera-cluster $name\$/,/^# END tessera-cluster $name\$/d" /etc/hosts)
  printf '%s\n' "$kept" >/etc/hosts
}

start_munge() {
  mkdir -p "$dir/munge"
  chmod 700 "$dir/munge"
  mungekey --create --keyfile="$dir/munge/munge.key" --bits=1024 --force
  chmod 600 "$dir/munge/munge.key"
  munged --force --socket="$dir/munge/socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed" || cannot "munged does not start: $(tail -n 2 "$dir/log/munged.log")"
}

write_slurm_conf() {
  local n=$1 i node list
  list=$(nodes | paste -sd, -)
  {
    cat <<EOF
# A private cluster made by tests/cluster/cluster.sh; removed by \`cluster.sh down\`.
ClusterName=tessera-$name
SlurmctldHost=$ctl($ctl_addr)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also holds a requeued job that long before it starts again (default 120 s).
AuthInfo=socket=$dir/munge/socket,cred_expire=10
StateSaveLocation=$dir/state
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdSpoolDir=$dir/spool/%n
SlurmdPidFile=$dir/run/slurmd.%n.pid
SlurmdLogFile=$dir/log/slurmd.%n.log
# Slurm's PMIx plugin puts a step's directory in TmpFS under a name without the node: one
# directory per node, or the second node of a step fails ("pmixp_mkdir: ... File exists").
TmpFS=$dir/tmpfs/%n
SlurmdParameters=config_overrides
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
MpiDefault=none
# A node that did not answer for SlurmdTimeout s is DOWN; its jobs are requeued (JobRequeue,
# --requeue) and it returns to service when its slurmd registers again (ReturnToService=2).
SlurmdTimeout=10
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=300
InactiveLimit=0
EOF
    i=1
    for node in $(nodes); do
      echo "NodeName=$node NodeAddr=$(node_addr "$i") CPUs=$cpus RealMemory=1000 State=UNKNOWN"
      i=$((i + 1))
    done
    echo "PartitionName=cluster Nodes=$list Default=YES MaxTime=INFINITE State=UP"
  } >"$dir/etc/slurm.conf"
}

# Starts a daemon in node NODE's namespaces: its pid (after exec, the daemon's) in run/NAME.pid.
# setsid: the daemon outlives this script and its terminal.
start_daemon() {
  local node=$1 label=$2
  shift 2
  setsid nsenter --net="/run/netns/$node" --uts="$dir/uts/$node" -- "$@" \
    >"$dir/log/$label.out" 2>&1 </dev/null &
  echo $! >"$dir/run/$label.pid"
}
start_slurmd() {
  local node=$1
  mkdir -p "$dir/spool/$node" "$dir/tmpfs/$node"
  start_daemon "$node" "slurmd.$node" slurmd -D -N "$node" -f "$dir/etc/slurm.conf"
}

# Every node of the cluster is idle in Slurm's view (or $1 nodes are, when given).
all_idle() {
  local want=${1:-$(nodes | wc -l)}
  [[ $(SLURM_CONF=$dir/etc/slurm.conf sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l) -eq $want ]]
}
# Process $1 lives; a zombie does not (the daemons outlive this script: init reaps them).
alive() { [[ -n $1 ]] && kill -0 "$1" 2>/dev/null && [[ $(ps -o stat= -p "$1" 2>/dev/null) != Z* ]]; }
wait_for() {
  local seconds=$1
  shift
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

# Test hook (tests/cluster/test_harness.sh): TESSERA_CLUSTER_TEST_KILL_AT=STAGE kills `up` with
# SIGKILL at that stage (namespaces, daemons), as an interrupted test would, leaving a half-made
# cluster for `down`.
test_kill_at() {
  [[ ${TESSERA_CLUSTER_TEST_KILL_AT:-} == "$1" ]] && kill -KILL $$
  return 0
}

up() {
  local n=${1:-}
  if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > max_nodes)); then usage "up N: N from 1 to $max_nodes nodes"; fi
  check_prerequisites
  # mkdir claims the name: of two `up`s of one name at once, the second stops here.
  if ip link show "$bridge" >/dev/null 2>&1 || ! mkdir "$dir" 2>/dev/null; then
    echo "cluster: $name is up or half-made ($dir): run cluster.sh down first, or choose another TESSERA_CLUSTER" >&2
    exit 4
  fi
  # A failure half-way leaves a half-made cluster: tear it down and say why.
  trap 'rc=$?; if ((rc != 0)); then echo "cluster: up failed; tearing down" >&2; down >/dev/null 2>&1 || true; fi' EXIT
  if ip -4 -o addr show | grep -q " $subnet\."; then
    cannot "the subnet $subnet.0/24 is in use here; choose another with TESSERA_CLUSTER_SUBNET"
  fi
  local start=$SECONDS i
  mkdir -p "$dir"/{uts,etc,log,run,state,spool,tmpfs}
  chmod 755 "$dir"
  for ((i = 1; i <= n; i++)); do node_name "$i"; done >"$dir/nodes"
  # Who made it (tests: their work directory), for tests/cluster/cleanup.sh.
  echo "${TESSERA_CLUSTER_OWNER:-$(id -un) by hand}" >"$dir/owner"
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)

  # The bridge, with the root namespace as the login node on it.
  ip link add "$bridge" type bridge || cannot "ip link add $bridge type bridge failed"
  ip addr add "$login_addr/24" dev "$bridge"
  ip link set "$bridge" up
  {
    # Under one lock with every other cluster's: /run/netns and /etc/hosts are shared.
    flock 9
    make_node "$ctl" "$ctl_addr"
    for ((i = 1; i <= n; i++)); do make_node "$(node_name "$i")" "$(node_addr "$i")"; done
    remove_hosts_block
    hosts_block >>/etc/hosts
  } 9</run
  test_kill_at namespaces

  start_munge
  write_slurm_conf "$n"
  write_env
  start_daemon "$ctl" slurmctld slurmctld -D -i -f "$dir/etc/slurm.conf"
  for node in $(nodes); do start_slurmd "$node"; done
  test_kill_at daemons
  if ! wait_for 60 all_idle; then
    tail -n 5 "$dir"/log/*.log >&2 || true
    die "the nodes did not become idle within 60 s ($(SLURM_CONF=$dir/etc/slurm.conf sinfo -h -N -o '%N %T' 2>&1 | paste -sd' ' -))"
  fi
  trap - EXIT
  echo "cluster: $name up in $((SECONDS - start)) s: $n nodes ($(nodes | paste -sd' ' -)) on $subnet.0/24," \
    "$cpus CPUs each (shared), Slurm $(slurmd -V | cut -d" " -f2); state in $dir"
  local prefix=
  [[ $name == tc ]] || prefix="TESSERA_CLUSTER=$name "
  echo "cluster: use it with: eval \"\$(${prefix}$here/cluster.sh env)\""
}

# --- Tear-down: idempotent, and whatever state a failed `up` or a killed test left -----------------
# Namespaces of this cluster that exist (from /run/netns: also those the state does not list).
our_namespaces() {
  ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^$name-(ctl|n[0-9]+)\$" || true
}
# Ends every process in the namespaces of this cluster: slurmd, slurmstepd, ranks, orted.
kill_namespace_processes() {
  local signal=$1 ns pids=()
  shift
  for ns in "$@"; do
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
    ((${#pids[@]})) && kill "-$signal" "${pids[@]}" 2>/dev/null
  done
  return 0
}
namespaces_empty() {
  local ns
  for ns in "$@"; do [[ -z $(ip netns pids "$ns" 2>/dev/null) ]] || return 1; done
}
# Shared-memory segments and session directories Open MPI leaves behind for host $1 when its
# processes are killed.
remove_mpi_leftovers() {
  local host=$1
  rm -rf /dev/shm/vader_segment."$host".* /tmp/ompi."$host".* /dev/shm/sm_segment."$host".* 2>/dev/null || true
}

down() {
  local namespaces=() ns pid
  mapfile -t namespaces < <(our_namespaces)
  # Daemons first (slurmctld, so no job is started anew), then every process in every node.
  for pid in "$dir"/run/*.pid "$dir/munge/munged.pid"; do
    if [[ -f $pid ]]; then kill "$(cat "$pid")" 2>/dev/null || true; fi
  done
  if ((${#namespaces[@]})); then
    kill_namespace_processes TERM "${namespaces[@]}"
    wait_for 10 namespaces_empty "${namespaces[@]}" || kill_namespace_processes KILL "${namespaces[@]}"
    wait_for 5 namespaces_empty "${namespaces[@]}" || true
  fi
  {
    flock 9
    for ns in "${namespaces[@]}"; do
      ip netns del "$ns" 2>/dev/null || true
      # A deleted namespace's veth may outlive it for a moment: delete the host end explicitly.
      ip link del "$ns" 2>/dev/null || true
    done
    # `ip netns add` bind-mounts /run/netns on itself; the last namespace gone, that goes too.
    if [[ -d /run/netns && -z $(ls -A /run/netns) ]] && findmnt -n /run/netns >/dev/null; then
      umount /run/netns && rmdir /run/netns
    fi
    remove_hosts_block
  } 9</run
  # Host ends of nodes whose namespace was already gone, the bridge, Open MPI's leftovers.
  local link
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{ print $2 }' | cut -d@ -f1 | grep -E "^$name-(ctl|n[0-9]+)\$"); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  for ns in "${namespaces[@]}" $(nodes); do remove_mpi_leftovers "$ns"; done
  # The persistent UTS namespaces are bind mounts on files in the state directory.
  local mount
  for mount in $(findmnt -rn -o TARGET 2>/dev/null | grep "^$dir/" || true); do
    umount -l "$mount" 2>/dev/null || true
  done
  rm -rf "$dir"
  echo "cluster: $name down"
}

# --- By hand and in tests ---------------------------------------------------------------------------
status() {
  [[ -f $dir/nodes ]] || {
    echo "cluster: $name is not up"
    [[ -z $(our_namespaces) ]] || echo "cluster: but namespaces of it exist: $(our_namespaces | paste -sd' ' -) (cluster.sh down)"
    return 1
  }
  local node state pid i=1
  printf '%-10s %-12s %-6s %s\n' node address link slurmd
  for node in $(nodes); do
    state=$(ip -o link show "$node" 2>/dev/null | grep -q 'state UP' && echo up || echo down)
    pid=$(cat "$dir/run/slurmd.$node.pid" 2>/dev/null || true)
    printf '%-10s %-12s %-6s %s\n' "$node" "$(node_addr "$i")" "$state" \
      "$(alive "$pid" && echo "pid $pid" || echo "not running")"
    i=$((i + 1))
  done
  SLURM_CONF=$dir/etc/slurm.conf sinfo -N -o '%N %T %E' 2>&1 || true
}

run_in() {
  local node=$1
  shift
  (($#)) || usage "exec NODE CMD: no command"
  [[ -f $dir/env ]] || die "cluster $name is not up"
  # shellcheck source=/dev/null
  source "$dir/env"
  if [[ $node == login ]]; then
    exec "$@"
  fi
  node=$(resolve "$node")
  exec nsenter --net="/run/netns/$node" --uts="$dir/uts/$node" -- "$@"
}

link() {
  local node=$1 state=$2
  ip link set "$node" "$state"
  ip -n "$node" link set eth0 "$state"
}

# Every process of node $1 is sent SIGKILL (again: one forked since the last look is new); none left.
killed() { kill_namespace_processes KILL "$1" && namespaces_empty "$1"; }
kill_node() {
  local node
  node=$(resolve "$1")
  link "$node" down
  # A loaded machine may take seconds to finish the exits; a process survives SIGKILL only if it
  # was forked after the list was taken, so each look kills again.
  wait_for 30 killed "$node" || die "processes of $node survived SIGKILL for 30 s"
  echo "cluster: $node killed (link down, every process on it killed)"
}

heal_node() {
  local node pid
  node=$(resolve "$1")
  link "$node" up
  pid=$(cat "$dir/run/slurmd.$node.pid" 2>/dev/null || true)
  if ! alive "$pid"; then
    # A node that died restarts clean: what its killed ranks left in /dev/shm and /tmp goes.
    remove_mpi_leftovers "$node"
    start_slurmd "$node"
    echo "cluster: $node healed (link up, slurmd started again)"
  else
    echo "cluster: $node healed (link up)"
  fi
}

shape() {
  local rate=$1 node
  [[ $rate == off || $rate =~ ^[0-9]+(k|m|g)?bit$ ]] || usage "shape RATE: e.g. 1gbit, 500mbit, or off"
  for node in $(nodes); do
    if [[ $rate == off ]]; then
      tc qdisc del dev "$node" root 2>/dev/null || true
      tc -n "$node" qdisc del dev eth0 root 2>/dev/null || true
    else
      # Both directions: the host end shapes what the node receives, eth0 what it sends.
      tc qdisc replace dev "$node" root tbf rate "$rate" burst 256kb latency 50ms
      tc -n "$node" qdisc replace dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
    fi
  done
  echo "cluster: links of $name shaped: $rate"
}

command=${1:-}
shift || true
case $command in
  up) up "$@" ;;
  down) down ;;
  status) status ;;
  env)
    [[ -f $dir/env ]] || die "cluster $name is not up"
    cat "$dir/env"
    ;;
  exec)
    (($# >= 1)) || usage "exec NODE CMD"
    run_in "$@"
    ;;
  kill | cut | heal)
    (($# == 1)) || usage "$command NODE"
    [[ -f $dir/nodes ]] || die "cluster $name is not up"
    case $command in
      kill) kill_node "$1" ;;
      cut) link "$(resolve "$1")" down && echo "cluster: $1 cut off (link down, processes live)" ;;
      heal) heal_node "$1" ;;
    esac
    ;;
  shape)
    (($# == 1)) || usage "shape RATE"
    [[ -f $dir/nodes ]] || die "cluster $name is not up"
    shape "$1"
    ;;
  *) usage "unknown command '${command}'" ;;
esac
