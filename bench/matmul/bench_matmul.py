#!/usr/bin/env python3
"""bench_matmul.py - weft_matmul against torch.matmul and torch eager, in one process.

Cases (bf16 unless named, on PyTorch's current stream, the same tensors for both
sides):
  matmul 8192^3               weft_matmul vs torch.matmul: TFLOP/s
  decode m in {1, 4, 16, 32}, (k, n) in {(4096, 14336), (14336, 4096), (4096, 4096),
                                    (4096, 1024)}
                              x W^T (bf16): the weight bytes' bandwidth of weft
                              (its skinny kernel), of F.linear and torch.matmul
                              on the same tensors, and of weft with the skinny
                              kernel off (WEFT_MATMUL_SKINNY=0, read by the
                              benchmark build, in a second process), beside a
                              device-to-device copy's rate from the same run.
                              Each side rotates among enough weight copies
                              (>= 256 MiB in all) that L2 holds none of them
                              from one call to the next. The cuBLASLt figure
                              needs the benchmark build (make gpu-bench-matmul);
                              --decode-only runs these rows alone.
  linear+bias+GELU m=4096 k=4096 n=14336
                              weft_matmul with the fused bias + tanh GELU vs
                              torch eager F.gelu(F.linear(x, W, b), 'tanh'),
                              and vs weft's own matmul alone (the epilogue's
                              cost)
  fp8 8192^3                  e4m3 x e4m3 -> bf16 with per-tensor scales, and
                              with row (A) / column (B) scales, vs
                              torch._scaled_mm on the same tensors: TFLOP/s
  int8 8192^3                 int8 x int8 -> int32 vs torch._int_mm: TOP/s
  first call / next call      host time of a call whose plan is new (the
                              heuristic query) and of one that finds it
  weft's own host time        weft_matmul's host time a call over
                              cublasLtMatmul's with the same algorithm and
                              stream (bench/matmul/matmul_overhead.c): us
  sparse 2:4 m in {1, 16, 4096}, (k, n) in the decode shapes
                              weft_matmul_sparse on a weight pruned by
                              weft_prune_2_4 (cuSPARSELt's kernels) vs
                              torch._cslt_sparse_mm on the same pruned weight,
                              and vs weft_matmul (dense) on it: the time and
                              the speed-up over dense (--no-sparse leaves them
                              out; a build without cuSPARSELt says so)
weft is loaded through ctypes from libweft.so (the shared library, which
exports weft_matmul) and called on the tensors' data_ptr() and torch's
current stream, so both sides run on the same stream. Each result is
checked against torch's before it is timed. Rows (bench/results.py) go to
--rows; `make gpu-bench-matmul RECORD=1` records them.
"""
import argparse
import ctypes
import functools
import json
import os
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common  # noqa: E402
from bench_common import (machine, own_stream, print_results, run_fields,  # noqa: E402
                          write_results)

# median of 5 runs of back-to-back calls, each >= 20 ms
time_per_call = functools.partial(bench_common.time_per_call, reps=5, min_ms=20.0)

F32, BF16, F16, F8_E4M3, F8_E5M2, I8, I32 = 0, 1, 2, 3, 4, 5, 6
ACT_NONE, ACT_RELU, ACT_GELU_TANH, ACT_GELU_ERF = 0, 1, 2, 3
SCALE_NONE, SCALE_TENSOR, SCALE_OUTER = 0, 1, 2


class MatmulDesc(ctypes.Structure):
    """weft_matmul_desc (include/weft/ops.h), field for field."""
    Z, I = ctypes.c_size_t, ctypes.c_int
    _fields_ = [("m", Z), ("n", Z), ("k", Z), ("type", I), ("in_type", I),
                ("trans_a", I), ("trans_b", I),
                ("lda", Z), ("ldb", Z), ("ldc", Z), ("ldd", Z), ("ldaux", Z),
                ("batch", Z), ("stride_a", Z), ("stride_b", Z), ("stride_c", Z),
                ("stride_d", Z), ("stride_aux", Z),
                ("alpha", ctypes.c_float), ("beta", ctypes.c_float), ("act", I),
                ("bias", ctypes.c_void_p), ("aux", ctypes.c_void_p), ("allow_tf32", I),
                ("in_type_b", I), ("c_type", I), ("scale_a_mode", I), ("scale_b_mode", I),
                ("scale_a", ctypes.c_void_p), ("scale_b", ctypes.c_void_p),
                ("scale_d", ctypes.c_void_p), ("amax_d", ctypes.c_void_p),
                ("b_constant", I), ("reserved_int", I), ("reserved", ctypes.c_uint64 * 9)]


