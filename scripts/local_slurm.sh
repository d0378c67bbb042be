#!/usr/bin/env bash
# A one-node Slurm cluster on this machine (loopback, CPU only), for the Slurm tests and
# for anyone who wants to try the cluster path of the pipeline locally.
#
#   scripts/local_slurm.sh install          # apt-get what is missing: slurmctld slurmd slurmdbd slurm-client munge mariadb-server
#   scripts/local_slurm.sh start            # write the configs; start munged, mariadbd, slurmdbd, slurmctld, slurmd; wait until idle
#   eval "$(scripts/local_slurm.sh env)"    # point sbatch/squeue/sacct at it (exports SLURM_CONF)
#   scripts/local_slurm.sh status
#   scripts/local_slurm.sh stop             # stop the daemons this script started (by their pid files)
#   scripts/local_slurm.sh run -- CMD ...   # install if needed, start, run CMD against the cluster, always stop
#
# Everything lives in one state folder, $KVCERT_SLURM_DIR (default ${TMPDIR:-/tmp}/kvcert-slurm-<uid>):
# slurm.conf and slurmdbd.conf, a private munge key and socket, a private MariaDB data
# folder, spool and state folders, the daemons' logs and pid files. Nothing under /etc
# is changed and no system service is started (the one thing outside the folder is the
# link /run/slurm/conf, below), so the cluster neither disturbs nor is disturbed by a
# system munge or MariaDB.
#
# Accounting (sacct) needs slurmdbd: Slurm 22.05 (Debian 12) has no file-based accounting
# storage any more (accounting_storage/filetxt is gone, sacct cannot read jobcomp files,
# and with accounting_storage/none sacct answers "Slurm accounting storage is disabled").
# So the lightest working setup is a private mariadbd (on 127.0.0.1, small InnoDB
# settings, ~30 MB on disk, a few seconds to start) behind slurmdbd. The script registers
# the cluster 'kvcert', an account ($KVCERT_SLURM_ACCOUNT, default kvcert) and the calling
# user in it, and enforces associations: a job with an unknown account is refused, as on
# a real cluster. JobCompType=jobcomp/filetxt also appends a line per finished job to
# jobcomp.txt in the state folder.
#
# Commands outside jobs find the cluster through SLURM_CONF (see `env`). Commands inside
# jobs may not: the Snakemake jobstep plugin removes SLURM_CONF from the environment of
# the srun it starts in every job. While the cluster runs, /run/slurm/conf therefore
# points at the state folder: the place Slurm clients look when /etc/slurm/slurm.conf
# does not exist (the place Slurm's configless mode uses). The script refuses to start
# when /etc/slurm/slurm.conf exists or /run/slurm/conf belongs to someone else, and
# removes its link on stop.
#
# Settings (environment): KVCERT_SLURM_DIR, KVCERT_SLURM_ACCOUNT (kvcert),
# KVCERT_SLURM_PARTITION (debug), KVCERT_SLURM_CPUS (nproc), ports KVCERT_SLURM_CTLD_PORT
# (16817), KVCERT_SLURM_SLURMD_PORT (16818), KVCERT_SLURM_DBD_PORT (16819),
# KVCERT_SLURM_DB_PORT (16820), KVCERT_SLURM_START_TIMEOUT (seconds to wait for each
# daemon and for the node to be idle, 90).
set -euo pipefail

DIR=${KVCERT_SLURM_DIR:-${TMPDIR:-/tmp}/kvcert-slurm-$(id -u)}
CTLD_PORT=${KVCERT_SLURM_CTLD_PORT:-16817}
SLURMD_PORT=${KVCERT_SLURM_SLURMD_PORT:-16818}
DBD_PORT=${KVCERT_SLURM_DBD_PORT:-16819}
DB_PORT=${KVCERT_SLURM_DB_PORT:-16820}
PARTITION=${KVCERT_SLURM_PARTITION:-debug}
ACCOUNT=${KVCERT_SLURM_ACCOUNT:-kvcert}
START_TIMEOUT=${KVCERT_SLURM_START_TIMEOUT:-90}
DB_PASS=kvcert-local  # the private database listens on 127.0.0.1 only
PACKAGES=(slurmctld slurmd slurmdbd slurm-client munge mariadb-server)
SBIN=(/usr/sbin /usr/bin /usr/local/sbin /usr/local/bin)

say() { echo "local_slurm: $*" >&2; }
die() { say "$*"; exit 1; }

find_bin() {  # find_bin NAME: the daemon's path (sbin is not always on PATH)
    local name=$1 d
    command -v "$name" 2>/dev/null && return 0
    for d in "${SBIN[@]}"; do [[ -x $d/$name ]] && { echo "$d/$name"; return 0; }; done
    return 1
}

have_packages() {
    local b
    for b in munged slurmctld slurmd slurmdbd mariadbd mariadb-install-db mariadb sbatch squeue sacct sacctmgr sinfo scontrol; do
        find_bin "$b" >/dev/null || return 1
    done
}

