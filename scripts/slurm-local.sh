#!/usr/bin/env bash
# A real two-node SLURM on this machine, for the test suite: Debian's slurm-wlm (22.05 on Debian
# 12) with munge, slurmctld and two slurmd as root, every job on this host. The suite's SLURM
# tests (tests/slurm_local.py) submit real jobs to it; scripts/test.sh starts it before pytest.
#
# The two nodes: the first is named after this host (`hostname -s`), the second the same with
# "-2" (vm and vm-2), each with its own slurmd (`slurmd -N NAME`: Debian's build has no
# --enable-multiple-slurmd, but -N picks the node in any build) on its own port (6818, 6828), both
# at 127.0.0.1. A job of one node runs on the first while it has CPUs (Weight), so the suite's
# one-node jobs see this host's name; `--nodes=2` spreads a job's tasks over both, as over two
# machines. A node name must resolve (rank 0's host is taken from the job's node list and
# connected to): one that does not gets a 127.0.0.1 line in /etc/hosts, marked with a comment.
#
#   scripts/slurm-local.sh start    # install if missing, configure, start; a no-op when already up
#   scripts/slurm-local.sh stop     # stop both slurmd, slurmctld and munged
#   scripts/slurm-local.sh status   # say whether it is up (exit 0) or not (exit 1)
#
#   RSD_SLURM_DIR=/path   state, spool, pid and log files (default /var/tmp/rsd-slurm)
#   RSD_SLURM_CPUS=N      CPUs each node declares (default: 8, or nproc when more)
#
# It writes /etc/slurm/slurm.conf, the file every client (srun, sbatch, squeue, scontrol) reads
# without being told: tests and pipelines run the commands as a user would, with no SLURM_CONF to
# pass around. That suits a CI machine or a developer's box with no other SLURM; a slurm.conf this
# script did not write is never overwritten (start stops with the reason instead). /etc/hosts
# gets a line only for a node name that does not resolve, and keeps it after stop.
#
# Settings chosen for tests, not for production: a 15 s KillWait (SIGTERM to SIGKILL; half the
# default 30 s, still room for a tiny run to finish its step and checkpoint on a loaded machine),
# a requeued job eligible again after 11 s rather than 121 s, the scheduler woken every 2 s, and more CPUs
# declared than the machine has so that both pytest workers' small jobs run side by side.
set -euo pipefail

dir="${RSD_SLURM_DIR:-/var/tmp/rsd-slurm}"
conf=/etc/slurm/slurm.conf
marker="# Written by rsd's scripts/slurm-local.sh"
node="$(hostname -s)"
# Both nodes, first this host's name; each has its own slurmd, port, spool, pid and log file.
nodes=("$node" "$node-2")
ports=(6818 6828)
hosts_marker="# rsd scripts/slurm-local.sh: a node of the local SLURM"
log() { printf '[slurm-local] %s\n' "$*" >&2; }
die() { printf '[slurm-local] error: %s\n' "$*" >&2; exit 1; }

# The process named in a pid file, if that file exists and the process still runs under the
# expected name (after a restart a stale file may name nothing, or an unrelated process; a daemon
# killed where nothing reaps orphans, as in some containers, stays a zombie under its own name).
pid_of() {
  local file="$1" name="$2" pid
  [ -r "$file" ] || return 1
  pid="$(tr -dc 0-9 <"$file")"
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] || return 1
  grep -q "^${name}" "/proc/$pid/comm" || return 1
  running "$pid" || return 1
  printf '%s\n' "$pid"
}
# Whether a process runs: field 3 of /proc/PID/stat is its state; Z (zombie) and X (dead) run
# nothing.
running() {
  case "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" in Z | X | "") return 1 ;; esac
}

munge_up() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }
# The slurmd of node NAME (slurm.conf's SlurmdPidFile, %n expanded).
slurmd_pid_file() { printf '%s\n' "$dir/slurmd-$1.pid"; }
slurmd_up() { pid_of "$(slurmd_pid_file "$1")" slurmd >/dev/null; }
all_slurmd_up() {
  local n
  for n in "${nodes[@]}"; do slurmd_up "$n" || return 1; done
}
node_state() { sinfo -h -n "$1" -o %T 2>/dev/null | head -n1; }
# A node that takes jobs: idle, or running some already (mixed, allocated). A trailing '*' means
# slurmctld has not heard from slurmd; drained/down nodes take nothing.
node_ready() {
  case "$(node_state "$1")" in idle | mixed | allocated | completing) return 0 ;; *) return 1 ;; esac
}
all_nodes_ready() {
  local n
  for n in "${nodes[@]}"; do node_ready "$n" || return 1; done
}
# Each node's state: "vm idle, vm-2 idle".
nodes_states() {
  local n state out=""
  for n in "${nodes[@]}"; do
    state="$(node_state "$n" || true)"
    out+="${out:+, }$n ${state:-unknown}"
  done
  printf '%s\n' "$out"
}

