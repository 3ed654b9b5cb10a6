#!/usr/bin/env bash
# slurm-local.sh — bring a real single-node SLURM cluster (with accounting)
# up and down on this machine.
#
#   bash scripts/slurm-local.sh up       # install (if needed), configure, start, wait for idle
#   bash scripts/slurm-local.sh down     # cancel jobs, stop all daemons (by PID file)
#   bash scripts/slurm-local.sh status   # show daemons and sinfo
#
# Target: Debian 12 (SLURM 22.05), run as root, *without* systemd and without
# usable cgroups (containers / CI sandboxes). Every daemon is therefore started
# directly and tracked through its own PID file; nothing relies on an init
# system. Both `up` and `down` are idempotent and can be repeated freely.
#
# Why accounting (slurmdbd + MariaDB) at all: submitit asks `sacct` for the
# state of jobs that have left the queue (e.g. to tell COMPLETED from FAILED
# or notice a job that died), so `sacct` has to work.
set -euo pipefail

# --------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------
CLUSTER_NAME=rltrain
PARTITION=debug
MEM_PERCENT=80        # RealMemory advertised = this % of what `slurmd -C` sees
                      # (above the real value slurmd gets the node drained)
CRED_EXPIRE=10        # s; also the delay before a requeued job may start again
                      # (default 120 s; SLURM's minimum is 5)
WAIT_TIMEOUT=60       # s to wait for each daemon / the node to become ready

SLURM_PKGS=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)

SLURM_ETC=/etc/slurm
SLURM_CONF=$SLURM_ETC/slurm.conf
SLURMDBD_CONF=$SLURM_ETC/slurmdbd.conf
SLURM_RUN=/run/slurm                # PID files of slurmdbd/slurmctld/slurmd
SLURM_LOG=/var/log/slurm
CTLD_SPOOL=/var/spool/slurmctld     # StateSaveLocation (owned by SlurmUser)
SLURMD_SPOOL=/var/spool/slurmd

MUNGE_KEY=/etc/munge/munge.key
MUNGE_RUN=/run/munge
MUNGE_PID=$MUNGE_RUN/munged.pid

MYSQL_DATADIR=/var/lib/mysql
MYSQL_RUN=/run/mysqld
MYSQL_SOCK=$MYSQL_RUN/mysqld.sock
MYSQL_PID=$MYSQL_RUN/mysqld.pid
MYSQL_LOG=/var/log/mysql/error.log
DB_NAME=slurm_acct_db
DB_USER=slurm

SLURMDBD_PID=$SLURM_RUN/slurmdbd.pid
SLURMCTLD_PID=$SLURM_RUN/slurmctld.pid
SLURMD_PID=$SLURM_RUN/slurmd.pid

export SLURM_CONF

# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------
log()  { printf '[slurm-local +%ss] %s\n' "$SECONDS" "$*"; }
warn() { printf '[slurm-local] WARNING: %s\n' "$*" >&2; }
die() {
    printf '[slurm-local] ERROR: %s\n' "$*" >&2
    exit 1
}

# Print the tail of a log file to stderr (used when a daemon fails to start).
show_log() {
    local f=$1
    if [[ -f $f ]]; then
        printf -- '----- last lines of %s -----\n' "$f" >&2
        tail -n 25 "$f" >&2 || true
        printf -- '-----\n' >&2
    fi
}

# running PIDFILE NAME -> prints the PID if the PID file names a live process
# whose command name is NAME. The name check guards against stale PID files
# whose number has been reused by an unrelated process (we must never signal
# that one in `down`).
running() {
    local pidfile=$1 name=$2 pid comm
    [[ -s $pidfile ]] || return 1
    pid=$(tr -dc '0-9' <"$pidfile")
    [[ -n $pid ]] || return 1
    alive "$pid" || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    [[ $comm == "$name" ]] || return 1
    echo "$pid"
}

# wait_for SECONDS DESCRIPTION CMD... -> retry CMD once a second until it
# succeeds; fail (return 1) after SECONDS.
wait_for() {
    local timeout=$1 what=$2
    shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            warn "timed out after ${timeout}s waiting for $what"
            return 1
        fi
        sleep 1
    done
}

