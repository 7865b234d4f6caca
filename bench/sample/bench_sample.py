#!/usr/bin/env python3
"""bench_sample.py - weft_sample and weft_penalize against PyTorch's sampling.

Cases: fp32 logits of a 128256-token vocabulary (Llama 3's), 1, 32 and 128
rows, each row its own seed:
  greedy            weft_sample at temperature 0, beside torch.argmax
  T 0.8, top-p 0.9  weft_sample, beside what transformers' generate does per
                    step: scale, sort, softmax, cumulative sum, mask, softmax,
                    torch.multinomial
  T 0.8, top-k 50   weft_sample, beside torch.topk, softmax, multinomial
  penalties         weft_penalize with 512 seen tokens a row, beside
                    transformers' repetition penalty (gather, where, scatter)
The time per call (median of 5 runs of back-to-back calls, CUDA events on
one stream). weft is loaded through ctypes from libweft.so and called on the
tensors' data_ptr() and torch's current stream. --check-layout needs neither
a GPU nor PyTorch: it checks the ctypes structs against the C ones through
host calls (a ctest).
"""
import argparse
import ctypes
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common  # noqa: E402
from bench_common import (machine, own_stream, print_results, run_fields,  # noqa: E402
                          write_results)

time_per_call = functools.partial(bench_common.time_per_call, reps=5, min_ms=20.0)

F32 = 0
VOCAB = 128256
ROWS = (1, 32, 128)
SEEN = 512


class Sampling(ctypes.Structure):
    """weft_sampling (include/weft/ops.h), field for field."""
    _fields_ = [("temperature", ctypes.c_float), ("top_p", ctypes.c_float),
                ("top_k", ctypes.c_int32), ("reserved", ctypes.c_uint32),
                ("seed", ctypes.c_uint64), ("offset", ctypes.c_uint64)]


class Penalties(ctypes.Structure):
    """weft_penalties."""
    _fields_ = [("repetition", ctypes.c_float), ("frequency", ctypes.c_float),
                ("presence", ctypes.c_float), ("first", ctypes.c_uint32),
                ("count", ctypes.c_uint32)]


class Adjust(ctypes.Structure):
    """weft_logit_adjust."""
    _fields_ = [("token", ctypes.c_int32), ("count", ctypes.c_int32), ("seen", ctypes.c_uint32),
                ("bias", ctypes.c_float)]


def load_weft(path):
    lib = ctypes.CDLL(path)
    P, Z = ctypes.c_void_p, ctypes.c_size_t
    lib.weft_sample.argtypes = [P, ctypes.c_int, P, P, Z, Z, Z, P]
    lib.weft_sample.restype = ctypes.c_int
    lib.weft_penalize.argtypes = [P, ctypes.c_int, P, Z, Z, Z, P, P]
    lib.weft_penalize.restype = ctypes.c_int
    lib.weft_last_error.restype = ctypes.c_char_p
    return lib


def check(lib, rc, what):
    if rc != 0:
        raise SystemExit("%s: %d %s" % (what, rc, lib.weft_last_error().decode()))


