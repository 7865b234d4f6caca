#!/usr/bin/env python3
"""bench_conv.py - weft_conv2d (BatchNorm folded, bias + ReLU fused) against PyTorch, in one process.

Cases (bf16 and fp16, channels_last, on PyTorch's current stream, the same
tensors for every side), at ResNet-50's shapes:
  N32 56x56  64 -> 64   3x3        (conv2_x's middle convolution)
  N32 56x56  64 -> 256  1x1        (conv2_x's expansion)
  N32 28x28 128 -> 128  3x3        (conv3_x's middle convolution)
  N32 56x56 128 -> 128  3x3 / 2    (conv3_1's strided one)
  N32 14x14 256 -> 1024 1x1        (conv4_x's expansion)
each as
  weft      weft_conv2d on weights folded once by weft_conv2d_fold_bn:
            out = ReLU(conv(x, w') + b') in one kernel: the 1x1 ones a
            matrix product (weft_matmul's bias + ReLU epilogue), the others
            one cuDNN operation graph (convolution, bias add, ReLU)
  eager     torch eager F.conv2d -> F.batch_norm (inference) -> F.relu
  folded    torch with the BatchNorm folded by hand: F.relu(F.conv2d(x, w', b'))
and the host time of a first call (cuDNN's handle, the plan's heuristic,
the stream's workspace) against a call that finds its plan.
torch.backends.cudnn.benchmark is on, so PyTorch runs the algorithm it
measured fastest. weft is loaded through ctypes from libweft.so and called on
the tensors' data_ptr() and torch's current stream. Each result is checked
against torch eager's before it is timed. Rows (bench/results.py) go to
--rows; `make gpu-bench-conv RECORD=1` records them.
"""
import argparse
import ctypes
import functools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common  # noqa: E402
from bench_common import (machine, own_stream, print_results, run_fields,  # noqa: E402
                          write_results)

# median of 15 runs of back-to-back calls, each >= 20 ms, after 5 calls
time_per_call = functools.partial(bench_common.time_per_call, reps=15, min_ms=20.0, warmup=5)

F32, BF16, F16 = 0, 1, 2
ACT_NONE, ACT_RELU = 0, 1
EPS = 1e-5

SHAPES = [  # n, hw, c, k, r, stride, pad, what
    (32, 56, 64, 64, 3, 1, 1, "conv2_x 3x3"),
    (32, 56, 64, 256, 1, 1, 0, "conv2_x 1x1 expand"),
    (32, 28, 128, 128, 3, 1, 1, "conv3_x 3x3"),
    (32, 56, 128, 128, 3, 2, 1, "conv3_1 3x3 stride 2"),
    (32, 14, 256, 1024, 1, 1, 0, "conv4_x 1x1 expand"),
]


class ConvDesc(ctypes.Structure):
    """weft_conv2d_desc (include/weft/ops.h), field for field."""
    Z, I = ctypes.c_size_t, ctypes.c_int
    _fields_ = [("n", Z), ("h", Z), ("w", Z), ("c", Z), ("k", Z), ("r", Z), ("s", Z),
                ("stride_h", Z), ("stride_w", Z), ("pad_h", Z), ("pad_w", Z),
                ("dilation_h", Z), ("dilation_w", Z), ("groups", Z),
                ("dtype", I), ("act", I), ("allow_tf32", I),
                ("reserved", ctypes.c_uint64 * 8)]


def load_weft(path):
    lib = ctypes.CDLL(path)
    P = ctypes.c_void_p
    D = ctypes.POINTER(ConvDesc)
    lib.weft_conv2d.argtypes = [P, D, P, P, P, P]
    lib.weft_conv2d.restype = ctypes.c_int
    lib.weft_conv2d_fold_bn.argtypes = [P, D, ctypes.c_int, P, P, P, P, P, P, P, P,
                                        ctypes.c_float]
    lib.weft_conv2d_fold_bn.restype = ctypes.c_int
    lib.weft_conv2d_output_size.argtypes = [D, ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.POINTER(ctypes.c_size_t)]
    lib.weft_conv2d_output_size.restype = ctypes.c_int
    lib.weft_last_error.argtypes = []
    lib.weft_last_error.restype = ctypes.c_char_p
    return lib


def die(msg):
    print("bench_conv: " + msg, file=sys.stderr)
    sys.exit(1)


def check(lib, rc, what):
    if rc != 0:
        raise RuntimeError("%s: %d: %s" % (what, rc, lib.weft_last_error().decode()))