def load_weft(path):
    lib = ctypes.CDLL(path)
    P = ctypes.c_void_p
    lib.weft_matmul.argtypes = [P, ctypes.POINTER(MatmulDesc), P, P, P, P]
    lib.weft_matmul.restype = ctypes.c_int
    lib.weft_last_error.argtypes = []
    lib.weft_last_error.restype = ctypes.c_char_p
    Z = ctypes.c_size_t
    lib.weft_prune_2_4.argtypes = [P, ctypes.c_int, P, Z, Z, Z]
    lib.weft_prune_2_4.restype = ctypes.c_int
    lib.weft_sparse_weight_create.argtypes = [P, ctypes.c_int, P, Z, Z, Z,
                                              ctypes.POINTER(ctypes.c_void_p)]
    lib.weft_sparse_weight_create.restype = ctypes.c_int
    lib.weft_sparse_weight_destroy.argtypes = [P]
    lib.weft_sparse_weight_destroy.restype = None
    lib.weft_matmul_sparse.argtypes = [P, ctypes.POINTER(MatmulDesc), P, P, P, P]
    lib.weft_matmul_sparse.restype = ctypes.c_int
    return lib


def die(msg):
    print("bench_matmul: " + msg, file=sys.stderr)
    sys.exit(1)


class Weft:
    def __init__(self, torch, lib):
        self.torch, self.lib = torch, lib

    def matmul(self, out, a, b, bias=None, act=ACT_NONE, trans_b=0):
        """A closure that runs out = act(a op(b) + bias) through weft."""
        m, k = a.shape
        n = out.shape[1]
        desc = MatmulDesc(m=m, n=n, k=k, type=BF16, trans_b=trans_b, act=act,
                          bias=bias.data_ptr() if bias is not None else None)
        args = (ctypes.byref(desc), out.data_ptr(), a.data_ptr(), b.data_ptr(), None)
        lib, torch = self.lib, self.torch

        def call():
            s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            rc = lib.weft_matmul(s, *args)
            if rc != 0:
                raise RuntimeError("weft_matmul: %d: %s" % (rc, lib.weft_last_error().decode()))
        call.desc = desc  # kept alive with the closure
        return call

    def quantized(self, out, a, b, in_type, type_, sa=None, sb=None, mode=SCALE_NONE):
        """A closure for an FP8 or INT8 product out = (sa sb) a b^T (b stored n x k,
        the TN layout weft asks of quantized operands)."""
        m, k = a.shape
        n = b.shape[0]
        desc = MatmulDesc(m=m, n=n, k=k, type=type_, in_type=in_type, trans_b=1,
                          scale_a_mode=mode, scale_b_mode=mode,
                          scale_a=sa.data_ptr() if sa is not None else None,
                          scale_b=sb.data_ptr() if sb is not None else None)
        args = (ctypes.byref(desc), out.data_ptr(), a.data_ptr(), b.data_ptr(), None)
        lib, torch = self.lib, self.torch

        def call():
            s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            rc = lib.weft_matmul(s, *args)
            if rc != 0:
                raise RuntimeError("weft_matmul: %d: %s" % (rc, lib.weft_last_error().decode()))
        call.desc = desc
        return call


