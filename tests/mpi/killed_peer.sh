#!/bin/sh
# killed_peer.sh PROGRAM MPIEXEC [ARGS...] - run PROGRAM --kill-rank 3 as
# every rank of a job: rank 3 kills itself (SIGKILL) while the others await
# a message from it. What Open MPI 4.1 does, checked here, within a bounded
# time each (no rank left hanging in an await):
#  1. By default mpiexec notices a rank that died without finalising and
#     ends the whole job, the awaiting ranks included: the job fails and
#     says that rank 3 was killed.
#  2. With --enable-recovery the job goes on, and MPI tells the others
#     nothing: their receive from rank 3 stays pending. A deadline bounds
#     the await (WEFT_ETIMEDOUT after 2 s); each survivor then cancels the
#     receive, which completes as cancelled, and leaves without
#     MPI_Finalize (which may wait for the dead rank for good).
set -u
program=$1
shift
limit=60
out=$(mktemp)
trap 'rm -f "$out"' EXIT
failed=0

run() { # run MPIEXEC-OPTIONS... -- PROGRAM-ARGS...: sets rc, took; output in $out
    start=$(date +%s)
    timeout -s KILL $limit "$@" >"$out" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    cat "$out"
    echo "killed_peer: mpiexec exited with $rc after ${took}s"
    if [ $took -ge $limit ]; then
        echo "killed_peer: FAILED: the job hung (killed after ${limit}s)" >&2
        failed=1
    fi
}

echo "killed_peer: 1. the default: mpiexec ends the job"
run "$@" "$program" --kill-rank 3
if [ $rc -eq 0 ]; then
    echo "killed_peer: FAILED: the job succeeded although rank 3 was killed" >&2
    failed=1
fi
if ! grep -q "process rank 3 .*exited on signal 9" "$out"; then
    echo "killed_peer: FAILED: mpiexec did not report rank 3's death" >&2
    failed=1
fi

echo "killed_peer: 2. --enable-recovery: the survivors' deadline ends their await"
run "$@" --enable-recovery "$program" --kill-rank 3 2
for r in 0 1 2; do
    if ! grep -q "rank $r: the await of killed rank 3 ended after .*: timed out" "$out" ||
        ! grep -q "rank $r: the receive from killed rank 3: cancelled" "$out"; then
        echo "killed_peer: FAILED: rank $r did not time out, cancel and go on" >&2
        failed=1
    fi
done

[ $failed -eq 0 ] && echo "killed_peer: passed"
exit $failed
