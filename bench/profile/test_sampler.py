#!/usr/bin/env python3
"""The sampler and its report, with no GPU.

    test_sampler.py SAMPLER_LIB REPORT_SCRIPT BAD_UNWIND PROGRAM [ARGS...]

1. BAD_UNWIND spins in a function whose unwind table sends an unwinder far
   off the stack: under the sampler it must still run to the end, its
   samples must name that function, and the faults must be counted.
2. PROGRAM (a weft program) under the sampler: the samples must name weft's
   own code with callers unwound (the worker threads' main function on the
   stack of many samples), and no unwind may fault: weft's own unwind
   tables, its context switch's among them, must hold wherever a signal
   lands.
"""
import os
import re
import subprocess
import sys
import tempfile


def sample(sampler, report, argv, tmp):
    """Run argv under the sampler; its report's text."""
    path = os.path.join(tmp, os.path.basename(argv[0]) + ".samples")
    env = dict(os.environ, WEFT_SAMPLE=path, LD_PRELOAD=sampler)
    run = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, check=False)
    if run.returncode != 0:
        sys.exit("%s under the sampler: exit status %d\n%s" % (argv[0], run.returncode,
                                                               run.stderr))
    return subprocess.run([sys.executable, report, path, "--top", "200"], check=True,
                          capture_output=True, text=True).stdout


def share(out, table, function):
    """The share of samples in `table` that `function` has, or 0."""
    text = out.split(table)[1].split("\n\n")[0]
    m = re.search(r"^\s+([\d.]+)%\s+\d+\s+" + re.escape(function) + "$", text, re.M)
    return float(m.group(1)) if m else 0.0


def samples(out):
    m = re.search(r"^(\d+) samples over", out, re.M)
    return int(m.group(1)) if m else 0


def faults(out):
    m = re.search(r"; (\d+) unwinds cut short by a fault", out)
    return int(m.group(1)) if m else -1


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    sampler, report, bad_unwind = sys.argv[1:4]
    program = sys.argv[4:]
    with tempfile.TemporaryDirectory() as tmp:
        bad = sample(sampler, report, [bad_unwind], tmp)
        weft = sample(sampler, report, program, tmp)
    spin = share(bad, "functions running (self)", "spin_with_bad_cfi")
    if samples(bad) < 20 or spin < 50 or faults(bad) < 1:
        sys.exit("bad_unwind: spin_with_bad_cfi in %.1f%% of %d samples, %d faults:\n%s"
                 % (spin, samples(bad), faults(bad), bad[:2000]))
    worker = share(weft, "functions on the stack (inclusive)", "worker_main")
    if samples(weft) < 20 or worker < 10 or faults(weft) != 0:
        sys.exit("worker_main on the stack of %.1f%% of %d samples, %d faults:\n%s"
                 % (worker, samples(weft), faults(weft), weft[:4000]))
    print("bad_unwind: %d samples, %.0f%% in spin_with_bad_cfi, %d faults; %s: %d samples, "
          "worker_main on the stack of %.0f%%, no fault" % (samples(bad), spin, faults(bad),
                                                           os.path.basename(program[0]),
                                                           samples(weft), worker))


if __name__ == "__main__":
    main()