class Weft:
    def __init__(self, torch, lib):
        self.torch, self.lib = torch, lib

    def stream(self):
        return ctypes.c_void_p(self.torch.cuda.current_stream().cuda_stream)

    def desc(self, x, w, stride, pad, dtype, act=ACT_RELU):
        n, c, h, wd = x.shape
        k, _, r, s = w.shape
        return ConvDesc(n=n, h=h, w=wd, c=c, k=k, r=r, s=s, stride_h=stride, stride_w=stride,
                        pad_h=pad, pad_w=pad, dtype=dtype, act=act)

    def fold(self, desc, wf, bf, w, gamma, beta, mean, var):
        """wf, bf := the BatchNorm (fp32 statistics) folded into w (and no
        conv bias), on the GPU."""
        check(self.lib, self.lib.weft_conv2d_fold_bn(
            self.stream(), ctypes.byref(desc), F32, wf.data_ptr(), bf.data_ptr(), w.data_ptr(),
            None, gamma.data_ptr(), beta.data_ptr(), mean.data_ptr(), var.data_ptr(), EPS),
            "weft_conv2d_fold_bn")

    def conv(self, desc, out, x, w, bias):
        """A closure that runs out = act(conv(x, w) + bias) through weft."""
        args = (ctypes.byref(desc), out.data_ptr(), x.data_ptr(), w.data_ptr(), bias.data_ptr())
        lib, torch = self.lib, self.torch

        def call():
            s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            rc = lib.weft_conv2d(s, *args)
            if rc != 0:
                raise RuntimeError("weft_conv2d: %d: %s" % (rc, lib.weft_last_error().decode()))
        call.desc = desc  # kept alive with the closure
        return call


def rel_err(torch, got, want):
    got, want = got.double(), want.double()
    return (torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want)).item()


def check_layout(lib):
    """Host calls (NULL stream) through ConvDesc with the fields past the
    first ones set, so that a struct that drifted from the C one is caught
    here rather than on the GPU machine: a 1 x 3 x 4 x 2 input, 2 -> 2
    channels in 2 groups, 2x1 filter, stride 1x2, pad 1x0, dilation 2x1,
    ReLU (a 3 x 2 output); and the fold of a BatchNorm."""
    fa = ctypes.c_float
    x = [float(v) for v in range(-12, 12)]  # [y][x][c], 3 x 4 x 2
    w = [1.0, -2.0, 0.5, 3.0]  # [o][i][0][0] of 1 channel a group
    bias = [0.25, -1.0]
    desc = ConvDesc(n=1, h=3, w=4, c=2, k=2, r=2, s=1, stride_h=1, stride_w=2, pad_h=1, pad_w=0,
                    dilation_h=2, dilation_w=1, groups=2, dtype=F32, act=ACT_RELU)
    oh, ow = ctypes.c_size_t(), ctypes.c_size_t()
    check(lib, lib.weft_conv2d_output_size(ctypes.byref(desc), ctypes.byref(oh),
                                           ctypes.byref(ow)), "weft_conv2d_output_size")
    if (oh.value, ow.value) != (3, 2):
        die("ConvDesc does not match weft_conv2d_desc: output %d x %d, want 3 x 2" %
            (oh.value, ow.value))
    X, W, B = (fa * 24)(*x), (fa * 4)(*w), (fa * 2)(*bias)
    out = (fa * 12)(*([7.0] * 12))
    check(lib, lib.weft_conv2d(None, ctypes.byref(desc), out, X, W, B), "weft_conv2d")
    want = []
    for y in range(3):
        for xo in range(2):
            for o in range(2):
                v = bias[o]
                for i in range(2):
                    iy, ix = y + 2 * i - 1, xo * 2
                    if 0 <= iy < 3:
                        v += x[(iy * 4 + ix) * 2 + o] * w[o * 2 + i]
                want.append(max(v, 0.0))
    if list(out) != want:
        die("ConvDesc does not match weft_conv2d_desc: got %s, want %s" % (list(out), want))
    gamma, beta, mean, var = (fa * 2)(2, 1), (fa * 2)(0.5, 0), (fa * 2)(1, -1), (fa * 2)(3, 0)
    wf, bf = (fa * 4)(), (fa * 2)()
    check(lib, lib.weft_conv2d_fold_bn(None, ctypes.byref(desc), F32, wf, bf, W, B, gamma, beta,
                                       mean, var, 1.0), "weft_conv2d_fold_bn")
    want_w = [w[0], w[1], w[2] * 1.0, w[3] * 1.0]
    want_b = [0.5 + (0.25 - 1) * 1.0, 0 + (-1.0 + 1) * 1.0]
    if list(wf) != want_w or list(bf) != want_b:
        die("weft_conv2d_fold_bn: got %s %s, want %s %s" % (list(wf), list(bf), want_w, want_b))
    print("bench_conv: ConvDesc matches weft_conv2d_desc (%d bytes)" % ctypes.sizeof(ConvDesc))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench_common.add_run_options(ap, "conv.rows.jsonl", "batch 8; rows marked quick",
                                 "without a GPU or PyTorch: ConvDesc is the C struct (host calls)")
    args = ap.parse_args()
    if args.check_layout:
        check_layout(load_weft(args.lib))
        return

    import torch
    import torch.nn.functional as F
    if not torch.cuda.is_available():
        die("no GPU")
    torch.backends.cudnn.benchmark = True
    lib = load_weft(args.lib)
    weft = Weft(torch, lib)
    with own_stream(torch):
        run(torch, F, weft, args)


