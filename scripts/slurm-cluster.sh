#!/usr/bin/env bash
# A real SLURM cluster on this machine, for Tula's `slurm` tests and for trying the SLURM
# profile by hand. Debian 12 (SLURM 22.05), as root, without systemd: every daemon is started
# here and stopped by pid file.
#
#   scripts/slurm-cluster.sh up      install packages if missing, configure, start, wait:
#                                    one node on localhost (partition debug)
#   scripts/slurm-cluster.sh up --nodes K [--rate 200mbit] [--slots S]
#                                    K nodes on the network lab (scripts/netlab.sh): each lab
#                                    namespace tula-n<i> runs one slurmd under its own hostname
#                                    (a UTS namespace), S slots (default 2) and a count-only
#                                    GRES gpu:S each; partition lab; every link shaped at RATE
#   scripts/slurm-cluster.sh up --nodes K --partitions P [--slow PART:F]
#                                    the same lab, its nodes also split in order into P
#                                    partitions lab0, lab1, ... (K/P nodes each; lab still holds
#                                    them all); --slow runs every task on PART's nodes at 1/F of
#                                    a core (a cgroup v1 CPU quota set by the TaskProlog), so
#                                    PART is a slower "GPU type"
#   scripts/slurm-cluster.sh slow PART:F | none
#                                    change (or end) the slowdown of a running lab; tasks that
#                                    start after it get it
#   scripts/slurm-cluster.sh down    stop every daemon this script started, remove the lab
#   scripts/slurm-cluster.sh status  sinfo + a 1-task sbatch round trip through sacct
#   scripts/slurm-cluster.sh kill-node tula-n1 [REASON]
#                                    the node-loss drill: kill every process of a lab node (its
#                                    slurmd, job steps, workers) and mark it down in SLURM
#   scripts/slurm-cluster.sh revive-node tula-n1
#                                    a fresh slurmd on it; SLURM returns it to service
#
# State lives under $TULA_SLURM_DIR (default /var/tmp/tula-slurm); logs in its log/.
set -euo pipefail

STATE=${TULA_SLURM_DIR:-/var/tmp/tula-slurm}
PKGS=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
HOST=$(hostname -s)
CLUSTER=tula
DB_PASS=tula-slurm-test
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LAB=tula                     # the lab's namespaces: tula-n0, tula-n1, ... (scripts/netlab.sh)
LAB_NET=10.77.0              # node i at .i+1, the root namespace (slurmctld) at .254
SLOW_CG=/sys/fs/cgroup/cpu/tula-slow  # the slowed tasks' cgroups (slow_tasks), one per task
HOSTS_TAG="# tula-slurm-lab"  # the lines `up --nodes` adds to /etc/hosts, removed by `down`

log() { echo "[slurm-cluster] $*"; }
die() { echo "[slurm-cluster] error: $*" >&2; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts daemons)"; }