# alive PID -> true while PID exists and has not exited. Daemons that were
# detached are reparented to PID 1, which here may be slow to reap them, so a
# zombie counts as exited (unless other threads of it still run).
alive() {
    local state threads
    state=$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null) || return 1
    threads=$(awk '/^Threads:/ {print $2}' "/proc/$1/status" 2>/dev/null) || return 1
    [[ -n $state ]] || return 1
    [[ $state != Z || ${threads:-0} -gt 1 ]]
}

# wait_daemon PIDFILE NAME SECONDS DESCRIPTION CMD... -> like wait_for, but
# give up early (after a 10 s grace period for the PID file to appear) when
# the daemon is no longer running, so a crash is reported at once instead of
# after the full timeout.
# start_daemon PIDFILE NAME LOGFILE CMD...: run CMD (a daemon that detaches itself and writes PIDFILE)
# unless NAME already runs from PIDFILE; on failure show LOGFILE and stop.
start_daemon() {
    local pidfile=$1 name=$2 logfile=$3
    shift 3
    if running "$pidfile" "$name" >/dev/null; then
        log "$name already running"
        return 0
    fi
    log "starting $name"
    rm -f "$pidfile"
    "$@" || { show_log "$logfile"; die "$name failed to start"; }
}

wait_daemon() {
    local pidfile=$1 name=$2 timeout=$3 what=$4
    shift 4
    local deadline=$((SECONDS + timeout)) grace=$((SECONDS + 10))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= grace)) && ! running "$pidfile" "$name" >/dev/null; then
            warn "$name is not running (it exited or never wrote $pidfile)"
            return 1
        fi
        if ((SECONDS >= deadline)); then
            warn "timed out after ${timeout}s waiting for $what"
            return 1
        fi
        sleep 1
    done
}

# stop_daemon PIDFILE NAME -> SIGTERM, wait up to 30 s for it to exit, then
# SIGKILL. Silent no-op when it is not running.
stop_daemon() {
    local pidfile=$1 name=$2 pid i
    if ! pid=$(running "$pidfile" "$name"); then
        rm -f "$pidfile"
        return 0
    fi
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 300; i++)); do
        alive "$pid" || break
        sleep 0.1
    done
    if alive "$pid"; then
        warn "$name (pid $pid) ignored SIGTERM for 30 s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.5
    fi
    rm -f "$pidfile"
}

# install_file SRC DEST OWNER MODE -> move SRC over DEST only if the content
# differs; returns 0 if DEST changed, 1 if it was already identical.
install_file() {
    local src=$1 dest=$2 owner=$3 mode=$4
    if [[ -f $dest ]] && cmp -s "$src" "$dest"; then
        rm -f "$src"
        chown "$owner" "$dest"
        chmod "$mode" "$dest"
        return 1
    fi
    install -o "${owner%%:*}" -g "${owner##*:}" -m "$mode" "$src" "$dest"
    rm -f "$src"
    return 0
}

sql() { mariadb --protocol=socket --socket="$MYSQL_SOCK" -uroot -N -B -e "$1"; }

