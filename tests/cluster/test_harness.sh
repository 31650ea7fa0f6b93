#!/usr/bin/env bash
# The cluster harness itself (cluster.sh), on 4 nodes:
#   a) up: each node has its own hostname and address, resolves the others' names, reaches them,
#      has no route beyond the subnet; Slurm sees 4 idle nodes; mpirun (from the login namespace
#      and from inside a node, through the rsh agent) and srun place one process on each node;
#   b) a second `up` of the same name is refused (exit 4) and leaves the first cluster working;
#   c) kill, cut, heal and shape do what they say;
#   d) down removes everything (namespaces, links, /etc/hosts block, mounts, state, daemons,
#      Open MPI's leftovers) and is idempotent;
#   e) `up` killed half-way (TESSERA_CLUSTER_TEST_KILL_AT: after the namespaces; after the
#      daemons started) leaves a half-made cluster that down removes as completely.
# Prints the bring-up and tear-down times.
set -euo pipefail
# shellcheck source=tests/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

t0=$(now)
cluster_up 4
t1=$(now)
say "a) up 4 in $(elapsed "$t0" "$t1") s"
name=$TESSERA_CLUSTER
dir=$TESSERA_CLUSTER_DIR

# --- a) what a node is ------------------------------------------------------------------------------
for i in 1 2 3 4; do
  [[ $("$cluster_sh" exec "n$i" hostname) == "$(node "$i")" ]] || fail "n$i's hostname is not $(node "$i")"
  [[ $("$cluster_sh" exec "n$i" ip -4 -o addr show eth0) == *" $TESSERA_CLUSTER_SUBNET.$((10 + i))/24 "* ]] ||
    fail "n$i has not the address $TESSERA_CLUSTER_SUBNET.$((10 + i))"
done
[[ -z $("$cluster_sh" exec n1 ip route show default) ]] || fail "n1 has a default route"
# A route lookup sends nothing: beyond the subnet there is no way out.
"$cluster_sh" exec n1 ip route get 192.0.2.1 >/dev/null 2>&1 && fail "n1 has a route to 192.0.2.1"
[[ $("$cluster_sh" exec n1 getent hosts "$(node 4)") == "$TESSERA_CLUSTER_SUBNET.14 "* ]] ||
  fail "n1 does not resolve $(node 4)"
# n4's slurmd listens in n4's namespace: n1 reaches it across the bridge.
reach() { "$cluster_sh" exec "$1" timeout 5 bash -c "exec 3<>/dev/tcp/$2/6818" 2>/dev/null; }
reach n1 "$(node 4)" || fail "n1 cannot reach $(node 4)'s slurmd"
[[ $(sinfo -h -N -t idle -o %N | sort -u | paste -sd' ' -) == "$(node 1) $(node 2) $(node 3) $(node 4)" ]] ||
  fail "Slurm does not see 4 idle nodes: $(sinfo -h -N -o '%N %T' | paste -sd' ' -)"
expected_hosts=$(printf '%s\n' "$(node 1)" "$(node 2)" "$(node 3)" "$(node 4)")
hosts=$(mpirun -n 4 --map-by node --host "$(node 1),$(node 2),$(node 3),$(node 4)" hostname | sort)
[[ $hosts == "$expected_hosts" ]] || fail "mpirun from the login namespace ran on: $(paste -sd' ' <<<"$hosts")"
printf '%s slots=1\n' "$(node 1)" "$(node 2)" "$(node 3)" "$(node 4)" >"$WORK_DIR/hostfile"
hosts=$("$cluster_sh" exec n2 mpirun -n 4 --map-by node --hostfile "$WORK_DIR/hostfile" hostname | sort)
[[ $hosts == "$expected_hosts" ]] || fail "mpirun from inside n2 ran on: $(paste -sd' ' <<<"$hosts")"
hosts=$(srun -N 4 hostname | sort)
[[ $hosts == "$expected_hosts" ]] || fail "srun -N 4 ran on: $(paste -sd' ' <<<"$hosts")"
say "a) passed: hostnames, addresses, no way out, names, Slurm, mpirun (login, node) and srun on 4 nodes"

# --- b) one name, one cluster --------------------------------------------------------------------------
status=0
"$cluster_sh" up 2 >"$WORK_DIR/second-up.txt" 2>&1 || status=$?
((status == 4)) || fail "a second up of $name exited $status, not 4: $(cat "$WORK_DIR/second-up.txt")"
wait_for 30 all_idle || fail "the second up disturbed the first cluster: $(sinfo -h -N -o '%N %T' | paste -sd' ' -)"
say "b) passed: a second up of $name refused with exit 4, the first cluster untouched"

