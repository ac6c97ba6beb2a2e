#!/usr/bin/env bash
# A real one-node SLURM on this machine, for the test suite: Debian's slurm-wlm (22.05 on Debian
# 12) with munge, slurmctld and slurmd as root, every job on this host. The suite's SLURM tests
# (tests/slurm_local.py) submit real jobs to it; scripts/test.sh starts it before pytest.
#
#   scripts/slurm-local.sh start    # install if missing, configure, start; a no-op when already up
#   scripts/slurm-local.sh stop     # stop slurmd, slurmctld and munged
#   scripts/slurm-local.sh status   # say whether it is up (exit 0) or not (exit 1)
#
#   RSD_SLURM_DIR=/path   state, spool, pid and log files (default /var/tmp/rsd-slurm)
#   RSD_SLURM_CPUS=N      CPUs the node declares (default: 8, or nproc when more)
#
# It writes /etc/slurm/slurm.conf, the file every client (srun, sbatch, squeue, scontrol) reads
# without being told: tests and pipelines run the commands as a user would, with no SLURM_CONF to
# pass around. That suits a CI machine or a developer's box with no other SLURM; a slurm.conf this
# script did not write is never overwritten (start stops with the reason instead).
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
slurmd_up() { pid_of "$dir/slurmd.pid" slurmd >/dev/null; }
node_state() { sinfo -h -n "$node" -o %T 2>/dev/null | head -n1; }
# A node that takes jobs: idle, or running some already (mixed, allocated). A trailing '*' means
# slurmctld has not heard from slurmd; drained/down nodes take nothing.
node_ready() {
  case "$(node_state)" in idle | mixed | allocated | completing) return 0 ;; *) return 1 ;; esac
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

write_conf() {
  local cpus mem_mib
  cpus="${RSD_SLURM_CPUS:-$(($(nproc) > 8 ? $(nproc) : 8))}"
  mem_mib=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)
  cat <<EOF
$marker for its one-node test cluster.
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
# Trust the CPU count below rather than drain the node because the hardware has fewer
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
# Everything SLURM writes, under one directory.
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$node CPUs=$cpus RealMemory=$mem_mib State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
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
  local pid
  for d in slurmd slurmctld; do
    if pid="$(pid_of "$dir/$d.pid" "$d")"; then stop_pid "$d" "$pid"; fi
    rm -f "$dir/$d.pid"
  done
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
  mkdir -p "$dir/state" "$dir/spool" "$dir/log"
  start_munge

  local new
  new="$(write_conf)"
  if [ -e "$conf" ] && [ "$new" == "$(cat "$conf")" ] && ctld_up && slurmd_up && node_ready; then
    echo "[slurm-local] ready: node $node is $(node_state) (already running; $conf)"
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
  if ! slurmd_up; then
    rm -f "$dir/slurmd.pid"
    slurmd || fail_with_log "$dir/log/slurmd.log" "slurmd did not start"
  fi

  # Wait for the node to register; resume it if it came up down or drained (a slurmd killed
  # with jobs on it, a configuration that changed under it).
  local state resumed=""
  for _ in $(seq 120); do
    node_ready && break
    state="$(node_state)"
    case "$state" in
      down | drained | draining | drain*)
        if [ -z "$resumed" ]; then
          log "node $node is $state; resuming it"
          scontrol update nodename="$node" state=resume || true
          resumed=1
        fi
        ;;
    esac
    sleep 0.5
  done
  node_ready || fail_with_log "$dir/log/slurmd.log" \
    "node $node is '$(node_state)', not idle, after 60 s (slurmctld's log: $dir/log/slurmctld.log)"
  echo "[slurm-local] ready: node $node is $(node_state), $(sinfo -h -o %c -n "$node") CPUs ($conf, files in $dir)"
}

status() {
  if munge_up && ctld_up && slurmd_up && node_ready; then
    echo "[slurm-local] up: node $node is $(node_state) ($conf, files in $dir)"
  else
    echo "[slurm-local] down: munge $(munge_up && echo up || echo down), slurmctld $(ctld_up && echo up || echo down), slurmd $(slurmd_up && echo up || echo down), node '$(node_state || true)'"
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