def check_layout(lib):
    """Host calls whose answers depend on every field landing where C reads it."""
    logits = (ctypes.c_float * 4)(0.0, 3.0, 1.0, 2.0)
    ids = (ctypes.c_int32 * 1)()
    greedy = Sampling(temperature=0.0)
    check(lib, lib.weft_sample(None, F32, ids, logits, 1, 4, 4, ctypes.byref(greedy)), "greedy")
    assert ids[0] == 1, ids[0]
    k1 = Sampling(temperature=1.0, top_p=1.0, top_k=1, seed=5, offset=9)
    check(lib, lib.weft_sample(None, F32, ids, logits, 1, 4, 4, ctypes.byref(k1)), "top_k 1")
    assert ids[0] == 1, ids[0]
    seen = set()
    for off in range(200):
        k2 = Sampling(temperature=1.0, top_p=1.0, top_k=2, seed=5, offset=off)
        check(lib, lib.weft_sample(None, F32, ids, logits, 1, 4, 4, ctypes.byref(k2)), "top_k 2")
        seen.add(ids[0])
    assert seen == {1, 3}, seen  # the seed and offset move the draw; top_k keeps two
    pen = Penalties(repetition=2.0, frequency=0.5, presence=0.25, first=1, count=1)
    adj = (Adjust * 2)(Adjust(token=0, count=0, seen=1, bias=0.0),
                       Adjust(token=1, count=2, seen=1, bias=-1.0))
    check(lib, lib.weft_penalize(None, F32, logits, 1, 4, 4, ctypes.byref(pen), adj), "penalize")
    assert list(logits) == [0.0, 3.0 / 2 - 1.25 - 1.0, 1.0, 2.0], list(logits)
    print("bench_sample: the ctypes structs match weft's")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench_common.add_run_options(ap, "sample.rows.jsonl", "1 and 32 rows; rows marked quick",
                                 "check the ctypes structs through host calls, then exit")
    args = ap.parse_args()
    lib = load_weft(args.lib)
    if args.check_layout:
        check_layout(lib)
        return
    import torch
    mach, commit = machine(torch)
    results = []
    with own_stream(torch):
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        for rows in ROWS[:2] if args.quick else ROWS:
            g = torch.Generator(device="cuda").manual_seed(rows)
            logits = torch.randn(rows, VOCAB, device="cuda", generator=g) * 3
            ids = torch.empty(rows, dtype=torch.int32, device="cuda")
            params = {}
            for name, t, p, k in (("greedy", 0.0, 1.0, 0), ("T 0.8, top-p 0.9", 0.8, 0.9, 0),
                                  ("T 0.8, top-k 50", 0.8, 1.0, 50)):
                host = (Sampling * rows)(*[Sampling(temperature=t, top_p=p, top_k=k, seed=r,
                                                    offset=7) for r in range(rows)])
                dev = torch.frombuffer(bytearray(host), dtype=torch.uint8).cuda()
                params[name] = dev

                def weft(dev=dev):
                    check(lib, lib.weft_sample(stream, F32, ids.data_ptr(), logits.data_ptr(),
                                               rows, VOCAB, VOCAB, dev.data_ptr()), "weft_sample")

                if name == "greedy":
                    def peer():
                        return torch.argmax(logits, dim=-1)
                elif k:
                    def peer():
                        v, i = torch.topk(logits / t, k, dim=-1)
                        return i.gather(-1, torch.multinomial(torch.softmax(v, -1), 1))
                else:
                    def peer():
                        s, i = torch.sort(logits / t, dim=-1, descending=True)
                        cum = torch.softmax(s, -1).cumsum(-1)
                        s = s.masked_fill(cum - torch.softmax(s, -1) > p, float("-inf"))
                        return i.gather(-1, torch.multinomial(torch.softmax(s, -1), 1))
                w, pt = time_per_call(torch, weft), time_per_call(torch, peer)
                results.append(("rows %d, %s" % (rows, name), "us per call", w * 1e6, "us",
                                "torch", pt * 1e6, "%.2fx torch's speed" % (pt / w), None))
            pen = (Penalties * rows)(*[Penalties(repetition=1.3, frequency=0.1, presence=0.2,
                                                 first=r * SEEN, count=SEEN)
                                       for r in range(rows)])
            toks = torch.randint(0, VOCAB, (rows, SEEN), device="cuda", generator=g)
            adj = (Adjust * (rows * SEEN))(*[Adjust(token=int(x), count=1, seen=1, bias=0.0)
                                             for x in toks.flatten().tolist()])
            dpen = torch.frombuffer(bytearray(pen), dtype=torch.uint8).cuda()
            dadj = torch.frombuffer(bytearray(adj), dtype=torch.uint8).cuda()

            def weft_pen():
                check(lib, lib.weft_penalize(stream, F32, logits.data_ptr(), rows, VOCAB, VOCAB,
                                             dpen.data_ptr(), dadj.data_ptr()), "weft_penalize")

            def peer_pen():
                s = logits.gather(1, toks)
                s = torch.where(s < 0, s * 1.3, s / 1.3)
                logits.scatter_(1, toks, s)

            w, pt = time_per_call(torch, weft_pen), time_per_call(torch, peer_pen)
            results.append(("rows %d, penalties of %d tokens" % (rows, SEEN), "us per call",
                            w * 1e6, "us", "torch", pt * 1e6, "%.2fx torch's speed" % (pt / w),
                            None))
    print_results(results)
    if not args.no_rows:
        write_results(args.rows, run_fields("sample", mach, commit, "fp32 logits, vocab %d" % VOCAB,
                                            args.quick), results)


if __name__ == "__main__":
    main()
