#!/usr/bin/env bash
# run.sh on a real Slurm: a one-node cluster on this host (Debian's slurm-wlm and munge; slurmctld and slurmd as
# root, proctrack/linuxproc, task/none, one partition), then `bash shells/run.sh <a CPU launch script>`: the job trains
# under sbatch with Ray started by srun; a short time limit's signal saves at a step boundary; the requeued job resumes
# from that checkpoint with the buffer. `make slurm-check` (root; installs the packages when missing; not in make test).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${WORK:-/tmp/darl-slurm-check}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
log() { echo "[slurm-check] $*"; }
[[ "$(id -u)" == 0 ]] || { echo "slurm_check.sh: run as root (it starts slurmctld and slurmd)" >&2; exit 1; }
command -v slurmctld >/dev/null || { apt-get update -q && apt-get install -y -q slurm-wlm munge; }

# the cluster: this host, one partition
HOST="$(hostname -s)"
CPUS="$(nproc)"
MEM_MB="$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 1024 ))"
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm "$WORK"
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=darlcheck
SlurmctldHost=$HOST
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
MpiDefault=none
JobRequeue=1
KillWait=30
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=check Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
pkill -x slurmctld || true; pkill -x slurmd || true; pkill -x munged || true; sleep 1
[[ -s /etc/munge/munge.key ]] || mungekey --create
mkdir -p /run/munge && chown munge:munge /run/munge
runuser -u munge -- /usr/sbin/munged
slurmctld -c && slurmd -c
for _ in $(seq 30); do sinfo -h -o %T 2>/dev/null | grep -qE "idle|mixed" && break; sleep 1; done
sinfo
