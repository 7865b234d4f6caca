#!/usr/bin/env python3
"""Where the CPU time went, from a file that libweft_sampler.so wrote.

    sample_report.py FILE [--skip SECONDS] [--top N] [--threads]

Names every sampled address with `nm` (static symbols where the object has
them, else its dynamic ones) and prints: the share of samples in each object,
the functions that were running (self), the functions on the stack
(inclusive, once a sample), and for samples outside the program's own code
(in the CUDA driver, the C library), which function of the program called
out. The first line also says how many unwinds a fault cut short. --skip
drops the first SECONDS of samples (the program's start-up); --threads
prints the samples per thread.
"""
import argparse
import bisect
import collections
import os
import subprocess
import sys


def read_samples(path):
    """The samples (ns, tid, stack), the maps, and how many unwinds faulted."""
    samples, maps, in_maps, faults = [], [], False, 0
    with open(path) as f:
        for line in f:
            if in_maps:
                maps.append(line)
            elif line.startswith("s "):
                fields = line.split()
                samples.append((int(fields[1]), int(fields[2]), [int(a, 16) for a in fields[3:]]))
            elif line.startswith("faults "):
                faults = int(line.split()[1])
            elif line.startswith("maps"):
                in_maps = True
    return samples, maps, faults


class Objects:
    """The executable mappings of the process, and their symbols."""

    def __init__(self, maps):
        self.ranges = []  # (start, end, file offset, path)
        for line in maps:
            fields = line.split()
            if len(fields) < 6 or "x" not in fields[1]:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            self.ranges.append((start, end, int(fields[2], 16), fields[5]))
        self.ranges.sort()
        self.starts = [r[0] for r in self.ranges]
        self.symbols = {}

    def _symbols_of(self, path):
        if path not in self.symbols:
            table = []
            for dynamic in ([], ["-D"]):
                try:
                    out = subprocess.run(["nm", "-n", "-C", "--defined-only"] + dynamic + [path],
                                         capture_output=True, text=True, check=False).stdout
                except OSError:
                    out = ""
                for line in out.splitlines():
                    fields = line.split(" ", 2)
                    if len(fields) == 3 and fields[1] in "tTwWiI":
                        table.append((int(fields[0], 16), fields[2]))
                if table:
                    break
            table.sort()
            self.symbols[path] = ([a for a, _ in table], [n for _, n in table])
        return self.symbols[path]

    def program(self):
        """The executable's name: the object mapped lowest."""
        return os.path.basename(self.ranges[0][3]) if self.ranges else "?"

    def name(self, address):
        """(object, function) for an address."""
        i = bisect.bisect_right(self.starts, address) - 1
        if i < 0 or address >= self.ranges[i][1]:
            return "?", "?"
        start, _, offset, path = self.ranges[i]
        obj = os.path.basename(path) if path.startswith("/") else path
        if not path.startswith("/"):
            return obj, obj
        addresses, names = self._symbols_of(path)
        # For the objects that a linker lays out the usual way, an address's
        # file offset is its link-time address.
        link = address - start + offset
        j = bisect.bisect_right(addresses, link) - 1
        if j < 0:
            return obj, "%s+0x%x" % (obj, link)
        return obj, names[j]


def table(title, counter, total, top):
    print("\n%s (of %d samples)" % (title, total))
    for name, count in counter.most_common(top):
        print("  %6.2f%%  %6d  %s" % (100.0 * count / total, count, name[:150]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--skip", type=float, default=0.0)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--threads", action="store_true")
    args = ap.parse_args()

    samples, maps, faults = read_samples(args.file)
    if not samples:
        sys.exit("%s: no samples" % args.file)
    first = min(ns for ns, _, _ in samples)
    samples = [s for s in samples if s[0] - first >= args.skip * 1e9]
    if not samples:
        sys.exit("%s: no samples after the first %g s" % (args.file, args.skip))
    objects = Objects(maps)

    by_object, self_time, inclusive = collections.Counter(), collections.Counter(), collections.Counter()
    callers_out, by_thread = collections.Counter(), collections.Counter()
    program = objects.program()
    for _, tid, stack in samples:
        # A caller's address is where it returns to: one byte back is
        # inside the call, in the right function even when the call ends it.
        frames = [objects.name(a if d == 0 else a - 1) for d, a in enumerate(stack)]
        by_object[frames[0][0]] += 1
        self_time[frames[0][1]] += 1
        for name in {f for _, f in frames}:
            inclusive[name] += 1
        by_thread["thread %d" % tid] += 1
        if frames[0][0] != program:
            caller = next((f for o, f in frames if o == program), "(unwound no further)")
            callers_out["%s <- %s" % (frames[0][0], caller)] += 1

    total = len(samples)
    span = (max(ns for ns, _, _ in samples) - min(ns for ns, _, _ in samples)) / 1e9
    print("%d samples over %.2f s; %d unwinds cut short by a fault (the whole run)"
          % (total, span, faults))
    table("by object (self)", by_object, total, args.top)
    table("functions running (self)", self_time, total, args.top)
    table("functions on the stack (inclusive)", inclusive, total, args.top)
    if callers_out:
        table("outside the program: object <- the program's function that called out",
              callers_out, total, args.top)
    if args.threads:
        table("by thread", by_thread, total, args.top)


if __name__ == "__main__":
    main()
