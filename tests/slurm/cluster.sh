#!/bin/bash
# A single-node Slurm cluster on this machine for `make test-slurm` (and CI): no systemd needed.
#
#   tests/slurm/cluster.sh start    install slurmctld/slurmd/munge with apt-get if missing, start them, wait for idle
#   tests/slurm/cluster.sh stop     cancel the cluster's jobs, then stop exactly the daemons `start` started
#                                   (their pids are kept in $DIR); a `start` that fails stops what it started
#
# Needs root (apt-get, /etc/slurm/slurm.conf, daemons). State, logs, the job completion file: $GRTOOL_SLURM_DIR
# (default /tmp/grtool-slurm). A slurm.conf that this script did not write is never replaced: on a machine
# with a real Slurm, use that one and do not run this script.
set -euo pipefail
DIR=${GRTOOL_SLURM_DIR:-/tmp/grtool-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# written by grtool tests/slurm/cluster.sh"

stop_pid() {  # the daemon whose pid this script recorded, by that pid only
    local file=$DIR/$1.started
    [ -f "$file" ] || return 0
    local pid; pid=$(cat "$file")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$file"
    echo "stopped $1 (pid $pid)"
}

running() { [ -f "$DIR/$1.started" ] && kill -0 "$(cat "$DIR/$1.started")" 2>/dev/null; }

stop_all() {
    # The jobs first: a job's slurmstepd and processes outlive slurmd, and a job left queued in the saved
    # state would run again at the next start. scancel sends SIGTERM, then SIGKILL after KillWait.
    if running slurmctld && running slurmd; then
        squeue -h -o %A 2>/dev/null | xargs -r scancel 2>/dev/null || true
        for _ in $(seq 100); do [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.3; done
        [ -z "$(squeue -h -o %A 2>/dev/null)" ] || echo "warning: jobs still listed after scancel: $(squeue -h -o '%A %T' | tr '\n' ' ')" >&2
    fi
    stop_pid slurmd
    stop_pid slurmctld
    stop_pid munged
}

case "${1:-}" in
start)
    if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        # No service started by the packages' install scripts (where systemd runs, it would start munge and
        # the Slurm daemons on Debian's defaults): this script starts the daemons it stops. policy-rc.d says
        # so to invoke-rc.d and deb-systemd-invoke; one that is already there is kept.
        policy=""
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            policy=/usr/sbin/policy-rc.d
            printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy"
        fi
        rc=0; apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null || rc=$?
        [ -z "$policy" ] || rm -f "$policy"
        [ "$rc" -eq 0 ] || { echo "error: apt-get install slurmctld slurmd slurm-client munge failed (exit $rc)" >&2; exit "$rc"; }
    fi
    mkdir -p "$DIR/state" "$DIR/spool"
    if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
        echo "error: $CONF exists and was not written by this script; not replacing it" >&2; exit 2
    fi
    for d in munged slurmctld slurmd; do
        if running "$d"; then
            echo "error: $d from an earlier start is still running (pid $(cat "$DIR/$d.started")); run: $0 stop" >&2; exit 2
        fi
    done
    # From here on a failure stops what this start started (make test-slurm runs `stop` only after a start).
    trap 'rc=$?; if [ "$rc" -ne 0 ]; then stop_all; fi' EXIT
    mkdir -p /etc/slurm
    cat > "$CONF" <<CONF
$MARK
ClusterName=grtooltest
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.log
MpiDefault=none
MinJobAge=3600
AuthInfo=cred_expire=5
SchedulerParameters=bf_interval=1,sched_interval=2
KillWait=15
ReturnToService=2
NodeName=localhost CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
    # munge: reuse a running one, else start it as the munge user (and stop it again on `stop`)
    if ! munge -n >/dev/null 2>&1; then
        mkdir -p /run/munge && chown munge:munge /run/munge && chmod 0755 /run/munge
        [ -f /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || create-munge-key -f; chown munge:munge /etc/munge/munge.key; }
        runuser -u munge -- /usr/sbin/munged
        for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && munge -n >/dev/null 2>&1 && break; sleep 0.2; done
        [ ! -s /run/munge/munged.pid ] || cat /run/munge/munged.pid > "$DIR/munged.started"  # one that does not answer is stopped too
        munge -n >/dev/null 2>&1 || { echo "error: munged does not answer; see /var/log/munge/munged.log" >&2; exit 1; }
    fi
    slurmctld -D -i >"$DIR/slurmctld.stderr" 2>&1 &
    echo $! > "$DIR/slurmctld.started"
    slurmd -D -N localhost >"$DIR/slurmd.stderr" 2>&1 &
    echo $! > "$DIR/slurmd.started"
    for _ in $(seq 60); do
        if sinfo -h -o %t 2>/dev/null | grep -qx idle; then echo "slurm up: $(sinfo -h -o '%P %t %c')"; exit 0; fi
        sleep 0.5
    done
    echo "error: the node did not become idle; see $DIR/*.log and $DIR/*.stderr" >&2
    exit 1
    ;;
stop)
    stop_all
    ;;
*)
    echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
