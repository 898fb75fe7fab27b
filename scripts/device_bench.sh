#!/bin/bash
# The benchmarks whose goals a 2-core machine cannot show, run on a lent 16-core machine in one go.
#
#   bash scripts/device_bench.sh [PART...]   PART: env rankstart submit timeline rendezvous warm
#                                            (default: all but timeline)
#
# The machine has Python with pandas, cloudpickle and tqdm but no network: the rest of
# clusterbook's dependencies (Open MPI and mpi4py from PyPI, psutil, paramiko and what it needs) travel
# as wheels in .whl/ (see docs/development.md), clusterbook itself as this checkout's sdk/. Every
# figure is printed with the machine's core count and load; the whole output goes to $OUT/log
# where OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
log=${OUT:-/tmp}/log
exec > >(tee "$log") 2>&1
parts=${*:-env rankstart submit rendezvous warm}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/sdk OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

[ -x /tmp/v/bin/python ] || python3 -m venv --system-site-packages /tmp/v || exit 1
/tmp/v/bin/python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    $(ls .whl/*.whl | grep -v clusterbook-) || exit 1
export PATH=/tmp/v/bin:$PATH
py=/tmp/v/bin/python
say() { echo; echo "=== $* ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"; }

for part in $parts; do
    case $part in
    env)
        say env
        $py -c 'import sys, clusterbook, mpi4py; print(sys.version.split()[0], clusterbook.__version__, mpi4py.__version__)'
        for tool in sshd ssh ip unshare nsenter mpirun; do printf '%s: %s\n' $tool "$(command -v $tool || echo missing)"; done
        ;;
    rankstart)
        say "rank_start.py"
        (unset PYTHONDONTWRITEBYTECODE; timeout 120 $py benchmarks/rank_start.py --repeat 30)
        ;;
    submit)
        say "functions.py --part submit"
        timeout 240 $py benchmarks/functions.py --part submit --repeat 30
        ;;
    timeline)
        say "job_timeline.py (SPY=1: then the same under py-spy, wall clock, idle threads too)"
        (unset PYTHONDONTWRITEBYTECODE; timeout 120 $py benchmarks/job_timeline.py --repeat 30
         if [ -n "${SPY-}" ] && command -v py-spy >/dev/null; then
             timeout 180 py-spy record --idle -r 2000 -f raw -o "${OUT:-/tmp}/timeline.spy" -- \
                 $py benchmarks/job_timeline.py --repeat 60 >/dev/null
         fi)
        ;;
    rendezvous)
        say "rendezvous.py --parts 4, then --parts 1,2 at 64 processes"
        timeout 300 $py benchmarks/rendezvous.py --parts 4 --repeat 1
        timeout 240 $py benchmarks/rendezvous.py --parts 1,2 --sizes 64 --repeat 5
        ;;
    warm)
        say "warm.py --hosts 2"
        if command -v sshd >/dev/null && command -v ip >/dev/null; then
            timeout 240 $py benchmarks/warm.py --repeat 8 --hosts 2
        else
            echo "skipped: no sshd or ip on this machine (fake hosts need both)"
        fi
        ;;
    *) echo "unknown part $part (env, rankstart, submit, timeline, rendezvous, warm)"; exit 2 ;;
    esac
done