class SparseWeight:
    """A weft_sparse_weight made from W (n x k bf16, already 2:4) on the
    current stream; destroyed with the object."""

    def __init__(self, torch, lib, W):
        self.lib, self.ptr = lib, ctypes.c_void_p()
        n, k = W.shape
        s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        rc = lib.weft_sparse_weight_create(s, BF16, W.data_ptr(), n, k, 0, ctypes.byref(self.ptr))
        if rc != 0:
            raise RuntimeError("weft_sparse_weight_create: %d: %s" %
                               (rc, lib.weft_last_error().decode()))
        self.n, self.k = n, k

    def matmul(self, torch, out, x):
        """A closure that runs out = x W^T through the sparse weight."""
        desc = MatmulDesc(m=x.shape[0], n=self.n, k=self.k, type=BF16, trans_b=1)
        args = (ctypes.byref(desc), out.data_ptr(), x.data_ptr(), self.ptr, None)
        lib = self.lib

        def call():
            s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            rc = lib.weft_matmul_sparse(s, *args)
            if rc != 0:
                raise RuntimeError("weft_matmul_sparse: %d: %s" %
                                   (rc, lib.weft_last_error().decode()))
        call.desc = desc
        return call

    def __del__(self):
        self.lib.weft_sparse_weight_destroy(self.ptr)


def rel_err(torch, got, want):
    got, want = got.double(), want.double()
    return (torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want)).item()


DECODE_MS = (1, 4, 16, 32)
# Llama-3-8B's up (and gate), down, query/output and key/value projections;
# the last, 64 tiles of 16 columns, runs as clusters in weft's kernel.
DECODE_KN = ((4096, 14336), (14336, 4096), (4096, 4096), (4096, 1024))


def rotating(fns):
    """One call of fns[i] per call, i going round: no weight stays in L2."""
    at = [0]

    def call():
        fns[at[0] % len(fns)]()
        at[0] += 1
    return call