def run(torch, F, weft, args):
    dev = "cuda"
    torch.manual_seed(0)
    cl = torch.channels_last
    results = []  # (case, metric, value, unit, peer, peer_value, detail, targets)
    first_rows = []

    for dt, wt, tname in ((torch.bfloat16, BF16, "bf16"), (torch.float16, F16, "fp16")):
        for n, hw, c, k, r, stride, pad, what in SHAPES:
            if args.quick:
                n = 8
            x = torch.randn(n, c, hw, hw, device=dev, dtype=dt).to(memory_format=cl)
            w = (torch.randn(k, c, r, r, device=dev, dtype=dt) / (c * r * r) ** 0.5).to(
                memory_format=cl)
            gamma = torch.rand(k, device=dev) + 0.5
            beta = torch.randn(k, device=dev) * 0.1
            mean = torch.randn(k, device=dev) * 0.1
            var = torch.rand(k, device=dev) + 0.5
            desc = weft.desc(x, w, stride, pad, wt)
            wf = torch.empty_like(w)  # channels_last: KRSC in memory
            bf = torch.empty(k, device=dev, dtype=dt)
            weft.fold(desc, wf, bf, w, gamma, beta, mean, var)
            oh = (hw + 2 * pad - r) // stride + 1
            out = torch.empty(n, k, oh, oh, device=dev, dtype=dt).to(memory_format=cl)
            call = weft.conv(desc, out, x, wf, bf)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            call()  # this shape's first call: the plan (and, once, handle and workspace)
            first = (time.perf_counter() - t0) * 1e6
            torch.cuda.synchronize()

            def eager():
                y = F.conv2d(x, w, None, stride, pad)
                y = F.batch_norm(y, mean, var, gamma, beta, training=False, eps=EPS)
                return F.relu(y)
            # torch's own fold, in fp32 and rounded once, as weft's.
            scale = gamma / torch.sqrt(var + EPS)
            wt_ = (w.float() * scale.view(-1, 1, 1, 1)).to(dt).contiguous(memory_format=cl)
            bt_ = (beta - mean * scale).to(dt)
            folded = lambda: F.relu(F.conv2d(x, wt_, bt_, stride, pad))  # noqa: E731
            ref = eager()
            err = rel_err(torch, out, ref)
            err_fold = rel_err(torch, wf, wt_)
            if err > 2e-2 or err_fold > 1e-2:
                die("%s %s: weft differs from torch eager by %.2e (folded weights by %.2e)" %
                    (what, tname, err, err_fold))
            tw = time_per_call(torch, call)
            te = time_per_call(torch, eager)
            tf = time_per_call(torch, folded)
            flop = 2.0 * n * oh * oh * k * c * r * r
            case = "conv+BN+ReLU %s N%d %dx%d %d->%d %dx%d%s" % (
                tname, n, hw, hw, c, k, r, r, " stride %d" % stride if stride > 1 else "")
            results.append((case, "time", tw * 1e6, "us", "torch eager conv->bn->relu",
                            te * 1e6,
                            "%.1f TFLOP/s; torch with BN folded by hand (conv+bias, relu) "
                            "%.1f us; error vs eager %.1e" % (flop / tw / 1e12, tf * 1e6, err),
                            [("at or below torch with BN folded by hand in the same run", "<=",
                              tf * 1e6)]))
            first_rows.append((case, first))
            del x, w, wf, bf, out, wt_, bt_, ref

    # ---- first call (plan made) against the next (plan found) ----
    x = torch.randn(4, 48, 20, 20, device=dev, dtype=torch.bfloat16).to(memory_format=cl)
    w = torch.randn(80, 48, 3, 3, device=dev, dtype=torch.bfloat16).to(memory_format=cl)
    b = torch.randn(80, device=dev, dtype=torch.bfloat16)
    out = torch.empty(4, 80, 20, 20, device=dev, dtype=torch.bfloat16).to(memory_format=cl)
    call = weft.conv(weft.desc(x, w, 1, 1, BF16), out, x, w, b)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    host = []
    for _ in range(200):
        s = time.perf_counter()
        call()
        host.append(time.perf_counter() - s)
        torch.cuda.synchronize()
    results.append(("first call of the process (host time)", "time", first_rows[0][1], "us",
                    None, None, "cuDNN's handle, the stream's 32 MiB workspace and the plan "
                    "(%s)" % first_rows[0][0], []))
    results.append(("first call of a new shape (host time)", "time", (t1 - t0) * 1e6, "us",
                    None, None, "cuDNN's heuristic and the plan's descriptors", []))
    results.append(("call with the plan cached (host time, through ctypes)", "time",
                    statistics.median(host) * 1e6, "us", None, None,
                    "median of 200; includes Python's ctypes call", []))

    # ---- report ----
    print_results(results)
    if args.no_rows:
        return
    mach, commit = machine(torch, cudnn=True)
    write_results(args.rows, run_fields(
        "conv", mach, commit, "Release build; median of 15 runs of back-to-back calls, >= 20 ms "
        "each, after warm-up, on PyTorch's current stream; channels_last; "
        "torch.backends.cudnn.benchmark on", args.quick), results)
    print("bench_conv: rows in %s" % args.rows)


if __name__ == "__main__":
    main()
