#!/usr/bin/env bash
# A real one-node SLURM cluster on localhost, for Tula's `slurm` tests and for trying the
# SLURM profile by hand. Debian 12 (SLURM 22.05), as root, without systemd: every daemon
# is started here and stopped by pid file.
#
#   scripts/slurm-cluster.sh up      install packages if missing, configure, start, wait
#   scripts/slurm-cluster.sh down    stop every daemon this script started
#   scripts/slurm-cluster.sh status  sinfo + a 1-task sbatch round trip through sacct
#
# State lives under $TULA_SLURM_DIR (default /var/tmp/tula-slurm); logs in its log/.
set -euo pipefail

STATE=${TULA_SLURM_DIR:-/var/tmp/tula-slurm}
PKGS=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
HOST=$(hostname -s)
CLUSTER=tula
DB_PASS=tula-slurm-test

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
    stop_pidfile slurmctld "$STATE/run/slurmctld.pid"
    stop_pidfile slurmdbd "$STATE/run/slurmdbd.pid"
    stop_mariadb
    stop_pidfile munged "$STATE/run/munged.pid"
}

write_configs() {
    local cpus mem
    cpus=$(nproc)
    mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
    mem=$(( mem * 9 / 10 ))
    mkdir -p "$STATE"/{run,log,spool/ctld,spool/d} /etc/slurm
    cat > /etc/slurm/slurm.conf <<CONF
# Written by tula scripts/slurm-cluster.sh: one node on localhost, for tests.
ClusterName=$CLUSTER
SlurmctldHost=$HOST
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
SlurmdPidFile=$STATE/run/slurmd.pid
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
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

up() {
    need_root
    install_packages
    down
    write_configs

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
    slurmctld
    wait_for 30 slurmctld scontrol ping
    cancel_leftovers
    slurmd
    wait_for 120 "node $HOST idle" bash -c "sinfo -h -n $HOST -o %t | grep -qE '^(idle|mix)'"
    sacctmgr -i add account root Cluster="$CLUSTER" >/dev/null 2>&1 || true
    sacctmgr -i add user root Account=root Cluster="$CLUSTER" >/dev/null 2>&1 || true
    log "cluster '$CLUSTER' up: $(sinfo -h -o '%P %D %t %c CPUs %m MB')"
}

status() {
    sinfo
    local id
    id=$(sbatch --parsable -o /dev/null --wrap "hostname")
    wait_for 60 "job $id to complete" bash -c "sacct -n -X -j $id -o State | grep -q COMPLETED"
    sacct -X -j "$id" -o JobID,JobName,State,ExitCode,Elapsed
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