# --- c) kill, cut, heal, shape -------------------------------------------------------------------------
"$cluster_sh" exec n3 sleep 300 &
sleeper=$!
has_processes() { [[ -n $(ip netns pids "$1") ]]; }
wait_for 10 has_processes "$(node 3)" || fail "no process in n3"
slurmd3=$(cat "$dir/run/slurmd.$(node 3).pid")
"$cluster_sh" kill n3
alive "$slurmd3" && fail "n3's slurmd survived cluster.sh kill"
wait "$sleeper" 2>/dev/null && fail "the process on n3 survived cluster.sh kill"
[[ -z $(ip netns pids "$(node 3)") ]] || fail "processes survived on n3"
reach n1 "$(node 3)" && fail "n1 still reaches the killed n3"
"$cluster_sh" heal n3
# heal restarts n3's slurmd: seconds on a loaded machine before it listens.
wait_for 30 reach n1 "$(node 3)" || fail "n1 does not reach n3's slurmd after heal"
node3_idle() { [[ $(sinfo -h -n "$(node 3)" -o %T) == idle ]]; }
wait_for 60 node3_idle || fail "n3 did not return to idle after heal: $(sinfo -h -n "$(node 3)" -o '%T %E')"
"$cluster_sh" cut n2
reach n1 "$(node 2)" && fail "n1 still reaches n2 after cut"
[[ -n $(ip netns pids "$(node 2)") ]] || fail "cut killed n2's processes"
"$cluster_sh" heal n2
wait_for 30 reach n1 "$(node 2)" || fail "n1 does not reach n2 after heal"
"$cluster_sh" shape 1gbit
for i in 1 4; do
  tc qdisc show dev "$(node "$i")" | grep -q 'tbf .*rate 1Gbit' || fail "no 1 Gbit/s tbf on the host end of n$i"
  "$cluster_sh" exec "n$i" tc qdisc show dev eth0 | grep -q 'tbf .*rate 1Gbit' || fail "no 1 Gbit/s tbf in n$i"
done
"$cluster_sh" shape off
tc qdisc show dev "$(node 1)" | grep -q tbf && fail "shape off left a tbf on n1"
say "c) passed: kill (link down, every process gone), heal (slurmd back, idle), cut (processes live), shape"

# --- d) down leaves nothing --------------------------------------------------------------------------
# Open MPI's leftovers of a node killed mid-run, as a crash leaves them.
touch "/dev/shm/vader_segment.$(node 1).test.0" "/tmp/ompi.$(node 1).0-leftover"
daemon_pids=$(cat "$dir"/run/*.pid "$dir/munge/munged.pid")
nothing_left() {
  local what=$1
  [[ -z $(ip netns list | grep -E "^$name-" || true) ]] || fail "$what: namespaces left: $(ip netns list | grep "^$name-" | paste -sd' ' -)"
  [[ -z $(ip -o link show | grep -E ": $name-" || true) ]] || fail "$what: links left"
  grep -q "tessera-cluster $name\$" /etc/hosts && fail "$what: its block in /etc/hosts is left"
  [[ -z $(findmnt -rn -o TARGET | grep "^$dir/" || true) ]] || fail "$what: mounts under $dir left"
  [[ ! -e $dir ]] || fail "$what: $dir left"
  compgen -G "/dev/shm/vader_segment.$name-*" >/dev/null && fail "$what: vader segments left in /dev/shm"
  compgen -G "/tmp/ompi.$name-*" >/dev/null && fail "$what: Open MPI session directories left in /tmp"
  local pid
  for pid in ${2:-}; do
    if alive "$pid"; then fail "$what: daemon $pid left"; fi
  done
  return 0
}
t0=$(now)
"$cluster_sh" down
t1=$(now)
say "d) down in $(elapsed "$t0" "$t1") s"
nothing_left "down" "$daemon_pids"
"$cluster_sh" down >/dev/null || fail "a second down failed"
"$cluster_sh" status >/dev/null && fail "status says a cluster that is down is up"
say "d) passed: down left nothing; a second down is fine"

# --- e) a half-made cluster ----------------------------------------------------------------------------
for stage in namespaces daemons; do
  status=0
  TESSERA_CLUSTER_TEST_KILL_AT=$stage "$cluster_sh" up 3 >"$WORK_DIR/half-up.txt" 2>&1 || status=$?
  ((status == 137)) || fail "up with TESSERA_CLUSTER_TEST_KILL_AT=$stage exited $status: $(cat "$WORK_DIR/half-up.txt")"
  [[ -e /run/netns/$name-n3 ]] || fail "up killed at $stage: no namespace $name-n3 was made"
  daemon_pids=$(cat "$dir"/run/*.pid "$dir/munge/munged.pid" 2>/dev/null || true)
  [[ $stage == namespaces || -n $daemon_pids ]] || fail "up killed at $stage: no daemon had started"
  "$cluster_sh" down >/dev/null
  nothing_left "down after up killed at $stage" "$daemon_pids"
done
say "e) passed: down removes a cluster whose up was killed after the namespaces or the daemons"
unset TESSERA_CLUSTER_DIR
echo "PASS: cluster harness, $((SECONDS - start_time)) s"