cmd_install() {
    if have_packages; then
        return 0
    fi
    [[ $(id -u) == 0 ]] || die "the Slurm packages are missing and installing them needs root (apt-get install ${PACKAGES[*]})"
    command -v apt-get >/dev/null || die "the Slurm packages are missing and there is no apt-get to install them"
    say "installing ${PACKAGES[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >"$DIR.apt.log" 2>&1 || true
    if ! apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >>"$DIR.apt.log" 2>&1; then
        die "apt-get install ${PACKAGES[*]} failed (log: $DIR.apt.log)"
    fi
    have_packages || die "installed ${PACKAGES[*]} but munged/slurmctld/slurmd/sbatch are still not found"
}

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_config() {
    local host cpus mem_mb
    host=$(hostname -s)
    cpus=${KVCERT_SLURM_CPUS:-$(nproc)}
    mem_mb=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
    mkdir -p "$DIR"/{state,spool,log}
    chmod 700 "$DIR"
    if [[ ! -s $DIR/munge.key ]]; then  # a private key: jobs of this cluster only
        dd if=/dev/urandom of="$DIR/munge.key" bs=1024 count=1 status=none
        chmod 400 "$DIR/munge.key"
    fi
    cat >"$DIR/my.cnf" <<EOF
[mariadbd]
datadir=$DIR/mysql
socket=$DIR/mysql.sock
port=$DB_PORT
bind-address=127.0.0.1
pid-file=$DIR/mariadbd.pid
log-error=$DIR/log/mariadbd.log
user=$(id -un)
skip-name-resolve
innodb-buffer-pool-size=32M
innodb-log-file-size=8M
innodb-lock-wait-timeout=900
performance-schema=OFF
EOF
    cat >"$DIR/slurmdbd.conf" <<EOF
# Written by scripts/local_slurm.sh.
AuthType=auth/munge
AuthInfo=socket=$DIR/munge.socket
DbdHost=$host
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=$(id -un)
PidFile=$DIR/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$DIR/slurmdbd.conf"
    cat >"$DIR/slurm.conf" <<EOF
# Written by scripts/local_slurm.sh: a one-node cluster on loopback, CPU only.
ClusterName=kvcert
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=$(id -un)
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# Accounting through slurmdbd (sacct, sacctmgr); jobs need a known account.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$DIR/munge.socket
AccountingStorageEnforce=associations
AccountingStoreFlags=job_comment
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.txt
MinJobAge=300
# Quick turnaround for tests.
SchedulerParameters=sched_interval=2
MessageTimeout=20
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

RUN_LINK=/run/slurm/conf

link_runtime_conf() {  # /run/slurm/conf -> $DIR, for Slurm commands run inside jobs
    [[ -e /etc/slurm/slurm.conf ]] && die "a system Slurm configuration exists (/etc/slurm/slurm.conf); commands inside jobs would read it instead of this cluster's"
    if [[ -L $RUN_LINK ]]; then
        [[ $(readlink "$RUN_LINK") == "$DIR" ]] && return 0
        if pid_alive "$RUN_LINK/slurmctld.pid"; then
            die "$RUN_LINK points at another running cluster ($(readlink "$RUN_LINK")); stop it first"
        fi
        rm -f "$RUN_LINK"  # a stale link of an earlier run
    elif [[ -e $RUN_LINK ]]; then
        die "$RUN_LINK exists and is not this script's link; is a configless Slurm running here?"
    fi
    mkdir -p "$(dirname "$RUN_LINK")" || die "cannot create $(dirname "$RUN_LINK") (root needed)"
    ln -s "$DIR" "$RUN_LINK"
}

unlink_runtime_conf() {
    if [[ -L $RUN_LINK && $(readlink "$RUN_LINK") == "$DIR" ]]; then
        rm -f "$RUN_LINK"
        rmdir "$(dirname "$RUN_LINK")" 2>/dev/null || true
    fi
}

cmd_env() { echo "export SLURM_CONF=$DIR/slurm.conf"; }

wait_for() {  # wait_for WHAT CMD...: retry CMD until it succeeds or START_TIMEOUT passes
    local what=$1 waited=0
    shift
    until "$@" >/dev/null 2>&1; do
        (( waited < START_TIMEOUT * 5 )) || { cmd_stop >/dev/null 2>&1; die "$what is not answering after ${START_TIMEOUT}s (logs in $DIR/log)"; }
        sleep 0.2
        waited=$((waited + 1))
    done
}

start_database() {  # a private mariadbd holding slurmdbd's tables
    local client
    client=$(find_bin mariadb)
    if [[ ! -d $DIR/mysql/mysql ]]; then
        "$(find_bin mariadb-install-db)" --defaults-file="$DIR/my.cnf" --auth-root-authentication-method=socket \
            --skip-test-db >"$DIR/log/mariadb-install-db.log" 2>&1 \
            || die "mariadb-install-db failed (log: $DIR/log/mariadb-install-db.log)"
    fi
    "$(find_bin mariadbd)" --defaults-file="$DIR/my.cnf" >/dev/null 2>&1 &
    disown
    wait_for "mariadbd" "$client" --no-defaults --socket="$DIR/mysql.sock" -uroot -e "select 1"
    "$client" --no-defaults --socket="$DIR/mysql.sock" -uroot -e "
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || die "could not create slurmdbd's database user"
}

node_state() { SLURM_CONF=$DIR/slurm.conf sinfo -h -N -o '%T' 2>/dev/null | head -1; }

cmd_start() {
    have_packages || die "Slurm is not installed (run: $0 install)"
    if pid_alive "$DIR/slurmctld.pid" && pid_alive "$DIR/slurmd.pid" && pid_alive "$DIR/slurmdbd.pid" \
        && pid_alive "$DIR/mariadbd.pid" && pid_alive "$DIR/munged.pid"; then
        say "already running ($DIR)"
        cmd_env
        return 0
    fi
    cmd_stop >/dev/null 2>&1 || true
    write_config
    link_runtime_conf
    export SLURM_CONF=$DIR/slurm.conf
    "$(find_bin munged)" --force --key-file="$DIR/munge.key" --socket="$DIR/munge.socket" \
        --pid-file="$DIR/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munged.seed" \
        || die "munged did not start (log: $DIR/log/munged.log)"
    start_database
    "$(find_bin slurmdbd)" || die "slurmdbd did not start (log: $DIR/log/slurmdbd.log)"
    wait_for "slurmdbd" sacctmgr -n list cluster
    sacctmgr -i add cluster kvcert >/dev/null 2>&1 || true
    sacctmgr -i add account "$ACCOUNT" Description="kvcert local cluster" Organization=kvcert >/dev/null 2>&1 || true
    sacctmgr -i add user "$(id -un)" Account="$ACCOUNT" >/dev/null 2>&1 || true
    sacctmgr -n -P list associations user="$(id -un)" account="$ACCOUNT" format=account | grep -qx "$ACCOUNT" \
        || die "could not register account $ACCOUNT for $(id -un) in slurmdbd (log: $DIR/log/slurmdbd.log)"
    "$(find_bin slurmctld)" -f "$SLURM_CONF" -c -i || die "slurmctld did not start (log: $DIR/log/slurmctld.log)"
    "$(find_bin slurmd)" -f "$SLURM_CONF" || die "slurmd did not start (log: $DIR/log/slurmd.log)"
    local waited=0 state=""
    while (( waited < START_TIMEOUT )); do
        state=$(node_state)
        case $state in
            idle) break ;;
            down*|drain*|*"*")  # a node left down by an earlier run: bring it back
                SLURM_CONF=$DIR/slurm.conf scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true ;;
        esac
        sleep 1
        waited=$((waited + 1))
    done
    if [[ $state != idle ]]; then
        say "the node is not idle after ${START_TIMEOUT}s (state '${state:-unknown}'); logs in $DIR/log"
        tail -n 5 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
        cmd_stop
        exit 1
    fi
    say "cluster 'kvcert' up: partition $PARTITION, account $ACCOUNT, node $(hostname -s) idle ($DIR)"
    cmd_env
}

