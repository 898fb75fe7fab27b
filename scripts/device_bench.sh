#!/bin/bash
# The benchmarks whose goals a 2-core machine cannot show, run on a lent 16-core machine in one go.
#
#   bash scripts/device_bench.sh [PART...]   PART: env rankstart submit timeline rendezvous
#                                            fakehosts warm warm4 (default: env rankstart
#                                            submit rendezvous warm)
#
# The machine has Python with pandas, cloudpickle and tqdm but no network: the rest of
# clusterbook's dependencies (Open MPI and mpi4py from PyPI, psutil, paramiko and what it needs,
# pytest for the fake hosts' helpers) travel as wheels in .whl/ (see docs/development.md),
# clusterbook itself as this checkout's sdk/. It has no sshd, ssh or ip either: fake hosts
# (warm, warm4) use the ones that travel in .devtools/ (bin/ and the libraries they need in
# lib/, found through their rpath; see docs/development.md). Every figure is printed with the
# machine's core count and load; the whole output goes to $OUT/log where OUT is set.
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
# clusterbook for the venv's Python wherever it starts (a fake host's ssh session has no PYTHONPATH)
echo "$PWD/sdk" > "$($py -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/clusterbook-checkout.pth"
say() { echo; echo "=== $* ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"; }
# sshd, ssh and ip for fake hosts: the machine's, else those of .devtools/, linked into
# /usr/local/bin: on the default PATH, where the fake hosts' ssh sessions find them too (Open
# MPI's daemon there looks for ssh, its launch agent; without one it ends at its first
# message). With sshd's privilege separation user and directory. Fails, saying why, where
# fake hosts cannot be made.
fakehosts() {
    for tool in ip ssh ssh-keygen sshd; do
        command -v $tool >/dev/null && continue
        [ -x .devtools/bin/$tool ] || { echo "no $tool, and none in .devtools/"; return 1; }
        ln -sf "$PWD/.devtools/bin/$tool" /usr/local/bin/$tool
    done
    getent passwd sshd >/dev/null || useradd -r -M -d /run/sshd -s /usr/sbin/nologin sshd \
        || { echo "no sshd user, and useradd failed"; return 1; }
    mkdir -p /run/sshd && chmod 755 /run/sshd
    ip netns add cbprobe && ip netns del cbprobe || { echo "no network namespaces here"; return 1; }
    ip link add cbprobe0 type bridge && ip link del cbprobe0 || { echo "no bridges here"; return 1; }
}

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
    fakehosts)
        say "device_fakehosts.py"
        if fakehosts; then timeout 120 $py scripts/device_fakehosts.py; fi
        ;;
    warm|warm4)
        hosts=2; [ $part = warm4 ] && hosts=4
        say "warm.py --hosts $hosts"
        if fakehosts; then
            timeout 240 $py benchmarks/warm.py --repeat 8 --hosts $hosts
        else
            echo "skipped: fake hosts cannot be made here (above: why)"
        fi
        ;;
    *) echo "unknown part $part (env rankstart submit timeline rendezvous fakehosts warm warm4)"; exit 2 ;;
    esac
done
