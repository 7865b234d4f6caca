#!/usr/bin/env python3
"""bench_moe.py - weft's mixture-of-experts calls against PyTorch, in one process.

Cases (on PyTorch's current stream, the same tensors for both sides):
  router 8192 tokens x 64 experts, k 8 (bf16 logits)
      weft_moe_gate (weights, ids, offsets, permutation and its inverse) vs
      torch eager: softmax, topk, renormalise, argsort (stable), bincount,
      cumsum and the inverse scatter
  grouped matmul, Mixtral-like: 8 experts, k 2, 4096 tokens, hidden 4096,
  n 14336 (bf16)
      weft_grouped_matmul (group sizes read on the device) vs
      torch._grouped_mm (where this PyTorch has it) and a Python loop of
      torch.matmul per expert (its group sizes on the host beforehand, the
      loop's best case)
weft is loaded through ctypes from libweft.so and called on the tensors'
data_ptr() and torch's current stream. Each result is checked against
torch's before it is timed. Rows (bench/results.py) go to --rows;
`make gpu-bench-moe RECORD=1` records them.
"""
import argparse
import ctypes
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common  # noqa: E402
from bench_common import machine, own_stream, run_fields, write_results  # noqa: E402

# median of 5 runs of back-to-back calls, each >= 20 ms
time_per_call = functools.partial(bench_common.time_per_call, reps=5, min_ms=20.0)
F32, BF16, F16 = 0, 1, 2
SOFTMAX, SIGMOID = 0, 1


class Routing(ctypes.Structure):
    """weft_moe_routing (include/weft/ops.h), field for field."""
    P = ctypes.c_void_p
    _fields_ = [("weights", P), ("ids", P), ("offsets", P), ("perm", P), ("inverse", P)]


class GroupedDesc(ctypes.Structure):
    """weft_grouped_matmul_desc (include/weft/ops.h), field for field."""
    Z, I = ctypes.c_size_t, ctypes.c_int
    _fields_ = [("groups", Z), ("rows", Z), ("n", Z), ("k", Z), ("type", I),
                ("ldx", Z), ("ldy", Z), ("act", I), ("bias", ctypes.c_void_p),
                ("reserved", ctypes.c_uint64 * 8)]


def load_weft(path):
    lib = ctypes.CDLL(path)
    P, Z, I = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    lib.weft_moe_gate.argtypes = [P, I, I, I, P, Z, Z, Z, Z, ctypes.POINTER(Routing)]
    lib.weft_grouped_matmul.argtypes = [P, ctypes.POINTER(GroupedDesc), P, P, P, P]
    lib.weft_last_error.restype = ctypes.c_char_p
    return lib


def die(msg):
    print("bench_moe: " + msg, file=sys.stderr)
    sys.exit(1)


def check(lib, rc, what):
    if rc != 0:
        raise RuntimeError("%s: %d: %s" % (what, rc, lib.weft_last_error().decode()))


def check_layout(lib):
    """Host calls (NULL stream) through Routing and GroupedDesc, so that a
    struct that drifted from the C one is caught without a GPU."""
    T, E, K = 3, 4, 2
    logits = (ctypes.c_float * (T * E))(0, 3, 1, 2, 5, 4, 0, 0, -1, -2, 7, 7)
    w = (ctypes.c_float * (T * K))()
    ids, perm, inv = ((ctypes.c_int32 * (T * K))() for _ in range(3))
    offs = (ctypes.c_int32 * (E + 1))()
    r = Routing(ctypes.addressof(w), ctypes.addressof(ids), ctypes.addressof(offs),
                ctypes.addressof(perm), ctypes.addressof(inv))
    check(lib, lib.weft_moe_gate(None, F32, SOFTMAX, 1, logits, T, E, E, K, ctypes.byref(r)),
          "weft_moe_gate")
    if list(ids) != [1, 3, 0, 1, 2, 3] or list(offs) != [0, 1, 3, 4, 6]:
        die("Routing does not match weft_moe_routing: ids %s offsets %s" % (list(ids),
                                                                           list(offs)))
    # Y (3 rows, ldy 3) = X W_g^T + bias_g: groups [0, 1) and [1, 3), n = k = 2.
    def to_bf16(vals):
        out = (ctypes.c_uint16 * len(vals))()
        for i, v in enumerate(vals):
            out[i] = (ctypes.c_uint32.from_buffer_copy(ctypes.c_float(v)).value >> 16)
        return out
    X = to_bf16([1, 2, 3, 4, 5, 6])
    W = to_bf16([1, 0, 0, 1, 2, 0, 0, 2])
    bias = to_bf16([0, 0, 1, 1])
    Y = (ctypes.c_uint16 * 9)(*([0xffff] * 9))
    go = (ctypes.c_int32 * 3)(0, 1, 3)
    d = GroupedDesc(groups=2, rows=3, n=2, k=2, type=BF16, ldy=3, bias=ctypes.addressof(bias))
    check(lib, lib.weft_grouped_matmul(None, ctypes.byref(d), Y, X, W, go), "weft_grouped_matmul")
    got = [ctypes.c_float.from_buffer_copy(ctypes.c_uint32(Y[i] << 16)).value
           for i in (0, 1, 3, 4, 6, 7)]
    if got != [1, 2, 7, 9, 11, 13] or Y[2] != 0xffff:
        die("GroupedDesc does not match weft_grouped_matmul_desc: %s" % got)
    print("bench_moe: Routing and GroupedDesc match the C structs (%d and %d bytes)" %
          (ctypes.sizeof(Routing), ctypes.sizeof(GroupedDesc)))