stop_one() {  # stop_one NAME PIDFILE: TERM, wait, KILL; only the pid this script recorded
    local name=$1 pidfile=$2 pid i
    [[ -f $pidfile ]] || return 0
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        if kill -0 "$pid" 2>/dev/null; then
            say "$name ($pid) did not stop on TERM; killing it"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$pidfile"
}

cmd_stop() {
    if [[ -f $DIR/slurm.conf ]] && pid_alive "$DIR/slurmctld.pid"; then  # no job outlives the cluster
        SLURM_CONF=$DIR/slurm.conf scancel --cluster=kvcert --full --user="$(id -un)" >/dev/null 2>&1 || true
    fi
    stop_one slurmd "$DIR/slurmd.pid"
    stop_one slurmctld "$DIR/slurmctld.pid"
    stop_one slurmdbd "$DIR/slurmdbd.pid"
    stop_one mariadbd "$DIR/mariadbd.pid"
    stop_one munged "$DIR/munged.pid"
    unlink_runtime_conf
    say "stopped ($DIR)"
}

cmd_status() {
    local name
    for name in munged mariadbd slurmdbd slurmctld slurmd; do
        if pid_alive "$DIR/$name.pid"; then echo "$name: running ($(cat "$DIR/$name.pid"))"; else echo "$name: stopped"; fi
    done
    if pid_alive "$DIR/slurmctld.pid"; then SLURM_CONF=$DIR/slurm.conf sinfo; fi
}

cmd_run() {
    [[ ${1:-} == -- ]] && shift
    (( $# )) || die "run: give a command (run -- CMD ...)"
    cmd_install
    trap cmd_stop EXIT
    cmd_start >/dev/null
    export SLURM_CONF=$DIR/slurm.conf
    "$@"
}

action=${1:-}
shift || true
case $action in
    install) mkdir -p "$(dirname "$DIR")"; cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) cmd_env ;;
    run) cmd_run "$@" ;;
    *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2 ;;
esac
