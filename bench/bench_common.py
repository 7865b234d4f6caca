"""bench_common.py - what the Python GPU benchmarks share: a call's time
on the GPU by CUDA events, the machine and commit a run is taken on, and
the rows (bench/results.py) of a run of (case, metric, value, ...) tuples.

Each benchmark's folder is one below this one: a script puts this folder on
sys.path (sys.path.insert(0, the parent of its own folder)) and imports
what it needs.
torch is never imported here: the caller passes its module in, so that a
script's --help, --check-layout and unit tests run without PyTorch.
"""
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def time_per_call(torch, fn, reps, min_ms, warmup=3, max_iters=1000):
    """Median seconds per call of fn over reps runs of back-to-back calls,
    each run at least min_ms long (at most max_iters calls), timed with
    CUDA events on the current stream after warmup calls."""
    return time_alternating(torch, [fn], reps, min_ms, warmup, max_iters)[0]


def time_alternating(torch, fns, reps, min_ms, warmup=3, max_iters=1000):
    """time_per_call for several callables at once (a median each), their
    runs taken in turn (a run of the first, of the second, ..., then
    again), so a clock that drifts as the GPU warms weighs on each alike."""
    iters = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for fn in fns:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        iters.append(int(min(max(min_ms / max(start.elapsed_time(end), 1e-3), 3), max_iters)))
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, n, t in zip(fns, iters, times):
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            t.append(start.elapsed_time(end) / n * 1e-3)
    return [statistics.median(t) for t in times]


def gpu_driver():
    """The NVIDIA driver's version, or "unknown"."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def commit_measured():
    """The commit measured: WEFT_COMMIT when set (a copy of the tree
    without its .git), else git's short hash with " (modified)" when
    tracked files differ from it."""
    commit = os.environ.get("WEFT_COMMIT")
    if commit:
        return commit
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or "unknown"
        if subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                          capture_output=True, text=True).stdout.strip():
            commit += " (modified)"
    except OSError:
        commit = "unknown"
    return commit


def machine(torch, cudnn=False):
    """(the machine in words, the commit measured) for a run's rows."""
    libs = torch.version.cuda
    if cudnn:
        libs = "%s, cuDNN %s" % (libs, torch.backends.cudnn.version())
    return "%s, driver %s; PyTorch %s (CUDA %s); Python %s" % (
        torch.cuda.get_device_name(), gpu_driver(), torch.__version__, libs,
        platform.python_version()), commit_measured()


def utc_now():
    """A row's date: now, as "YYYY-MM-DD HH:MM UTC"."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def run_fields(benchmark, mach, commit, conditions, quick):
    """The fields every row of one run shares."""
    common = {"benchmark": benchmark, "machine": mach, "commit": commit, "date": utc_now(),
              "conditions": conditions}
    if quick:
        common["quick"] = True
    return common


def print_results(results):
    """The run's table on stdout; results are (case, metric, value, unit,
    peer, peer_value, detail, targets) tuples, peer None where there is
    none."""
    print("\n| case | metric | weft | peer | detail |\n| --- | --- | --- | --- | --- |")
    for case, metric, v, unit, peer, pv, detail, _ in results:
        print("| %s | %s | %.4g %s | %s | %s |" % (case, metric, v, unit,
                                                  "%s %.4g" % (peer, pv) if peer else "", detail))


def write_results(path, common, results):
    """The results (as print_results takes them; targets a list of (goal,
    op, needed)) as rows, one JSON line each, into path (this run's
    alone)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        for case, metric, v, unit, peer, pv, detail, targets in results:
            row = dict(common, case=case, metric=metric, value=round(v, 4), unit=unit,
                       detail=detail)
            if peer:
                row.update(peer=peer, peer_value=round(pv, 4))
            if targets:
                row["targets"] = [{"goal": g, "op": op, "needed": round(need, 4),
                                   "met": (v <= need if op == "<=" else v >= need)}
                                  for g, op, need in targets]
            f.write(json.dumps(row) + "\n")


def add_run_options(ap, rows_name, quick_help, layout_help):
    """The options every ctypes benchmark takes: --lib, --rows, --no-rows,
    --quick, --check-layout."""
    ap.add_argument("--lib", default=os.path.join(ROOT, "build-release", "libweft.so"),
                    help="libweft.so to load")
    ap.add_argument("--rows", default=os.path.join(ROOT, "build-release", "bench", rows_name))
    ap.add_argument("--no-rows", action="store_true")
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--check-layout", action="store_true", help=layout_help)


def rerun_with_switch(script, variable, value, args):
    """script run again in a process of its own with the environment
    variable `variable` set to value (the library's switch to its other
    path, read once a process) and args, plus a file it writes JSON to;
    what it wrote, or None where the library says it ignores the switch
    (not a benchmark build: the times would be the same path's again).
    Raises RuntimeError when the run fails."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        env = dict(os.environ, **{variable: value})
        run = subprocess.run([sys.executable, os.path.abspath(script)] + args + [f.name],
                             env=env, stderr=subprocess.PIPE, text=True)
        sys.stderr.write(run.stderr)
        if run.returncode != 0:
            raise RuntimeError("the run with %s=%s failed" % (variable, value))
        if "read by benchmark builds only" in run.stderr:
            return None
        with open(f.name) as r:
            return json.load(r)


def own_stream(torch):
    """A stream of torch's own to run on (a `with` context): its default
    stream's handle is 0 (NULL), which weft reads as "the host
    reference"."""
    return torch.cuda.stream(torch.cuda.Stream())