def decode_operands(torch, k, n, m):
    """x (m x k) and enough copies of W (n x k) to fill 256 MiB or more."""
    copies = max(3, -(-(256 << 20) // (2 * n * k)))
    Ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    return torch.randn(m, k, device="cuda", dtype=torch.bfloat16), Ws


def decode_weft_times(torch, weft):
    """{(k, n, m): seconds per weft_matmul call}, after checking each
    shape's result against torch."""
    times = {}
    for k, n in DECODE_KN:
        for m in DECODE_MS:
            x, Ws = decode_operands(torch, k, n, m)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            calls = [weft.matmul(out, x, W, trans_b=1) for W in Ws]
            calls[0]()
            err = rel_err(torch, out, torch.matmul(x, Ws[0].t()))
            if err > 1e-2:
                die("decode m=%d k=%d n=%d: weft differs from torch by %.2e" % (m, k, n, err))
            times[(k, n, m)] = time_per_call(torch, rotating(calls))
            del x, Ws, out, calls
    return times


def decode_cublaslt_times(args):
    """decode_weft_times in a process of its own with WEFT_MATMUL_SKINNY=0,
    which the benchmark build reads once: every call through cuBLASLt. None
    where the library is not a benchmark build (it says it ignores the
    switch, and its times would be the kernel's again)."""
    try:
        times = bench_common.rerun_with_switch(__file__, "WEFT_MATMUL_SKINNY", "0",
                                               ["--lib", args.lib, "--decode-times"])
    except RuntimeError as e:
        die(str(e))
    if times is None:
        print("bench_matmul: not a benchmark build (WEFT_MEASURE_MODES): the decode rows "
              "leave cuBLASLt's path out", file=sys.stderr)
        return None
    return {tuple(v[:3]): v[3] for v in times}


def same_size_copy_tbps(torch, nbytes):
    """The rate of device-to-device copies that move nbytes each (half read,
    half written), rotating through 256 MiB so L2 holds none: the ceiling a
    call that reads nbytes meets at its size, launch and ramp included."""
    half = int(nbytes) // 2
    pairs = max(3, -(-(256 << 20) // (2 * half)))
    bufs = [(torch.empty(half, device="cuda", dtype=torch.uint8),
             torch.empty(half, device="cuda", dtype=torch.uint8)) for _ in range(pairs)]
    t = time_per_call(torch, rotating([lambda d=d, s=s: d.copy_(s) for s, d in bufs]))
    del bufs
    return 2 * half / t / 1e12


def decode(torch, F, weft, args, copy_tbps, results):
    lt = decode_cublaslt_times(args)
    mine = decode_weft_times(torch, weft)
    for k, n in DECODE_KN:
        same = same_size_copy_tbps(torch, 2.0 * n * k)
        for m in DECODE_MS:
            x, Ws = decode_operands(torch, k, n, m)
            tl = time_per_call(torch, rotating([lambda W=W: F.linear(x, W) for W in Ws]))
            tm = time_per_call(torch, rotating([lambda W=W: torch.matmul(x, W.t()) for W in Ws]))
            del x, Ws
            wbytes = 2.0 * n * k
            tw = mine[(k, n, m)]
            bw = wbytes / tw / 1e12
            through_lt = ("; weft through cuBLASLt (WEFT_MATMUL_SKINNY=0) %.2f TB/s" %
                          (wbytes / lt[(k, n, m)] / 1e12) if lt else "")
            results.append((
                "decode bf16 m=%d k=%d n=%d" % (m, k, n), "weight bandwidth", bw, "TB/s",
                "F.linear", wbytes / tl / 1e12,
                "%.1f us, %.0f%% of copy (%.2f TB/s), %.0f%% of a copy moving the same bytes "
                "(%.2f TB/s); torch.matmul %.2f TB/s%s" % (
                    tw * 1e6, 100 * bw / copy_tbps, copy_tbps, 100 * bw / same, same,
                    wbytes / tm / 1e12, through_lt),
                # An 8 MiB weight takes about 2 us, which launch gaps bound:
                # the target is for the larger ones.
                [("85% of the copy ceiling", ">=", 0.85 * copy_tbps)] if wbytes >= 32 << 20
                else []))


SPARSE_MS = (1, 16, 4096)


def sparse(torch, weft, args, results):
    """weft_matmul_sparse against torch's cuSPARSELt product and weft's dense
    product on the same pruned weights."""
    lib = weft.lib
    for k, n in DECODE_KN:
        W = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        if lib.weft_prune_2_4(s, BF16, W.data_ptr(), n, k, k) != 0:
            die("weft_prune_2_4: %s" % lib.weft_last_error().decode())
        try:
            sw = SparseWeight(torch, lib, W)
        except RuntimeError as e:
            print("bench_matmul: no sparse rows: %s" % e, file=sys.stderr)
            return
        have_cslt = hasattr(torch, "_cslt_compress")
        Wc = torch._cslt_compress(W) if have_cslt else None
        for m in SPARSE_MS:
            if args.quick and m > 16:
                continue
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            call = sw.matmul(torch, out, x)
            call()
            err = rel_err(torch, out, torch.matmul(x, W.t()))
            if err > 1e-2:
                die("sparse m=%d k=%d n=%d: weft differs from torch by %.2e" % (m, k, n, err))
            dense_out = torch.empty_like(out)
            dense = weft.matmul(dense_out, x, W, trans_b=1)
            tw = time_per_call(torch, call)
            td = time_per_call(torch, dense)
            tt, peer_note = None, ""
            if have_cslt:
                # cuSPARSELt refuses a dense operand narrower than 16
                # columns: torch is given x padded to 16 rows, as weft pads
                xp = x if m >= 16 else torch.cat([x, x.new_zeros(16 - m, k)])
                if m < 16:
                    peer_note = "; torch given m padded to 16"
                try:
                    tt = time_per_call(torch, lambda: torch._cslt_sparse_mm(Wc, xp.t()))
                except RuntimeError as e:
                    peer_note = "; torch refused: %s" % str(e).split("\n")[0][:80]
            results.append((
                "sparse 2:4 bf16 m=%d k=%d n=%d" % (m, k, n), "time", tw * 1e6, "us",
                "torch._cslt_sparse_mm" if tt else None, tt * 1e6 if tt else None,
                "weft_matmul on the same pruned weight (dense) %.1f us: sparse %.2fx; error vs "
                "torch %.1e%s" % (td * 1e6, td / tw, err, peer_note), []))
            del x, out, dense_out
        del sw, Wc, W


def overhead(args, results):
    """weft_matmul's host time a call over cublasLtMatmul's with the same
    algorithm (bench/matmul/matmul_overhead.c, built beside the library)."""
    prog = args.overhead or os.path.join(os.path.dirname(os.path.abspath(args.lib)), "bench",
                                         "matmul_overhead")
    if not os.access(prog, os.X_OK):
        print("bench_matmul: no overhead row: %s is not built" % prog, file=sys.stderr)
        return
    run = subprocess.run([prog], capture_output=True, text=True)
    words = run.stdout.split()
    if run.returncode != 0 or len(words) != 4:
        die("%s failed (%d): %s" % (prog, run.returncode, (run.stderr or run.stdout).strip()))
    weft_us, raw_us = float(words[1]), float(words[3])
    results.append(("weft_matmul's own host time a call (64^3 bf16, plan cached)", "time",
                    weft_us - raw_us, "us", None, None,
                    "weft_matmul %.2f us against cublasLtMatmul %.2f us with the same algorithm "
                    "and stream, medians of 31 rounds of 100" % (weft_us, raw_us),
                    [("0.5 us a call", "<=", 0.5)]))


def check_layout(lib):
    """One host call (NULL stream) through MatmulDesc, with the fields past
    the first ones set, so that a struct that drifted from the C one is
    caught here rather than on the GPU machine: D (2 x 2, ldd 3) =
    ReLU(alpha A B^T + bias) with A 2 x 3 (lda 4), B 2 x 3."""
    fa = ctypes.c_float
    A = (fa * 8)(1, 2, 3, 0, -1, 0.5, 2, 0)
    B = (fa * 6)(1, 0, 1, 0, 2, -1)
    bias = (fa * 2)(0.5, -4)
    D = (fa * 6)(*([7.0] * 6))
    desc = MatmulDesc(m=2, n=2, k=3, type=F32, trans_b=1, lda=4, ldd=3, alpha=2.0, act=ACT_RELU,
                      bias=ctypes.addressof(bias))
    rc = lib.weft_matmul(None, ctypes.byref(desc), D, A, B, None)
    if rc != 0:
        die("the host call failed: %d: %s" % (rc, lib.weft_last_error().decode()))
    want = []
    for i in range(2):
        for j in range(2):
            v = 2.0 * sum(A[i * 4 + p] * B[j * 3 + p] for p in range(3)) + bias[j]
            want.append(max(v, 0.0))
    got = [D[0], D[1], D[3], D[4]]
    if got != want or D[2] != 7.0 or D[5] != 7.0:
        die("MatmulDesc does not match weft_matmul_desc: got %s, want %s" % (got, want))
    # The quantized fields: INT8 dequantized by a row scale of A and a
    # tensor scale of B, D = sa_i sb (A B^T), A 2 x 4, B 4 x 4 (INT8 asks
    # n and k multiples of 4).
    i8 = ctypes.c_int8
    A8 = (i8 * 8)(1, -2, 3, 4, -128, 127, 0, 5)
    B8 = (i8 * 16)(2, 0, -1, 1, 3, 3, 3, -3, -128, 1, 0, 7, 127, 127, -5, 0)
    sa, sb = (fa * 2)(0.5, -2.0), (fa * 1)(0.25)
    D2 = (fa * 8)(*([7.0] * 8))
    desc = MatmulDesc(m=2, n=4, k=4, type=F32, in_type=I8, trans_b=1,
                      scale_a_mode=SCALE_OUTER, scale_b_mode=SCALE_TENSOR,
                      scale_a=ctypes.addressof(sa), scale_b=ctypes.addressof(sb))
    rc = lib.weft_matmul(None, ctypes.byref(desc), D2, A8, B8, None)
    if rc != 0:
        die("the INT8 host call failed: %d: %s" % (rc, lib.weft_last_error().decode()))
    want = [sa[i] * sb[0] * sum(A8[i * 4 + p] * B8[j * 4 + p] for p in range(4))
            for i in range(2) for j in range(4)]
    if list(D2) != want:
        die("MatmulDesc's quantized fields do not match: got %s, want %s" % (list(D2), want))
    # The sparse calls, on the host: a 2 x 8 bf16 weight pruned (the two
    # largest of each four stay), made a host sparse weight, and D (1 x 2) =
    # A W^T through it.
    u16 = ctypes.c_uint16
    keep_alive = []

    def bf16(v):
        return int.from_bytes(struct.pack(">f", v)[:2], "big")

    def aligned16(values):
        """A u16 array at a 16-byte aligned address (cuSPARSELt's layout,
        which the host asks too), holding values."""
        raw = (ctypes.c_uint8 * (2 * len(values) + 16))()
        keep_alive.append(raw)
        at = ctypes.addressof(raw)
        arr = (u16 * len(values)).from_address(at + (-at % 16))
        arr[:] = values
        return arr
    wv = [1, -3, 2, 0.5, 4, 4, -1, 1, 0.25, 8, -8, 2, 1, 1, 1, 1]
    W = aligned16([bf16(v) for v in wv])
    if lib.weft_prune_2_4(None, BF16, W, 2, 8, 8) != 0:
        die("weft_prune_2_4 (host): %s" % lib.weft_last_error().decode())
    keep = [0, -3, 2, 0, 4, 4, 0, 0, 0, 8, -8, 0, 1, 1, 0, 0]
    if list(W) != [bf16(v) for v in keep]:
        die("weft_prune_2_4 kept %s, want %s" % (list(W), [bf16(v) for v in keep]))
    sw = ctypes.c_void_p()
    if lib.weft_sparse_weight_create(None, BF16, W, 2, 8, 0, ctypes.byref(sw)) != 0:
        die("weft_sparse_weight_create (host): %s" % lib.weft_last_error().decode())
    A = aligned16([bf16(1.0)] * 8)
    D = aligned16([0] * 8)
    desc = MatmulDesc(m=1, n=2, k=8, type=BF16, trans_b=1, ldd=8)
    rc = lib.weft_matmul_sparse(None, ctypes.byref(desc), D, A, sw, None)
    lib.weft_sparse_weight_destroy(sw)
    if rc != 0:
        die("weft_matmul_sparse (host): %s" % lib.weft_last_error().decode())
    if D[0] != bf16(7.0) or D[1] != bf16(2.0):  # the pruned rows' sums
        die("weft_matmul_sparse gave %s, want %s" % (list(D[:2]), [bf16(7.0), bf16(2.0)]))
    print("bench_matmul: MatmulDesc matches weft_matmul_desc (%d bytes); the sparse calls run" %
          ctypes.sizeof(MatmulDesc))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench_common.add_run_options(
        ap, "matmul.rows.jsonl", "smaller shapes; rows marked quick",
        "without a GPU or PyTorch: MatmulDesc is the C struct (a host call)")
    ap.add_argument("--decode-only", action="store_true",
                    help="the copy ceiling and the decode rows only")
    ap.add_argument("--no-sparse", action="store_true", help="leave out the 2:4 sparse rows")
    ap.add_argument("--overhead", metavar="PROG",
                    help="the matmul_overhead program (default: bench/matmul_overhead beside "
                         "--lib)")
    ap.add_argument("--decode-times", metavar="FILE",
                    help="only time weft on the decode shapes, into FILE (JSON); the run "
                         "with WEFT_MATMUL_SKINNY=0 is one of these")
    args = ap.parse_args()
    if args.check_layout:
        check_layout(load_weft(args.lib))
        return

    import torch
    import torch.nn.functional as F
    if not torch.cuda.is_available():
        die("no GPU")
    lib = load_weft(args.lib)
    weft = Weft(torch, lib)
    with own_stream(torch):
        torch.manual_seed(0)
        if args.decode_times:
            times = decode_weft_times(torch, weft)
            with open(args.decode_times, "w") as f:
                json.dump([[k, n, m, t] for (k, n, m), t in times.items()], f)
            return
        run(torch, F, weft, args)


def run(torch, F, weft, args):
    dev, bf = "cuda", torch.bfloat16
    torch.manual_seed(0)
    results = []  # (case, metric, value, unit, peer, peer_value, detail, targets)

    def randn(*shape):
        return torch.randn(*shape, device=dev, dtype=bf)

    # ---- copy ceiling (for the decode shape's bandwidth) ----
    src = torch.empty(256 << 20, device=dev, dtype=torch.uint8)
    dst = torch.empty_like(src)
    t = time_per_call(torch, lambda: dst.copy_(src))
    copy_tbps = 2 * src.numel() / t / 1e12
    results.append(("copy ceiling: device-to-device copy of 256 MiB", "bandwidth",
                    copy_tbps, "TB/s", None, None, "read + write", []))
    del src, dst

    if not args.decode_only:
        # ---- bf16 large square ----
        n = 2048 if args.quick else 8192
        a, b = randn(n, n), randn(n, n)
        out = torch.empty(n, n, device=dev, dtype=bf)
        w = weft.matmul(out, a, b)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        w()  # the process's first: the cuBLASLt handle, the stream's workspace and the plan
        very_first = (time.perf_counter() - t0) * 1e6
        err = rel_err(torch, out, torch.matmul(a, b))
        if err > 1e-2:
            die("matmul %d^3: weft differs from torch by %.2e" % (n, err))
        # in turns: at 8192^3 the clock sags as the card warms, and which
        # ran first was worth a few percent either way
        tw, tt = bench_common.time_alternating(torch, [w, lambda: torch.matmul(a, b)], reps=7,
                                               min_ms=20.0)
        flop = 2.0 * n ** 3
        results.append(("matmul bf16 %d^3" % n, "throughput", flop / tw / 1e12, "TFLOP/s",
                        "torch.matmul", flop / tt / 1e12, "error vs torch %.1e" % err,
                        [("0.99 x torch.matmul (cuBLASLt) in the same run", ">=",
                          0.99 * flop / tt / 1e12)]))
        del a, b, out

    # ---- decode: m <= 32 rows against Llama-3-8B's projections ----
    decode(torch, F, weft, args, copy_tbps, results)

    if not args.decode_only:
        # ---- linear + bias + GELU (tanh) ----
        m = 1024 if args.quick else 4096
        k, n = 4096, 14336
        x, W, bias = randn(m, k), randn(n, k) * 0.02, randn(n)
        out = torch.empty(m, n, device=dev, dtype=bf)
        plain = torch.empty_like(out)
        fused = weft.matmul(out, x, W, bias=bias, act=ACT_GELU_TANH, trans_b=1)
        alone = weft.matmul(plain, x, W, trans_b=1)
        eager = lambda: F.gelu(F.linear(x, W, bias), approximate="tanh")  # noqa: E731
        fused()
        err = rel_err(torch, out, eager())
        if err > 2e-2:
            die("linear+bias+GELU: weft differs from torch by %.2e" % err)
        tf = time_per_call(torch, fused)
        ta = time_per_call(torch, alone)
        te = time_per_call(torch, eager)
        results.append(("linear+bias+GELU(tanh) bf16 m=%d k=4096 n=14336" % m, "time", tf * 1e6,
                        "us", "torch eager", te * 1e6,
                        "weft's matmul alone %.1f us (+%.1f%%); error vs torch %.1e" % (
                            ta * 1e6, 100 * (tf / ta - 1), err),
                        [("1.03 x weft's matmul alone in the same run", "<=", 1.03 * ta * 1e6)]))
        erf = weft.matmul(out, x, W, bias=bias, act=ACT_GELU_ERF, trans_b=1)
        erf()
        err = rel_err(torch, out, F.gelu(F.linear(x, W, bias)))
        tr = time_per_call(torch, erf)
        te2 = time_per_call(torch, lambda: F.gelu(F.linear(x, W, bias)))
        results.append(("linear+bias+GELU(erf) bf16 m=%d k=4096 n=14336" % m, "time", tr * 1e6,
                        "us", "torch eager", te2 * 1e6,
                        "erf: the matmul with bias, then weft's GELU kernel; error vs torch %.1e" %
                        err, []))
        del x, W, bias, out, plain

        # ---- FP8: per-tensor and row/column scales, against torch._scaled_mm ----
        n = 2048 if args.quick else 8192
        flop = 2.0 * n ** 3
        f8 = torch.float8_e4m3fn
        a8 = (torch.randn(n, n, device=dev) * 4).to(f8)
        b8 = (torch.randn(n, n, device=dev) * 4).to(f8)  # stored n x k: B^T, column-major for torch
        out = torch.empty(n, n, device=dev, dtype=bf)
        ref = torch.empty_like(out)
        st_a = torch.tensor(0.5, device=dev, dtype=torch.float32)
        st_b = torch.tensor(0.25, device=dev, dtype=torch.float32)
        sr_a = torch.rand(n, 1, device=dev, dtype=torch.float32) + 0.5
        sr_b = torch.rand(1, n, device=dev, dtype=torch.float32) + 0.5
        for label, mode, sa, sb in (("per-tensor scales", SCALE_TENSOR, st_a, st_b),
                                    ("row/column scales", SCALE_OUTER, sr_a, sr_b)):
            w = weft.quantized(out, a8, b8, F8_E4M3, BF16, sa.contiguous(), sb.contiguous(), mode)

            def peer(sa=sa, sb=sb):
                return torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=bf)
            w()
            ref.copy_(peer())
            err = rel_err(torch, out, ref)
            if err > 1e-2:
                die("fp8 %d^3 (%s): weft differs from torch._scaled_mm by %.2e" % (n, label, err))
            tw = time_per_call(torch, w)
            tt = time_per_call(torch, peer)
            results.append(("matmul fp8 e4m3 -> bf16 %d^3, %s" % (n, label), "throughput",
                            flop / tw / 1e12, "TFLOP/s", "torch._scaled_mm", flop / tt / 1e12,
                            "error vs torch %.1e" % err,
                            [("0.99 x torch._scaled_mm in the same run", ">=",
                              0.99 * flop / tt / 1e12)]))
        del a8, b8, out, ref

        # ---- INT8 -> int32, against torch._int_mm ----
        a8 = torch.randint(-128, 128, (n, n), device=dev, dtype=torch.int8)
        b8 = torch.randint(-128, 128, (n, n), device=dev, dtype=torch.int8)  # stored n x k
        out = torch.empty(n, n, device=dev, dtype=torch.int32)
        w = weft.quantized(out, a8, b8, I8, I32)
        w()
        if not torch.equal(out, torch._int_mm(a8, b8.t())):
            die("int8 %d^3: weft differs from torch._int_mm" % n)
        tw = time_per_call(torch, w)
        tt = time_per_call(torch, lambda: torch._int_mm(a8, b8.t()))
        results.append(("matmul int8 -> int32 %d^3" % n, "throughput", flop / tw / 1e12, "TOP/s",
                        "torch._int_mm", flop / tt / 1e12, "exact: equal to torch's",
                        [("0.99 x torch._int_mm in the same run", ">=", 0.99 * flop / tt / 1e12)]))
        del a8, b8, out

        # ---- first call (plan made) against the next (plan found) ----
        x, W = randn(96, 1000), randn(1000, 1000)  # a shape no case above used
        out = torch.empty(96, 1000, device=dev, dtype=bf)
        w = weft.matmul(out, x, W)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        w()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        host = []
        for _ in range(200):
            s = time.perf_counter()
            w()
            host.append(time.perf_counter() - s)
            torch.cuda.synchronize()
        first, nxt = (t1 - t0) * 1e6, statistics.median(host) * 1e6
        results.append(("first call of the process (host time)", "time", very_first, "us",
                        None, None, "cuBLASLt's handle, the stream's 32 MiB workspace and the plan",
                        []))
        results.append(("first call of a new shape (host time)", "time", first, "us",
                        None, None, "cuBLASLt's heuristic query and the plan's insertion", []))
        results.append(("call with the plan cached (host time, through ctypes)", "time", nxt, "us",
                        None, None, "median of 200; includes Python's ctypes call", []))
        overhead(args, results)

    if not args.no_sparse and not args.decode_only:
        sparse(torch, weft, args, results)

    # ---- report ----
    print_results(results)
    if args.no_rows:
        return
    mach, commit = machine(torch)
    write_results(args.rows, run_fields(
        "matmul", mach, commit, "Release build; median of 5 runs of back-to-back calls, >= 20 ms "
        "each, after warm-up, on PyTorch's current stream", args.quick), results)
    print("bench_matmul: rows in %s" % args.rows)


if __name__ == "__main__":
    main()