def rel_err(torch, got, want):
    got, want = got.double(), want.double()
    return (torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want)).item()


class Gate:
    """weft_moe_gate's outputs for T tokens, E experts and k, and a closure
    that fills them from logits."""

    def __init__(self, torch, lib, logits, k, score=SOFTMAX, renorm=1):
        T, E = logits.shape
        dev, i32 = logits.device, torch.int32
        self.weights = torch.empty(T, k, device=dev, dtype=torch.float32)
        self.ids = torch.empty(T, k, device=dev, dtype=i32)
        self.offsets = torch.empty(E + 1, device=dev, dtype=i32)
        self.perm = torch.empty(T * k, device=dev, dtype=i32)
        self.inverse = torch.empty(T * k, device=dev, dtype=i32)
        self.r = Routing(self.weights.data_ptr(), self.ids.data_ptr(), self.offsets.data_ptr(),
                         self.perm.data_ptr(), self.inverse.data_ptr())
        dt = {torch.float32: F32, torch.bfloat16: BF16, torch.float16: F16}[logits.dtype]
        args = (dt, score, renorm, logits.data_ptr(), T, E, E, k, ctypes.byref(self.r))

        def call():
            s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            check(lib, lib.weft_moe_gate(s, *args), "weft_moe_gate")
        self.call = call


def torch_tables(torch, ids, E):
    """The stable permutation, its inverse and the offsets of ids, eager."""
    flat = ids.flatten()
    perm = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)
    offsets = torch.zeros(E + 1, device=ids.device, dtype=torch.int64)
    offsets[1:] = torch.cumsum(counts, 0)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=ids.device)
    return perm, inverse, offsets