install_packages() {
    local missing=()
    for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

stop_pidfile() {  # stop_pidfile NAME FILE: only a live process of that name is stopped
    local f=$2
    [ -f "$f" ] || return 0
    local pid
    pid=$(cat "$f" 2>/dev/null || true)
    if [ -n "$pid" ] && [ "$(ps -p "$pid" -o comm= 2>/dev/null)" = "$1" ]; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$pid" 2>/dev/null || true
        log "stopped $1 (pid $pid)"
    fi
    rm -f "$f"
}

stop_mariadb() {  # ours carry the tula-mariadb.pid marker on their command line
    pgrep -f 'mariadbd.*tula-mariadb.pid' >/dev/null || return 0
    mariadb-admin --socket=/run/mysqld/mysqld.sock shutdown >/dev/null 2>&1 || true
    for _ in $(seq 50); do pgrep -f 'mariadbd.*tula-mariadb.pid' >/dev/null || break; sleep 0.2; done
    pkill -9 -f 'mariadbd.*tula-mariadb.pid' 2>/dev/null || true
    log "stopped mariadbd"
}

down() {
    stop_pidfile slurmd "$STATE/run/slurmd.pid"
    for f in "$STATE"/run/slurmd-*.pid; do [ -e "$f" ] && stop_pidfile slurmd "$f"; done
    # a job still running keeps its step daemons (and their srun tasks) past its slurmd
    if pkill -KILL -x slurmstepd 2>/dev/null; then log "killed the steps of jobs still running"; fi
    remove_slow_cgroups
    stop_pidfile slurmctld "$STATE/run/slurmctld.pid"
    stop_pidfile slurmdbd "$STATE/run/slurmdbd.pid"
    stop_mariadb
    stop_pidfile munged "$STATE/run/munged.pid"
    if grep -q "$HOSTS_TAG" /etc/hosts 2>/dev/null; then
        # /etc/hosts may be a bind mount (containers): rewrite it in place, never replace it
        grep -v "$HOSTS_TAG" /etc/hosts > "$STATE/hosts.new" || true
        cat "$STATE/hosts.new" > /etc/hosts && rm -f "$STATE/hosts.new"
    fi
    if ip netns list 2>/dev/null | grep -qE "^$LAB-n[0-9]+"; then
        NETLAB_PREFIX=$LAB bash "$HERE/netlab.sh" down >/dev/null
        log "removed the network lab"
    fi
}

write_configs() {  # write_configs [K SLOTS PARTS]: one node on localhost, or K lab nodes
    local cpus mem k=${1:-0} slots=${2:-2} parts=${3:-0}
    cpus=$(nproc)
    mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
    mem=$(( mem * 9 / 10 ))
    mkdir -p "$STATE"/{run,log,spool/ctld,spool/d} /etc/slurm
    local ctld=$HOST nodes
    if [ "$k" -gt 0 ]; then
        ctld="$HOST($LAB_NET.254)"
        cpus=$slots
        mem=$(( mem / k ))
    fi
    cat > /etc/slurm/slurm.conf <<CONF
# Written by tula scripts/slurm-cluster.sh, for tests: $( [ "$k" -gt 0 ] && echo "$k nodes on the network lab" || echo "one node on localhost")
ClusterName=$CLUSTER
SlurmctldHost=$ctld
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$(( mem / cpus / 2 ))
SchedulerParameters=sched_interval=2,bf_interval=2
MinJobAge=300
ReturnToService=2
SlurmctldPidFile=$STATE/run/slurmctld.pid
StateSaveLocation=$STATE/spool/ctld
SlurmctldLogFile=$STATE/log/slurmctld.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
CONF
    if [ "$k" -gt 0 ]; then
        # one slurmd per lab node: %n (the node's name) keeps their files apart
        nodes="$LAB-n[0-$(( k - 1 ))]"
        cat >> /etc/slurm/slurm.conf <<CONF
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmdSpoolDir=$STATE/spool/d-%n
SlurmdLogFile=$STATE/log/slurmd-%n.log
GresTypes=gpu
$(for i in $(seq 0 $(( k - 1 ))); do
    echo "NodeName=$LAB-n$i NodeAddr=$LAB_NET.$(( i + 1 )) CPUs=$cpus RealMemory=$mem Gres=gpu:$slots State=UNKNOWN"
done)
PartitionName=lab Nodes=$nodes Default=YES MaxTime=INFINITE State=UP
$(lab_partitions "$k" "$parts")
TaskProlog=$STATE/task-prolog.sh
TaskEpilog=$STATE/task-epilog.sh
CONF
        write_task_scripts
        # GPUs that are only counted: SLURM 22.05's gres/gpu counts a GPU only by its File (with
        # Count alone, or Flags=CountOnly, slurmd reports 0 and the node goes INVAL: "gres/gpu
        # count reported lower than configured"), so each slot stands on an empty file here.
        # No task plugin constrains devices, so nothing opens them; jobs see no GPU.
        mkdir -p "$STATE/gpu"
        for j in $(seq 0 $(( slots - 1 ))); do touch "$STATE/gpu/gpu$j"; done
        echo "NodeName=$nodes Name=gpu File=$STATE/gpu/gpu[0-$(( slots - 1 ))]" > /etc/slurm/gres.conf
        for i in $(seq 0 $(( k - 1 ))); do mkdir -p "$STATE/spool/d-$LAB-n$i"; done
    else
        cat >> /etc/slurm/slurm.conf <<CONF
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmdSpoolDir=$STATE/spool/d
SlurmdLogFile=$STATE/log/slurmd.log
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
        rm -f /etc/slurm/gres.conf
    fi
    cat > /etc/slurm/slurmdbd.conf <<CONF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$STATE/run/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
CONF
    chmod 600 /etc/slurm/slurmdbd.conf
}

lab_partitions() {  # lab_partitions K P: P partitions lab0.. of K/P lab nodes each, in order
    local k=$1 p=$2 j per
    [ "$p" -gt 0 ] || return 0
    per=$(( k / p ))
    for j in $(seq 0 $(( p - 1 ))); do
        echo "PartitionName=lab$j Nodes=$LAB-n[$(( j * per ))-$(( j * per + per - 1 ))] MaxTime=INFINITE State=UP"
    done
}

# The lab's slower partition: every task started on a node listed in $STATE/slow ("NODE F")
# runs in a cgroup of its own (cgroup v1, cpu) whose quota is 1/F of a core, set by the
# TaskProlog (SLURM_TASK_PID is the task) before the task runs; its children inherit it. The
# TaskEpilog removes the task's cgroup, and `down` any left.
write_task_scripts() {
    cat > "$STATE/task-prolog.sh" <<SH
#!/bin/sh
f=\$(awk -v n="\$SLURMD_NODENAME" '\$1 == n {print \$2}' "$STATE/slow" 2>/dev/null)
[ -n "\$f" ] || exit 0
cg="$SLOW_CG/\$SLURM_JOB_ID.\${SLURM_STEP_ID:-batch}.\${SLURM_LOCALID:-0}"
mkdir -p "\$cg" && echo 10000 > "\$cg/cpu.cfs_period_us"
echo \$(( 10000 * 100 / \$(echo "\$f" | awk '{printf "%d", \$1 * 100}') )) > "\$cg/cpu.cfs_quota_us"
echo "\$SLURM_TASK_PID" > "\$cg/cgroup.procs"
SH
    cat > "$STATE/task-epilog.sh" <<SH
#!/bin/sh
rmdir "$SLOW_CG/\$SLURM_JOB_ID.\${SLURM_STEP_ID:-batch}.\${SLURM_LOCALID:-0}" 2>/dev/null
exit 0
SH
    chmod 755 "$STATE/task-prolog.sh" "$STATE/task-epilog.sh"
    mkdir -p "$SLOW_CG"
}

remove_slow_cgroups() {  # any task still in one goes back to the root cgroup first
    [ -d "$SLOW_CG" ] || return 0
    local cg pid
    for cg in "$SLOW_CG"/*/; do
        [ -d "$cg" ] || continue
        while read -r pid; do echo "$pid" > /sys/fs/cgroup/cpu/cgroup.procs 2>/dev/null || true; done < "$cg/cgroup.procs"
        rmdir "$cg" 2>/dev/null || true
    done
    rmdir "$SLOW_CG" 2>/dev/null && log "removed the slowed tasks' cgroups" || true
}

slow() {  # slow PART:F | none
    local spec=${1:?slow PART:F | none} part factor
    if [ "$spec" = none ]; then
        : > "$STATE/slow"
        log "no partition is slowed"
        return 0
    fi
    part=${spec%%:*}
    factor=${spec#*:}
    [[ "$factor" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--slow $spec: expected PART:FACTOR, e.g. lab1:2"
    local nodes
    nodes=$(sinfo -h -p "$part" -N -o %N 2>/dev/null | sort -u)
    [ -n "$nodes" ] || die "--slow $spec: no partition $part (up --nodes K --partitions P first)"
    for n in $nodes; do echo "$n $factor"; done > "$STATE/slow"
    log "partition $part ($(echo $nodes)) runs each task at 1/$factor of a core"
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local t=$1 what=$2; shift 2
    for _ in $(seq $(( t * 5 ))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
    sinfo -h -N -o '[slurm-cluster] node %N: %T, reason: %E' 2>/dev/null >&2 || true
    squeue -h -o '[slurm-cluster] job %i: %T on %N (%r)' 2>/dev/null >&2 || true
    die "timed out after ${t}s waiting for $what (logs: $STATE/log/)"
}

# A test cluster starts empty: jobs that slurmctld recovered from its saved state (a run that
# was killed, a machine that restarted) would hold the node until their time limit ran out,
# and pending ones would start in the middle of the tests. Cancelling them (instead of wiping
# the saved state) keeps job ids increasing, so sacct never sees one id twice.
cancel_leftovers() {
    local ids
    ids=$(squeue -h -o %i | tr '\n' ' ')
    [ -n "${ids// /}" ] || return 0
    # shellcheck disable=SC2086
    scancel $ids
    log "cancelled jobs left by an earlier run: $ids"
}

up() {  # up [--nodes K] [--rate RATE] [--slots S] [--partitions P] [--slow PART:F]
    local k=0 rate=200mbit slots=2 parts=0 slowed=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --nodes) k=${2:?--nodes K}; shift 2 ;;
            --rate) rate=${2:?--rate RATE}; shift 2 ;;
            --slots) slots=${2:?--slots S}; shift 2 ;;
            --partitions) parts=${2:?--partitions P}; shift 2 ;;
            --slow) slowed=${2:?--slow PART:F}; shift 2 ;;
            *) die "unknown option $1 (up [--nodes K] [--rate RATE] [--slots S] [--partitions P] [--slow PART:F])" ;;
        esac
    done
    if [ "$parts" -gt 0 ] && { [ "$k" -eq 0 ] || [ $(( k % parts )) -ne 0 ]; }; then
        die "--partitions $parts: needs --nodes K, a multiple of it"
    fi
    [ -z "$slowed" ] || [ "$parts" -gt 0 ] || die "--slow needs --partitions"
    need_root
    install_packages
    down
    if [ "$k" -gt 0 ]; then
        NETLAB_PREFIX=$LAB bash "$HERE/netlab.sh" up "$k" "$rate" >/dev/null
        {
            for i in $(seq 0 $(( k - 1 ))); do echo "$LAB_NET.$(( i + 1 )) $LAB-n$i $HOSTS_TAG"; done
            echo "$LAB_NET.254 $HOST-lab $HOSTS_TAG"
        } >> /etc/hosts
        log "network lab: $k node(s), links at $rate"
    fi
    write_configs "$k" "$slots" "$parts"
    : > "$STATE/slow"

    # munge
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    [ -f /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || /usr/sbin/create-munge-key -f; }
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    pkill -u munge -x munged 2>/dev/null || true
    runuser -u munge -- munged
    pgrep -u munge -n -x munged > "$STATE/run/munged.pid"
    wait_for 10 munge bash -c 'munge -n | unmunge'

    # MariaDB on loopback only, started by hand
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    mariadbd --user=mysql --datadir=/var/lib/mysql --bind-address=127.0.0.1 \
        --socket=/run/mysqld/mysqld.sock --pid-file=/run/mysqld/tula-mariadb.pid \
        >"$STATE/log/mariadb.log" 2>&1 &
    wait_for 30 mariadb mariadb -e "SELECT 1"
    mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
        CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"

    slurmdbd
    wait_for 30 slurmdbd sacctmgr -n show cluster
    sacctmgr -i add cluster "$CLUSTER" >/dev/null 2>&1 || true
    # Job IDs after every one the accounting database holds: a controller started without its
    # saved state counts from 1 again, and sacct -j would then also list an earlier run's job of
    # the same ID (read first, its state is a finished job's)
    local first
    first=$(mariadb -N -e "SELECT COALESCE(MAX(id_job), 0) + 1 FROM slurm_acct_db.${CLUSTER}_job_table" 2>/dev/null || echo 1)
    grep -q '^FirstJobId=' /etc/slurm/slurm.conf || echo "FirstJobId=${first:-1}" >> /etc/slurm/slurm.conf
    slurmctld
    wait_for 30 slurmctld scontrol ping
    cancel_leftovers
    if [ "$k" -gt 0 ]; then
        start_lab_slurmds "$k"
    else
        slurmd
        wait_for 120 "node $HOST idle" bash -c "sinfo -h -n $HOST -o %t | grep -qE '^(idle|mix)'"
    fi
    sacctmgr -i add account root Cluster="$CLUSTER" >/dev/null 2>&1 || true
    sacctmgr -i add user root Account=root Cluster="$CLUSTER" >/dev/null 2>&1 || true
    [ -z "$slowed" ] || slow "$slowed"
    log "cluster '$CLUSTER' up: $(sinfo -h -o '%P %D %t %c CPUs %m MB' | tr '\n' ';')"
}

# Each lab node's slurmd: in its namespace's network (nsenter --net: `ip netns exec` remounts
# /sys, where slurmd then finds no cgroup file system) and a UTS namespace of its own, so that
# it, and every job step it starts, sees the node's name as its hostname.
start_lab_slurmds() {
    local k=$1 i node
    for i in $(seq 0 $(( k - 1 ))); do
        node=$LAB-n$i
        nsenter --net="/var/run/netns/$node" unshare --uts sh -c "hostname $node; exec slurmd -N $node"
    done
    for i in $(seq 0 $(( k - 1 ))); do
        node=$LAB-n$i
        wait_for 120 "node $node idle" bash -c "sinfo -h -n $node -o %t | grep -qE '^(idle|mix)'"
    done
}

# The node-loss drill: a lab node dies (every process in its namespace: its slurmd, the job
# steps and workers it started) and SLURM is told at once, as its controller would be once the
# node stopped answering; then it comes back (a fresh slurmd; ReturnToService=2 returns it).
kill_all_in() {  # kill_all_in NODE: SIGKILL to each process of NODE's namespace; true if none was left
    local pids
    pids=$(ip netns pids "$1")
    [ -z "$pids" ] && return 0
    # shellcheck disable=SC2086  # one word per pid
    kill -9 $pids 2>/dev/null || true
    return 1
}

kill_node() {  # kill_node NODE [REASON]
    local node=${1:?kill-node NODE [REASON]} reason=${2:-tula node-loss drill}
    [ -e "/var/run/netns/$node" ] || die "no lab node $node (up --nodes K first)"
    # every process in the node's namespace, listed again until none is left: one that ends by
    # itself between the listing and its kill is not an error (a drill once failed on one),
    # and one forked meanwhile is killed on the next pass
    wait_for 10 "the processes of node $node to end" kill_all_in "$node"
    scontrol update nodename="$node" state=down reason="$reason"
    log "node $node killed and marked down ($reason)"
}

revive_node() {  # revive_node NODE
    local node=${1:?revive-node NODE}
    [ -e "/var/run/netns/$node" ] || die "no lab node $node (up --nodes K first)"
    nsenter --net="/var/run/netns/$node" unshare --uts sh -c "hostname $node; exec slurmd -N $node"
    scontrol update nodename="$node" state=resume 2>/dev/null || true
    wait_for 120 "node $node back" bash -c "sinfo -h -n $node -o %t | grep -qE '^(idle|mix|alloc)'"
    log "node $node is back: $(sinfo -h -n "$node" -o %t)"
}

status() {
    sinfo
    local id
    id=$(sbatch --parsable -o /dev/null --wrap "hostname")
    wait_for 60 "job $id to complete" bash -c "sacct -n -X -j $id -o State | grep -q COMPLETED"
    sacct -X -j "$id" -o JobID,JobName,State,ExitCode,Elapsed
}

case "${1:-}" in
    up) shift; up "$@" ;;
    down) down ;;
    status) status ;;
    kill-node) shift; kill_node "$@" ;;
    revive-node) shift; revive_node "$@" ;;
    slow) shift; slow "$@" ;;
    *) echo "usage: $0 up [--nodes K [--rate RATE] [--slots S] [--partitions P [--slow PART:F]]] | slow PART:F|none | down | status | kill-node NODE [REASON] | revive-node NODE" >&2; exit 2 ;;
esac