install_packages() {
  local need=()
  for c in slurmctld slurmd srun sbatch; do command -v "$c" >/dev/null || need=(slurm-wlm); done
  command -v munged >/dev/null || need+=(munge)
  [ ${#need[@]} -gt 0 ] || return 0
  command -v apt-get >/dev/null || die "apt-get not found; install ${need[*]} (SLURM 22.05 or later, and munge) by hand"
  log "apt: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Wait for dpkg's lock rather than fail while another install (scripts/setup.sh) holds it.
  apt-get -o DPkg::Lock::Timeout=600 update -qq || die "apt-get update failed (see above)"
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
    || die "apt-get install ${need[*]} failed (see above)"
}

start_munge() {
  munge_up && return 0
  # Debian's postinst makes the key; a bare image may not have run it.
  if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    install -d -o munge -g munge -m 0700 /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
  fi
  # /run is empty after a restart; munged checks that its directories belong to its user.
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
  # A socket or lock left by a munged that no longer runs makes a new one refuse to start.
  if ! pid_of /run/munge/munged.pid munged >/dev/null; then
    rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock /run/munge/munged.pid
  fi
  # munged runs as its own user (it refuses a key owned by another user); no systemd here.
  runuser -u munge -- /usr/sbin/munged || die "munged did not start; see /var/log/munge/munged.log"
  for _ in $(seq 50); do munge_up && return 0; sleep 0.1; done
  die "munged started but does not answer; see /var/log/munge/munged.log"
}

# A node name that does not resolve gets a 127.0.0.1 line in /etc/hosts (once: the line is marked,
# and a name that resolves is left alone). Every node is at 127.0.0.1 in slurm.conf, but srun's
# tasks look up the hosts of the job's node list by name (rsd-train connects to rank 0's).
add_hosts() {
  local n
  for n in "${nodes[@]}"; do
    getent hosts "$n" >/dev/null && continue
    # The marked line, unless an earlier start wrote it (then the lookup itself fails: say so).
    if ! grep -qxF "127.0.0.1 $n $hosts_marker" /etc/hosts 2>/dev/null; then
      printf '127.0.0.1 %s %s\n' "$n" "$hosts_marker" >>/etc/hosts \
        || die "cannot add '127.0.0.1 $n' to /etc/hosts; add it by hand (node $n must resolve)"
      log "added '127.0.0.1 $n' to /etc/hosts"
    fi
    getent hosts "$n" >/dev/null \
      || die "node $n does not resolve although /etc/hosts has '127.0.0.1 $n' (check /etc/nsswitch.conf)"
  done
}

write_conf() {
  local cpus mem_mib
  cpus="${RSD_SLURM_CPUS:-$(($(nproc) > 8 ? $(nproc) : 8))}"
  mem_mib=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)
  cat <<EOF
$marker for its two-node test cluster.
# Every setting and why: see the comments in that script. Stop it with: scripts/slurm-local.sh stop
ClusterName=rsd-local
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job becomes eligible at now + cred_expire + 1 (job_mgr.c, _job_requeue_op; the
# default cred_expire is 120, so 121 s). 10 gives 11 s, long enough for a launch credential
# on a loaded 2-core machine to be used before it expires (the minimum SLURM accepts is 5).
AuthInfo=cred_expire=10
MpiDefault=none
# srun reserves ports from this range for each step (SLURM_STEP_RESV_PORTS) when asked to.
MpiParams=ports=12000-12999
# No cgroups: the machine may have none we can use (containers, gVisor); processes are
# tracked by parent pid and tasks are not bound to CPUs.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# Jobs get CPUs, not whole nodes, so several 1-CPU jobs share the node.
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Trust the CPU counts below rather than drain a node because the hardware has fewer
# (more CPUs are declared than exist so both pytest workers' small jobs run at once).
SlurmdParameters=config_overrides
# A node that was down (a restart, a slurmd that was stopped) takes jobs again once its
# slurmd registers, with no scontrol update by hand.
ReturnToService=2
# Seconds between SIGTERM and SIGKILL at a time limit or scancel: short for tests (default 30).
KillWait=15
# A finished job's record stays 300 s so that tests can read its state and exit code with
# scontrol (there is no accounting database, so no sacct).
MinJobAge=300
JobRequeue=1
MessageTimeout=10
# A job is stopped at its time limit, with no grace minutes.
OverTimeLimit=0
InactiveLimit=0
# Wake the main scheduler every 2 s (default 60) so a job that becomes eligible (a requeued
# job's BeginTime passing) starts at once; backfill likewise every 5 s (default 30).
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=5
# No accounting: no slurmdbd to run.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Everything SLURM writes, under one directory; %n is the node's name, one file per slurmd.
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Two nodes on this host, each slurmd on its own port (both at 127.0.0.1; only the first may
# name this host as NodeHostname: two nodes on one hostname need --enable-multiple-slurmd). The
# lower Weight is taken first: a one-node job runs on the first node while it has the CPUs.
NodeName=${nodes[0]} NodeAddr=127.0.0.1 NodeHostname=$node Port=${ports[0]} Weight=1 CPUs=$cpus RealMemory=$mem_mib State=UNKNOWN
NodeName=${nodes[1]} NodeAddr=127.0.0.1 Port=${ports[1]} Weight=2 CPUs=$cpus RealMemory=$mem_mib State=UNKNOWN
PartitionName=debug Nodes=${nodes[0]},${nodes[1]} Default=YES MaxTime=INFINITE State=UP
EOF
}

# SIGTERM, and SIGKILL if the process has not ended 10 s later.
stop_pid() {
  local name="$1" pid="$2"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do running "$pid" || break; sleep 0.1; done
  if running "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  log "stopped $name ($pid)"
}

stop_daemons() {
  local pid file n
  # Each node's slurmd, and one started by this script's one-node version ($dir/slurmd.pid).
  for n in "${nodes[@]}" ""; do
    if [ -n "$n" ]; then file="$(slurmd_pid_file "$n")"; else file="$dir/slurmd.pid"; fi
    if pid="$(pid_of "$file" slurmd)"; then stop_pid "slurmd${n:+ $n}" "$pid"; fi
    rm -f "$file"
  done
  if pid="$(pid_of "$dir/slurmctld.pid" slurmctld)"; then stop_pid slurmctld "$pid"; fi
  rm -f "$dir/slurmctld.pid"
}

fail_with_log() {
  local file="$1"
  log "$2"
  if [ -r "$file" ]; then
    log "last lines of $file:"
    tail -n 20 "$file" >&2
  fi
  exit 1
}

start() {
  install_packages
  [ ! -e "$conf" ] || grep -qF "$marker" "$conf" \
    || die "$conf exists and was not written by this script; not overwriting another SLURM's configuration"
  mkdir -p "$dir/state" "$dir/log"
  local n
  for n in "${nodes[@]}"; do mkdir -p "$dir/spool/$n"; done
  add_hosts
  start_munge

  local new
  new="$(write_conf)"
  if [ -e "$conf" ] && [ "$new" == "$(cat "$conf")" ] && ctld_up && all_slurmd_up && all_nodes_ready; then
    echo "[slurm-local] ready: nodes $(nodes_states) (already running; $conf)"
    return 0
  fi
  if [ ! -e "$conf" ] || [ "$new" != "$(cat "$conf")" ]; then
    # A changed node or scheduler setting needs both daemons restarted (reconfigure does
    # not change node definitions).
    stop_daemons
    mkdir -p /etc/slurm
    printf '%s\n' "$new" >"$conf"
    log "wrote $conf"
  fi

  if ! ctld_up; then
    # A pid file naming no live slurmctld (a restart) would only confuse the check above.
    pid_of "$dir/slurmctld.pid" slurmctld >/dev/null || rm -f "$dir/slurmctld.pid"
    slurmctld || fail_with_log "$dir/log/slurmctld.log" "slurmctld did not start"
    for _ in $(seq 100); do ctld_up && break; sleep 0.2; done
    ctld_up || fail_with_log "$dir/log/slurmctld.log" "slurmctld does not answer scontrol ping after 20 s"
  fi
  # One slurmd per node, told its name (-N): both run on this host.
  for n in "${nodes[@]}"; do
    if ! slurmd_up "$n"; then
      rm -f "$(slurmd_pid_file "$n")"
      slurmd -N "$n" || fail_with_log "$dir/log/slurmd-$n.log" "slurmd of node $n did not start"
    fi
  done

  # Wait for both nodes to register; resume one that came up down or drained (a slurmd killed
  # with jobs on it, a configuration that changed under it).
  local state resumed=" "
  for _ in $(seq 120); do
    all_nodes_ready && break
    for n in "${nodes[@]}"; do
      state="$(node_state "$n")"
      case "$state" in
        down | drained | draining | drain*)
          if [[ "$resumed" != *" $n "* ]]; then
            log "node $n is $state; resuming it"
            scontrol update nodename="$n" state=resume || true
            resumed+="$n "
          fi
          ;;
      esac
    done
    sleep 0.5
  done
  for n in "${nodes[@]}"; do
    node_ready "$n" || fail_with_log "$dir/log/slurmd-$n.log" \
      "node $n is '$(node_state "$n")', not idle, after 60 s (slurmctld's log: $dir/log/slurmctld.log)"
  done
  echo "[slurm-local] ready: nodes $(nodes_states), $(sinfo -h -o %c -n "$node") CPUs each ($conf, files in $dir)"
}

status() {
  local n daemons=""
  if munge_up && ctld_up && all_slurmd_up && all_nodes_ready; then
    echo "[slurm-local] up: nodes $(nodes_states) ($conf, files in $dir)"
  else
    for n in "${nodes[@]}"; do daemons+=", slurmd $n $(slurmd_up "$n" && echo up || echo down)"; done
    echo "[slurm-local] down: munge $(munge_up && echo up || echo down), slurmctld $(ctld_up && echo up || echo down)$daemons, nodes '$(nodes_states)'"
    return 1
  fi
}

stop() {
  local pid
  stop_daemons
  if pid="$(pid_of /run/munge/munged.pid munged)"; then stop_pid munged "$pid"; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