# --------------------------------------------------------------------------
# up: steps
# --------------------------------------------------------------------------
install_packages() {
    local missing=() p
    for p in "${SLURM_PKGS[@]}"; do
        if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true) != "install ok installed" ]]; then
            missing+=("$p")
        fi
    done
    ((${#missing[@]} == 0)) && return 0

    command -v apt-get >/dev/null || die "apt-get not found; need Debian/Ubuntu to install: ${missing[*]}"
    log "installing packages: ${missing[*]}"
    # Without systemd the packages' maintainer scripts would try to start the
    # daemons through init scripts (with their own PID files, fighting ours).
    # A policy-rc.d that answers 101 tells invoke-rc.d "don't start anything";
    # only add it temporarily if the machine does not already have one.
    local policy=/usr/sbin/policy-rc.d added_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        added_policy=1
    fi
    local rc=0
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || rc=$?
    if ((rc == 0)); then
        apt-get install -y -qq --no-install-recommends \
            -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
            "${missing[@]}" >/tmp/slurm-local-apt.log 2>&1 || rc=$?
    fi
    if ((added_policy)); then rm -f "$policy"; fi
    if ((rc != 0)); then
        tail -n 30 /tmp/slurm-local-apt.log >&2 || true
        die "apt-get failed (rc=$rc) installing: ${missing[*]} (full log: /tmp/slurm-local-apt.log)"
    fi
}

setup_dirs() {
    # SlurmUser=slurm writes the controller state and PID files; slurmd
    # (root) writes its spool. The Debian packages create the users.
    id slurm >/dev/null 2>&1 || die "user 'slurm' missing (should come with the slurm packages)"
    id munge >/dev/null 2>&1 || die "user 'munge' missing (should come with the munge package)"
    id mysql >/dev/null 2>&1 || die "user 'mysql' missing (should come with mariadb-server)"
    install -d -o slurm -g slurm -m 755 "$SLURM_RUN" "$SLURM_LOG" "$CTLD_SPOOL"
    install -d -o root -g root -m 755 "$SLURMD_SPOOL" "$SLURM_ETC"
    install -d -o munge -g munge -m 700 /etc/munge /var/log/munge
    install -d -o munge -g munge -m 711 /var/lib/munge
    install -d -o munge -g munge -m 755 "$MUNGE_RUN"
    install -d -o mysql -g mysql -m 755 "$MYSQL_RUN" "$(dirname "$MYSQL_LOG")"
}

start_munge() {
    # munged refuses a key that is not private to the munge user.
    if [[ ! -s $MUNGE_KEY ]]; then
        log "creating munge key $MUNGE_KEY"
        dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
    fi
    chown munge:munge "$MUNGE_KEY"
    chmod 600 "$MUNGE_KEY"

    # munged forks into the background itself and writes the PID file.
    start_daemon "$MUNGE_PID" munged /var/log/munge/munged.log runuser -u munge -- munged --pid-file="$MUNGE_PID"
    wait_daemon "$MUNGE_PID" munged "$WAIT_TIMEOUT" "munge to work" sh -c 'munge -n | unmunge' ||
        { show_log /var/log/munge/munged.log; die "munge does not work"; }
}

start_mariadb() {
    # Datadir is normally initialised by the package's postinst; do it here if
    # that did not happen (e.g. the directory was wiped).
    if [[ ! -d $MYSQL_DATADIR/mysql ]]; then
        log "initialising MariaDB datadir $MYSQL_DATADIR"
        install -d -o mysql -g mysql -m 755 "$MYSQL_DATADIR"
        mariadb-install-db --user=mysql --datadir="$MYSQL_DATADIR" \
            --auth-root-authentication-method=socket >/tmp/slurm-local-mariadb-install.log 2>&1 ||
            { tail -n 30 /tmp/slurm-local-mariadb-install.log >&2; die "mariadb-install-db failed"; }
    fi

    if running "$MYSQL_PID" mariadbd >/dev/null; then
        log "mariadbd already running"
    else
        log "starting mariadbd"
        rm -f "$MYSQL_PID"
        # mariadbd does not daemonise itself: detach it (setsid, no stdin) so it
        # survives this script. It drops to the mysql user and writes its PID
        # file; its error log is its stderr (a --log-error file would be opened
        # as mysql). innodb_lock_wait_timeout=900 is what slurmdbd recommends.
        setsid mariadbd --user=mysql --datadir="$MYSQL_DATADIR" \
            --pid-file="$MYSQL_PID" --socket="$MYSQL_SOCK" \
            --bind-address=127.0.0.1 --innodb-lock-wait-timeout=900 \
            </dev/null >>"$MYSQL_LOG" 2>&1 &
    fi
    wait_daemon "$MYSQL_PID" mariadbd "$WAIT_TIMEOUT" "mariadbd" mariadb-admin --socket="$MYSQL_SOCK" -uroot ping ||
        { show_log "$MYSQL_LOG"; die "mariadbd did not come up"; }
    wait_for 10 "mariadbd PID file" running "$MYSQL_PID" mariadbd ||
        die "mariadbd runs but wrote no PID file $MYSQL_PID"
}

setup_slurmdbd() {
    # Reuse the DB password from an existing slurmdbd.conf so re-running `up`
    # does not change anything; otherwise make a random one.
    local pass=""
    if [[ -f $SLURMDBD_CONF ]]; then
        pass=$(sed -n 's/^StoragePass=//p' "$SLURMDBD_CONF" | head -n1)
    fi
    if [[ -z $pass ]]; then
        pass=$(tr -dc 'A-Za-z0-9' </dev/urandom | head -c 24 || true)
    fi

    # Database + user for slurmdbd (root logs in through the unix socket).
    sql "CREATE DATABASE IF NOT EXISTS $DB_NAME;
         CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$pass';
         ALTER USER '$DB_USER'@'localhost' IDENTIFIED BY '$pass';
         GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'localhost';
         FLUSH PRIVILEGES;" || die "could not create the slurmdbd database/user"

    local tmp
    tmp=$(mktemp)
    cat >"$tmp" <<EOF
# Generated by scripts/slurm-local.sh — edits are overwritten by 'up'.
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=slurm
DebugLevel=info
LogFile=$SLURM_LOG/slurmdbd.log
PidFile=$SLURMDBD_PID
StorageType=accounting_storage/mysql
StorageHost=localhost
StoragePort=3306
StorageUser=$DB_USER
StoragePass=$pass
StorageLoc=$DB_NAME
EOF
    # slurmdbd refuses to start unless its config (it holds a password) is
    # owned by SlurmUser and not readable by others.
    if install_file "$tmp" "$SLURMDBD_CONF" slurm:slurm 600; then
        log "wrote $SLURMDBD_CONF"
        if running "$SLURMDBD_PID" slurmdbd >/dev/null; then
            stop_daemon "$SLURMDBD_PID" slurmdbd   # restart below with the new config
        fi
    fi
}

start_slurmdbd() {
    # Daemonises itself and writes PidFile.
    start_daemon "$SLURMDBD_PID" slurmdbd "$SLURM_LOG/slurmdbd.log" slurmdbd
    # First start creates the tables, which takes a few seconds.
    wait_daemon "$SLURMDBD_PID" slurmdbd "$WAIT_TIMEOUT" "slurmdbd" sacctmgr -n -P list cluster ||
        { show_log "$SLURM_LOG/slurmdbd.log"; die "slurmdbd did not answer"; }
}

register_cluster() {
    # Must exist before slurmctld registers with slurmdbd.
    if sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER_NAME"; then
        return 0
    fi
    log "registering cluster '$CLUSTER_NAME' in the accounting DB"
    sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null ||
        die "sacctmgr add cluster $CLUSTER_NAME failed"
}

# Writes slurm.conf; sets SLURM_CONF_CHANGED=1 if its content changed.
SLURM_CONF_CHANGED=0
write_slurm_conf() {
    local node_line node_name real_mem capped_mem cpus def_mem
    node_line=$(slurmd -C | head -n1)
    [[ $node_line == NodeName=* ]] || die "unexpected 'slurmd -C' output: $node_line"
    node_name=$(sed -n 's/^NodeName=\([^ ]*\).*/\1/p' <<<"$node_line")
    real_mem=$(grep -o 'RealMemory=[0-9]*' <<<"$node_line" | cut -d= -f2)
    cpus=$(grep -o 'CPUs=[0-9]*' <<<"$node_line" | cut -d= -f2)
    [[ -n $node_name && -n $real_mem && -n $cpus ]] || die "cannot parse 'slurmd -C': $node_line"
    # RealMemory above what slurmd measures => node DRAINED ("Low RealMemory").
    capped_mem=$((real_mem * MEM_PERCENT / 100))
    # Without DefMemPerCPU a job gets the whole node's memory by default under
    # CR_*_Memory, so jobs would run one at a time. Memory/CPU lets all CPUs
    # be used by 1-CPU jobs.
    def_mem=$((capped_mem / cpus))
    # NodeAddr=127.0.0.1: don't depend on the hostname resolving.
    node_line="${node_line/RealMemory=$real_mem/RealMemory=$capped_mem} NodeAddr=127.0.0.1 State=UNKNOWN"

    local tmp
    tmp=$(mktemp)
    cat >"$tmp" <<EOF
# Generated by scripts/slurm-local.sh — edits are overwritten by 'up'.
# Single-node cluster for local runs and CI (no systemd, no cgroups).
ClusterName=$CLUSTER_NAME
SlurmctldHost=$node_name(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
# AuthInfo cred_expire also sets how long a requeued job waits before it may
# start again (default 120 s).
AuthInfo=cred_expire=$CRED_EXPIRE

StateSaveLocation=$CTLD_SPOOL
SlurmdSpoolDir=$SLURMD_SPOOL
SlurmctldPidFile=$SLURMCTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$SLURM_LOG/slurmctld.log
SlurmdLogFile=$SLURM_LOG/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info

# No cgroups here: track processes by walking /proc, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
# No mail on this machine; the default /bin/mail only produces log errors.
MailProg=/bin/true

# Share the node between jobs by core and memory.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$def_mem

# A DOWN node comes back by itself when slurmd registers with a valid config.
ReturnToService=2
# Jobs may be requeued (scontrol requeue, submitit's preemption/timeout path).
JobRequeue=1

# Short timers so tests are quick: SIGTERM->SIGKILL after 5 s, finished jobs
# leave squeue/scontrol after 30 s (sacct keeps them forever).
KillWait=5
MinJobAge=30
InactiveLimit=0
Waittime=0
SlurmdTimeout=300
SlurmctldTimeout=120
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=5,bf_interval=5

# Accounting through slurmdbd, so that sacct works (submitit relies on it).
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none

$node_line
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    if install_file "$tmp" "$SLURM_CONF" root:root 644; then
        SLURM_CONF_CHANGED=1
    fi
}

start_slurmctld() {
    # Daemonises itself (as SlurmUser) and writes SlurmctldPidFile; state
    # in StateSaveLocation is recovered across down/up.
    start_daemon "$SLURMCTLD_PID" slurmctld "$SLURM_LOG/slurmctld.log" slurmctld
    wait_daemon "$SLURMCTLD_PID" slurmctld "$WAIT_TIMEOUT" "slurmctld" scontrol ping ||
        { show_log "$SLURM_LOG/slurmctld.log"; die "slurmctld did not answer"; }
    # scontrol ping succeeds as soon as the port is open; check the daemon kept running.
    running "$SLURMCTLD_PID" slurmctld >/dev/null ||
        { show_log "$SLURM_LOG/slurmctld.log"; die "slurmctld is not running"; }
}

start_slurmd() {
    start_daemon "$SLURMD_PID" slurmd "$SLURM_LOG/slurmd.log" slurmd
}

node_state() { sinfo -h -N -o %T 2>/dev/null | head -n1; }

wait_node_idle() {
    local node deadline=$((SECONDS + WAIT_TIMEOUT)) grace=$((SECONDS + 10)) state resumed=0
    node=$(sinfo -h -N -o %N | head -n1)
    while :; do
        state=$(node_state || true)
        case $state in
            idle | mixed | allocated | completing) break ;;
            drain* | down* | fail*)
                # E.g. left over from an earlier run with a different config or
                # an unclean stop. The config is right now, so resume it.
                if ((!resumed)); then
                    log "node $node is '$state'; resuming it"
                    scontrol update NodeName="$node" State=RESUME || true
                    resumed=1
                fi
                ;;
        esac
        if ((SECONDS >= grace)); then
            running "$SLURMD_PID" slurmd >/dev/null ||
                { show_log "$SLURM_LOG/slurmd.log"; die "slurmd is not running"; }
            running "$SLURMCTLD_PID" slurmctld >/dev/null ||
                { show_log "$SLURM_LOG/slurmctld.log"; die "slurmctld is not running"; }
        fi
        if ((SECONDS >= deadline)); then
            sinfo -N -l >&2 || true
            scontrol show node "$node" >&2 || true
            show_log "$SLURM_LOG/slurmd.log"
            show_log "$SLURM_LOG/slurmctld.log"
            die "node $node not idle after ${WAIT_TIMEOUT}s (state: '${state:-unknown}')"
        fi
        sleep 1
    done
}

cmd_up() {
    [[ $(id -u) == 0 ]] || die "must run as root"
    local t0=$SECONDS
    install_packages
    setup_dirs
    # slurm.conf first: every client (sacctmgr included) needs it, without it
    # they fall back to a DNS SRV lookup and fail.
    write_slurm_conf
    if ((SLURM_CONF_CHANGED)); then
        log "wrote $SLURM_CONF"
        # Running daemons must be restarted to pick up node/partition changes.
        stop_daemon "$SLURMD_PID" slurmd
        stop_daemon "$SLURMCTLD_PID" slurmctld
    fi
    start_munge
    start_mariadb
    setup_slurmdbd
    start_slurmdbd
    register_cluster
    start_slurmctld
    start_slurmd
    wait_node_idle

    # Summary.
    local sacct_ok
    if sacct -n -X -a --starttime=now-1days -o JobID >/dev/null 2>&1; then
        sacct_ok="works"
    else
        die "cluster is up but 'sacct' fails — accounting is broken (see $SLURM_LOG/slurmdbd.log)"
    fi
    log "cluster '$CLUSTER_NAME' is up after $((SECONDS - t0))s"
    sinfo
    log "sacct $sacct_ok (accounting via slurmdbd + MariaDB)"
    log "logs: $SLURM_LOG/  stop with: bash $0 down"
}

# --------------------------------------------------------------------------
# down
# --------------------------------------------------------------------------
cmd_down() {
    [[ $(id -u) == 0 ]] || die "must run as root"
    # Cancel jobs first: slurmstepd + job processes outlive slurmd otherwise.
    if running "$SLURMCTLD_PID" slurmctld >/dev/null && command -v squeue >/dev/null; then
        local jobs
        jobs=$(timeout 15 squeue -h -o %A 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            log "cancelling jobs: $(tr '\n' ' ' <<<"$jobs")"
            # shellcheck disable=SC2086
            timeout 15 scancel $jobs 2>/dev/null || true
            # Give slurmd time to kill them (KillWait=5) and report back.
            # shellcheck disable=SC2016  # $(...) is for the inner sh
            wait_for 20 "jobs to finish" sh -c '[ -z "$(squeue -h -t R,CG -o %A)" ]' || true
        fi
    fi
    stop_daemon "$SLURMD_PID" slurmd
    stop_daemon "$SLURMCTLD_PID" slurmctld
    stop_daemon "$SLURMDBD_PID" slurmdbd
    stop_daemon "$MYSQL_PID" mariadbd
    stop_daemon "$MUNGE_PID" munged
    log "all SLURM daemons stopped"
}

# --------------------------------------------------------------------------
# status
# --------------------------------------------------------------------------
cmd_status() {
    local pair pidfile name pid all=1
    for pair in "$MUNGE_PID:munged" "$MYSQL_PID:mariadbd" "$SLURMDBD_PID:slurmdbd" \
        "$SLURMCTLD_PID:slurmctld" "$SLURMD_PID:slurmd"; do
        pidfile=${pair%%:*}
        name=${pair##*:}
        if pid=$(running "$pidfile" "$name"); then
            printf '  %-10s running (pid %s)\n' "$name" "$pid"
        else
            printf '  %-10s stopped\n' "$name"
            all=0
        fi
    done
    if ((all)) && sinfo 2>/dev/null; then
        log "up"
    else
        log "down (or partly up)"
        return 1
    fi
}

case ${1:-} in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *)
        echo "usage: $0 up|down|status" >&2
        exit 2
        ;;
esac
