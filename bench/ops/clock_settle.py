#!/usr/bin/env python3
"""clock_settle.py - how long a kernel's speed carries what ran before it.

Runs a device-to-device copy (the heaviest load on the GPU's power) for
--heavy-ms, then one operator of weft's on its own, call after call, for
--probe-ms, timing each batch of 10 calls with CUDA events and reading the SM clock
(NVML, read only) as it goes. Then the same probe again after --rest-ms
idle, for a baseline. Prints, for windows of time since the probe began,
the median bandwidth of batches of back-to-back calls and the SM clock: how long the GPU's clock
takes to come back after a heavy kernel, and so how long a benchmark must
warm a kernel up before its figure is its own.

Usage: bench/ops/clock_settle.py [--lib ...] [--op softmax --dtype bf16 --shape 1024x65536]
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_ops  # noqa: E402

WINDOWS_MS = [(0, 5), (5, 10), (10, 20), (20, 50), (50, 100), (100, 200), (200, 500),
              (500, 1000), (1000, 2000), (2000, 4000)]


def probe(torch, call, nbytes, clock, probe_ms, batch=10):
    """(ms since the start, TB/s, SM MHz) of each batch of calls for
    probe_ms. One batch stays queued behind the one being read, so that
    the GPU never idles between them."""
    def enqueue():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(batch):
            call()
        end.record()
        return start, end

    events, queued = [], enqueue()
    t0 = time.monotonic()
    while (time.monotonic() - t0) * 1e3 < probe_ms:
        start, end = queued
        queued = enqueue()
        end.synchronize()
        ms = start.elapsed_time(end)
        events.append(((time.monotonic() - t0) * 1e3, batch * nbytes / (ms * 1e-3) / 1e12,
                       clock.mhz()))
    queued[1].synchronize()
    return events


def summary(events):
    rows = []
    for lo, hi in WINDOWS_MS:
        got = [(tb, mhz) for t, tb, mhz in events if lo <= t < hi]
        if not got:
            continue
        mhz = [m for _, m in got if m is not None]
        rows.append("| %d-%d ms | %d | %.2f | %s |" % (
            lo, hi, len(got), statistics.median(tb for tb, _ in got),
            "%d (%d-%d)" % (statistics.median(mhz), min(mhz), max(mhz)) if mhz else "—"))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=bench_ops.DEFAULT_LIB)
    ap.add_argument("--op", default="softmax", choices=bench_ops.OPS)
    ap.add_argument("--dtype", default="bf16", choices=sorted(bench_ops.WEFT_DTYPE))
    ap.add_argument("--shape", default="1024x65536")
    ap.add_argument("--heavy-ms", type=float, default=2000)
    ap.add_argument("--probe-ms", type=float, default=4000)
    ap.add_argument("--rest-ms", type=float, default=3000)
    args = ap.parse_args()
    lib_path = bench_ops.preload_self(args.lib)
    import torch
    if not torch.cuda.is_available():
        print("clock_settle: no GPU here; nothing measured", file=sys.stderr)
        sys.exit(77)
    lib = bench_ops.load_weft(lib_path)
    clock = bench_ops.SmClock()
    if clock.nvml is None:
        print("clock_settle: NVML cannot be loaded: clocks left out", file=sys.stderr)
    with torch.cuda.stream(torch.cuda.Stream()):
        rows, cols = (int(v) for v in args.shape.split("x"))
        case = bench_ops.make_case(torch, lib, args.op, rows, cols, args.dtype)
        call = bench_ops.checked(lib, case.weft_call)
        src = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        src.fill_(1)
        call()
        torch.cuda.synchronize()

        t0 = time.monotonic()
        while (time.monotonic() - t0) * 1e3 < args.heavy_ms:
            for _ in range(20):
                dst.copy_(src)
            torch.cuda.synchronize()
        heavy_mhz = clock.mhz()
        after_heavy = probe(torch, call, case.nbytes, clock, args.probe_ms)
        time.sleep(args.rest_ms * 1e-3)
        rested_mhz = clock.mhz()
        after_rest = probe(torch, call, case.nbytes, clock, args.probe_ms)

    print("%s %s %s, batches of 10 calls; SM clock %s MHz at the end of %g ms of copies, "
          "%s MHz after %g ms idle" % (args.op, args.dtype, args.shape, heavy_mhz, args.heavy_ms,
                                      rested_mhz, args.rest_ms))
    for title, events in (("after the copies", after_heavy), ("after idling", after_rest)):
        print()
        print("| %s | calls | median TB/s | SM MHz, median (range) |" % title)
        print("| --- | ---: | ---: | ---: |")
        print("\n".join(summary(events)))


if __name__ == "__main__":
    main()