def torch_gate(torch, logits, k):
    """The eager router: what a framework runs for the same tables."""
    p = torch.softmax(logits.float(), dim=-1)
    w, ids = torch.topk(p, k, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    return (w, ids) + torch_tables(torch, ids, logits.shape[1])


def run(torch, lib, args):
    dev, bf = "cuda", torch.bfloat16
    torch.manual_seed(0)
    results = []  # (case, metric, value, unit, peer, peer_value, detail)

    # ---- router ----
    T, E, K = (2048 if args.quick else 8192), 64, 8
    # Checked on fp32 logits. weft ranks logits, torch.topk rounded
    # probabilities, which can tie where the logits do not: nearly every
    # token must agree, and weft's tables must be torch's tables of weft's ids.
    l32 = torch.randn(T, E, device=dev, dtype=torch.float32)
    g = Gate(torch, lib, l32, K)
    g.call()
    w, ids = torch_gate(torch, l32, K)[:2]
    torch.cuda.synchronize()
    agree = (g.ids.long() == ids).all(dim=1).double().mean().item()
    if agree < 0.999:
        die("router: only %.4f of the tokens have torch's experts" % agree)
    perm, inverse, offsets = torch_tables(torch, g.ids.long(), E)
    if not torch.equal(g.offsets.long(), offsets) or not torch.equal(g.perm.long(), perm) or \
            not torch.equal(g.inverse.long(), inverse):
        die("router: weft's tables differ from torch's tables of the same ids")
    err = rel_err(torch, g.weights, w)
    if err > 1e-4:
        die("router: weft's weights differ from torch's by %.2e" % err)
    logits = torch.randn(T, E, device=dev, dtype=bf)
    g = Gate(torch, lib, logits, K)
    tw = time_per_call(torch, g.call)
    tt = time_per_call(torch, lambda: torch_gate(torch, logits, K))
    results.append(("router bf16 %d tokens x %d experts, k %d" % (T, E, K), "time", tw * 1e6,
                    "us", "torch eager", tt * 1e6,
                    "softmax, top-k, renormalise, the stable permutation, its inverse and the "
                    "offsets; weights vs torch %.1e" % err))

    # ---- grouped matmul ----
    T, E, K, H, N = (1024 if args.quick else 4096), 8, 2, 4096, 14336
    rl = torch.randn(T, E, device=dev, dtype=torch.float32)
    g = Gate(torch, lib, rl, K)
    g.call()
    rows = T * K
    x = torch.randn(rows, H, device=dev, dtype=bf)
    W = torch.randn(E, N, H, device=dev, dtype=bf) * 0.02
    y = torch.empty(rows, N, device=dev, dtype=bf)
    desc = GroupedDesc(groups=E, rows=rows, n=N, k=H, type=BF16)
    gargs = (ctypes.byref(desc), y.data_ptr(), x.data_ptr(), W.data_ptr(), g.offsets.data_ptr())

    def weft_grouped():
        s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        check(lib, lib.weft_grouped_matmul(s, *gargs), "weft_grouped_matmul")

    host_off = g.offsets.tolist()
    ref = torch.empty_like(y)

    def loop():
        for e in range(E):
            lo, hi = host_off[e], host_off[e + 1]
            if hi > lo:
                torch.matmul(x[lo:hi], W[e].t(), out=ref[lo:hi])

    weft_grouped()
    loop()
    err = rel_err(torch, y, ref)
    if err > 1e-2:
        die("grouped matmul: weft differs from the torch loop by %.2e" % err)
    flop = 2.0 * rows * N * H
    tw = time_per_call(torch, weft_grouped)
    tl = time_per_call(torch, loop)
    sizes = [host_off[e + 1] - host_off[e] for e in range(E)]
    results.append(("grouped matmul bf16 %d experts, %d rows, k %d, n %d" % (E, rows, H, N),
                    "throughput", flop / tw / 1e12, "TFLOP/s", "torch.matmul loop",
                    flop / tl / 1e12, "rows per expert %s; error vs torch %.1e" % (sizes, err)))
    gm = getattr(torch, "_grouped_mm", None)
    if gm is None:
        print("bench_moe: this PyTorch (%s) has no torch._grouped_mm" % torch.__version__)
    else:
        ends = g.offsets[1:].contiguous()
        Wt = W.transpose(-2, -1)
        try:
            out = gm(x, Wt, offs=ends)
            gerr = rel_err(torch, out, ref)
            if gerr > 1e-2:
                raise RuntimeError("differs from the loop by %.2e" % gerr)
            tg = time_per_call(torch, lambda: gm(x, Wt, offs=ends))
            results.append(("grouped matmul bf16 %d experts, %d rows, k %d, n %d" %
                            (E, rows, H, N), "throughput", flop / tw / 1e12, "TFLOP/s",
                            "torch._grouped_mm", flop / tg / 1e12,
                            "offsets on the device for both; error vs loop %.1e" % gerr))
        except Exception as e:  # a private op: whatever it raises, it is not usable here
            print("bench_moe: torch._grouped_mm not usable here: %s" % e)

    # ---- report ----
    print("\n| case | metric | weft | peer |\n| --- | --- | --- | --- |")
    for case, metric, v, unit, peer, pv, detail in results:
        print("| %s | %s | %.4g %s | %s %.4g |" % (case, metric, v, unit, peer, pv))
    if args.no_rows:
        return
    mach, commit = machine(torch)
    # every case has its peer and no target
    write_results(args.rows, run_fields(
        "moe", mach, commit, "Release build; median of 5 runs of back-to-back calls, >= 20 ms "
        "each, after warm-up, on PyTorch's current stream", args.quick),
        [r + ([],) for r in results])
    print("bench_moe: rows in %s" % args.rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench_common.add_run_options(ap, "moe.rows.jsonl", "smaller shapes; rows marked quick",
                                 "without a GPU or PyTorch: the ctypes structs are the C ones")
    args = ap.parse_args()
    lib = load_weft(args.lib)
    if args.check_layout:
        check_layout(lib)
        return
    import torch
    if not torch.cuda.is_available():
        die("no GPU")
    with own_stream(torch):
        run(torch, lib, args)


if __name__ == "__main__":
    main()
