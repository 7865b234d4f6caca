#!/usr/bin/env python3
"""bench_ops.py - weft's fused operators against PyTorch, in one process.

For each operator, dtype (bf16, fp32) and large shape (16384x4096,
4096x16384, 65536x1024, 1024x65536) it times weft's kernel, PyTorch eager
and torch.compile on the same tensors and stream, and a device-to-device
copy for the ceiling. Effective bandwidth counts the bytes an operator must
move: each input read once, each output written once. It also times the
tuning variants kept in variants_*.cu, and small inputs (1 to 64 rows of
4096) against an empty kernel.

weft is called through ctypes on the tensors' data_ptr() and
torch.cuda.current_stream().cuda_stream, from libweft_ops_bench.so (all of
weft in one shared object; see CMakeLists.txt here). That library holds a
static CUDA runtime whose thread-local storage must be reserved at process
start, so the script re-executes itself with the library in LD_PRELOAD.

Prints a report and `BENCH <name> <value> <unit>` lines, and writes the
headline's rows (JSON lines, one per figure with torch.compile's beside it:
bench/results.py) to a file in the build tree; `make gpu-bench-ops
RECORD=1` records them in bench/results.jsonl and bench/RESULTS.md. The
tuning variants are in the report alone. Exit status: 0, 1 on an error (PyTorch
missing, a weft call failing, results that disagree with PyTorch), 77 when
there is no GPU. Usage: bench/ops/bench_ops.py --help; `make gpu-bench-ops`
builds and runs it.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common  # noqa: E402
from bench_common import ROOT, machine, run_fields, utc_now  # noqa: E402

DEFAULT_LIB = os.path.join(ROOT, "build-release", "bench", "ops", "libweft_ops_bench.so")

SHAPES = [(16384, 4096), (4096, 16384), (65536, 1024), (1024, 65536)]
SMALL_ROWS = [1, 2, 4, 8, 16, 32, 64]
# the two with targets against torch.compile first: measured before any
# time budget runs out
OPS = ["gelu_layernorm", "softmax", "rmsnorm", "layernorm", "add_layernorm",
       "bias_gelu_residual", "swiglu", "rope"]
WEFT_DTYPE = {"f32": 0, "bf16": 1, "f16": 2}
# the tuning variants (variants_*.cu): of softmax and LayerNorm, of
# RMSNorm, of add+LayerNorm, of the fused GELU+LayerNorm, of
# bias+GELU+residual, of SwiGLU, of RoPE
ROW_VARIANTS = ("lib", "ring2", "ring2_checked", "ring4", "ring2_wide", "held", "held_checked",
                "held_narrow", "held_wide", "held_spread", "held_spread8", "held_push",
                "held_packed", "held_packed16", "held_packed64", "held_packed_pairs",
                "held_packed_quads", "held_packed_eights", "held_packed32", "ring2_packed_quads",
                "packed_quads_b3", "packed_quads_b2", "tpr_packed_pairs", "tpr_packed_quads",
                "held_push_polled",
                "held_packed_quads_polled", "held_online", "ring2_online", "held_online_push",
                "held_online_push_polled", "held_online_push16", "held_push_moments",
                "held_wide_moments", "held_packed_pairs_moments", "held_packed_quads_moments",
                "held_push_passes", "held_wide_passes", "held_packed_pairs_passes",
                "held_packed_quads_passes", "lib_moments", "lib_passes",
                "lib_no_ahead", "lib_ahead4", "lib_ahead8", "lib_short_ahead", "lib_split16",
                "lib_split8", "lib_split16_ahead", "lib_split8_ahead", "lib_pairs", "staged",
                "regs", "regs_half", "regs_double", "regs_flat")
FUSED_VARIANTS = ("lib", "held", "held_checked", "held_narrow", "held_wide", "held_spread",
                  "held_spread8", "held_push", "held_warp", "held_packed", "held_packed16",
                  "held_packed64", "held_packed_pairs", "held_packed_quads", "held_packed32",
                  "packed_b6", "packed_b5", "half_fit", "lib_checked", "held_push_polled",
                  "lib_moments", "lib_passes", "lib_no_ahead", "lib_ahead4", "lib_ahead8",
                  "lib_short_ahead", "lib_split8", "lib_split8_ahead")
RMS_VARIANTS = ("lib", "ring2", "held", "held_narrow", "held_wide", "held_push", "held_packed64",
                "held_packed_pairs", "held_packed_quads", "ring2_packed_quads", "packed_quads_b3",
                "packed_quads_b2", "tpr_packed_pairs", "tpr_packed_quads", "held_push_polled",
                "held_packed_quads_polled", "lib_passes", "lib_tensor", "lib_no_ahead",
                "lib_ahead4", "lib_ahead8", "lib_short_ahead", "lib_split16", "lib_split8",
                "lib_split16_ahead", "lib_split8_ahead")
ADD_LN_VARIANTS = ("lib", "held_push", "held_packed64", "held_packed_pairs", "held_packed_quads",
                   "packed_quads_b3", "packed_quads_b2", "tpr_packed_pairs", "tpr_packed_quads",
                   "held_push_polled", "held_packed_quads_polled", "held_push_moments",
                   "held_packed_pairs_moments", "held_packed_quads_moments", "held_push_passes",
                   "held_packed_pairs_passes", "held_packed_quads_passes", "lib_moments",
                   "lib_passes", "lib_no_ahead", "lib_ahead4", "lib_ahead8", "lib_short_ahead",
                   "lib_split16", "lib_split8", "lib_split16_ahead", "lib_split8_ahead")
CHECKED_VARIANTS = ("lib", "held_push_checked", "held_packed_pairs_checked",
                    "held_packed_quads_checked")
GELU_VARIANTS = ("lib", "libm_erfc", "fit7", "fit5", "fit3", "select", "pairs", "grid8",
                 "offsets", "flat", "once", "wave", "tile2", "tile4")
GLU_VARIANTS = ("lib", "rows", "flat", "once", "wave", "tile2", "tile4")
ROPE_VARIANTS = ("lib", "angles_each", "bounds4", "fewest", "fill4", "angle16", "angle32",
                 "floats", "heads4", "heads4_b2", "runs", "early", "streamed", "reduced",
                 "early_reduced", "touch", "walk_only")
VARIANTS = sorted(set(ROW_VARIANTS + FUSED_VARIANTS + RMS_VARIANTS + ADD_LN_VARIANTS +
                      CHECKED_VARIANTS + GELU_VARIANTS + GLU_VARIANTS + ROPE_VARIANTS))


def torch_dtype(torch, dtype_name):
    return {"bf16": torch.bfloat16, "f32": torch.float32, "f16": torch.float16}[dtype_name]
EPS = 1e-5


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=DEFAULT_LIB, help="libweft_ops_bench.so to load")
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of " + ",".join(OPS))
    ap.add_argument("--dtypes", default="bf16,f32")
    ap.add_argument("--shapes", default=",".join("%dx%d" % s for s in SHAPES))
    ap.add_argument("--small-dtypes", default="bf16",
                    help="dtypes of the small inputs' table (rows of 4096); other than bf16 "
                    "an op's row is named with its dtype")
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    ap.add_argument("--no-variants", action="store_true", help="leave the tuning variants out")
    ap.add_argument("--variants", help="comma-separated subset of the tuning variants to time "
                    "(the library's kernel, lib, is always timed)")
    ap.add_argument("--budget", type=float, default=480,
                    help="seconds: past 70%% of it torch.compile is skipped, past it the "
                    "variants and small inputs, so that a report is always written")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time the variants this many times over, each round on fresh "
                    "tensors after the other shapes; the report gives each one's median and "
                    "range (a kernel's speed has moved by up to 7%% between processes)")
    ap.add_argument("--quick", action="store_true",
                    help="fewer repetitions; the section is marked as not figures to quote")
    ap.add_argument("--rest-ms", type=float, default=REST_MS,
                    help="leave the GPU idle this long before each timing, so that each "
                    "starts at the clock an idle GPU has (default %(default)g)")
    ap.add_argument("--clocks", action="store_true",
                    help="read the SM clock (NVML) at the end of each variant's timing and "
                    "give its range beside the figure")
    ap.add_argument("--no-rows", "--no-append", dest="no_rows", action="store_true",
                    help="write no rows")
    ap.add_argument("--rows", default=os.path.join(ROOT, "build-release", "bench",
                                                    "ops.rows.jsonl"),
                    help="write the headline's rows (JSON lines) here, this run's alone "
                    "(default %(default)s)")
    ap.add_argument("--check-symbols", action="store_true",
                    help="only check that the library defines every entry point called "
                    "here (needs no GPU or PyTorch)")
    return ap.parse_args()


def die(msg, status=1):
    print("bench_ops: " + msg, file=sys.stderr)
    sys.exit(status)


def preload_self(lib):
    """Re-execute with lib in LD_PRELOAD, once (see the module comment)."""
    if not os.path.exists(lib):
        die("%s is missing: build it first (make gpu-bench-ops builds build-release/)" % lib)
    lib = os.path.abspath(lib)
    preload = os.environ.get("LD_PRELOAD", "")
    if lib in preload.split(":"):
        return lib
    env = dict(os.environ, LD_PRELOAD=(lib + ":" + preload) if preload else lib)
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


# ---- weft through ctypes --------------------------------------------------


class SoftmaxOpts(ctypes.Structure):
    _fields_ = [("scale", ctypes.c_float), ("causal_q", ctypes.c_size_t),
                ("dropout_p", ctypes.c_float), ("seed", ctypes.c_uint64),
                ("offset", ctypes.c_uint64)]


def signatures():
    """weft's entry points that the script calls, with their argument types."""
    P, Z, I, F = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_float
    return {
        "weft_bias_gelu_residual": [P, I, I, P, P, P, P, Z, Z, Z],
        "weft_layernorm": [P, I, P, P, P, P, P, P, F, Z, Z, Z],
        "weft_rmsnorm": [P, I, P, P, P, P, P, F, Z, Z, Z],
        "weft_bias_gelu_residual_layernorm": [P, I, I, P, P, P, P, P, P, P, F, Z, Z, Z],
        "weft_softmax": [P, I, P, P, Z, Z, Z, ctypes.POINTER(SoftmaxOpts)],
        "weft_rope": [P, I, I, P, Z, Z, P, Z, Z, Z, Z, P, F],
        "weft_glu": [P, I, I, P, P, Z, Z, Z, Z],
        "weft_bench_empty": [P],
        "weft_bench_softmax_variant": [P, I, ctypes.c_char_p, P, P, Z, Z],
        "weft_bench_layernorm_variant": [P, I, ctypes.c_char_p, P, P, P, P, Z, Z],
        "weft_bench_rmsnorm_variant": [P, I, ctypes.c_char_p, P, P, P, Z, Z],
        "weft_bench_add_layernorm_variant": [P, I, ctypes.c_char_p, P, P, P, P, P, P, Z, Z],
        "weft_bench_gelu_layernorm_variant": [P, I, ctypes.c_char_p, P, P, P, P, P, P, Z, Z],
        "weft_bench_gelu_walk": [P, I, ctypes.c_char_p, P, P, P, P, Z, Z],
        "weft_bench_glu_variant": [P, I, ctypes.c_char_p, P, P, Z, Z, Z, Z],
        "weft_bench_gelu_pairs": [P, I, P, P, P, P, Z, Z],
        "weft_bench_gelu_grid8": [P, I, P, P, P, P, Z, Z],
        "weft_bench_gelu_offsets": [P, I, P, P, P, P, Z, Z],
        "weft_bench_rope_variant": [P, I, ctypes.c_char_p, P, Z, P, Z, Z, Z, P,
                                    ctypes.c_double],
    }


def check_symbols(path):
    """Whether the library defines every entry point the script calls: read
    from its dynamic symbols (nm), so that it runs without a GPU or PyTorch."""
    try:
        out = subprocess.run(["nm", "-D", "--defined-only", path], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        die("cannot list the symbols of %s: %s" % (path, e))
    defined = {line.split()[-1] for line in out.splitlines() if line.strip()}
    missing = sorted((set(signatures()) | {"weft_last_error"}) - defined)
    if missing:
        die("%s lacks %s" % (path, ", ".join(missing)))
    print("bench_ops: %s defines all %d entry points" % (path, len(signatures()) + 1))


def load_weft(path):
    lib = ctypes.CDLL(path)
    for name, args in signatures().items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = ctypes.c_int
    lib.weft_last_error.argtypes = []
    lib.weft_last_error.restype = ctypes.c_char_p
    return lib


class WeftError(Exception):
    pass


def checked(lib, fn):
    """fn() -> weft status; raises with weft's message on an error."""
    def call():
        rc = fn()
        if rc != 0:
            raise WeftError("weft status %d: %s" % (rc, lib.weft_last_error().decode()))
    return call


# ---- timing ----------------------------------------------------------------


# Each timing may first leave the GPU idle for REST_MS (--rest-ms). The
# SM clock follows the power drawn over the last few hundred milliseconds:
# LayerNorm bf16 at 1024x65536 run back to back held 1980 MHz for 200 ms,
# then medians of 1785-1905 and 2-9% less bandwidth; softmax timed after
# SwiGLU read 3-7% below itself timed after LayerNorm, at clocks down to
# 1500 MHz (bench/history/2026-12-02.md, 17:01 and 17:10). Running the
# kernel 20 ms before timing it did not remove that; 200 ms of rest kept
# every timing at 1980 MHz (18:12), each kernel starting from one state.
REST_MS = 0.0


class SmClock:
    """The GPU's SM clock in MHz, read through NVML (libnvidia-ml, which
    the driver installs) at the end of each timing, when --clocks asks for
    it: only read, never set. None where NVML cannot be loaded."""

    def __init__(self):
        self.nvml, self.handle = None, ctypes.c_void_p()
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if nvml.nvmlInit_v2() == 0 and nvml.nvmlDeviceGetHandleByIndex_v2(
                    0, ctypes.byref(self.handle)) == 0:
                self.nvml = nvml
        except (OSError, AttributeError):
            pass

    def mhz(self):
        if self.nvml is None:
            return None
        clock = ctypes.c_uint()
        if self.nvml.nvmlDeviceGetClockInfo(self.handle, 1, ctypes.byref(clock)) != 0:
            return None  # 1: NVML_CLOCK_SM
        return clock.value


SM_CLOCK = None  # an SmClock under --clocks
SM_CLOCKS = []  # the clock at the end of each timing, in order, under --clocks


def last_clock():
    """The SM clock at the end of the last timing, or None."""
    return SM_CLOCKS[-1] if SM_CLOCK is not None and SM_CLOCKS else None


def time_per_call(torch, fn, reps, min_ms=10.0):
    """Median seconds per call of fn over reps runs of back-to-back calls
    (at most 500 a run), after REST_MS idle and 3 calls."""
    if REST_MS > 0:
        torch.cuda.synchronize()
        time.sleep(REST_MS * 1e-3)
    t = bench_common.time_per_call(torch, fn, reps, min_ms, max_iters=500)
    if SM_CLOCK is not None:
        SM_CLOCKS.append(SM_CLOCK.mhz())
    return t


def time_in_graph(torch, fn, reps, launches=200):
    """Median seconds per launch of fn, launches captured in one CUDA graph
    (so the host's launch cost is not what is measured)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(launches):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / launches * 1e-3)
    return statistics.median(times)


# ---- the operators -----------------------------------------------------------


def ran(lib, call, got, want):
    """Run weft's call, then give its output and PyTorch's (computed after,
    from the same inputs) to compare."""
    checked(lib, call)()
    return got, want()


class Case:
    """One operator on one shape and dtype: its tensors, the bytes it must
    move, weft's call, and PyTorch's version (a function of the tensors)."""

    def __init__(self, name, nbytes, weft_call, torch_fn, torch_args, check, outputs=()):
        self.name, self.nbytes = name, nbytes
        self.weft_call, self.torch_fn, self.torch_args = weft_call, torch_fn, torch_args
        self.check = check  # () -> (weft result, PyTorch result), compared once
        # Tensors weft writes through raw pointers that nothing else holds:
        # freed, their memory may be unmapped under those pointers
        # (torch.cuda.graph empties the allocator's cache before capturing).
        self.outputs = outputs


def cur_stream():
    # Never 0 here: main runs on a stream of its own, and weft reads a NULL
    # stream as "run on the host".
    import torch
    return torch.cuda.current_stream().cuda_stream


def make_case(torch, lib, op, rows, cols, dtype_name):
    F = torch.nn.functional
    dt = torch_dtype(torch, dtype_name)
    wd = WEFT_DTYPE[dtype_name]
    es = torch.tensor([], dtype=dt).element_size()
    dev = "cuda"
    stream = cur_stream

    def rand(*shape):
        return torch.randn(*shape, device=dev, dtype=dt)

    def ptr(t):
        return ctypes.c_void_p(t.data_ptr() if t is not None else 0)

    rc = rows * cols
    if op == "bias_gelu_residual":
        x, b, r, out = rand(rows, cols), rand(cols), rand(rows, cols), rand(rows, cols)
        args = (ptr(out), ptr(x), ptr(b), ptr(r))

        def call():
            return lib.weft_bias_gelu_residual(stream(), wd, 1, *args, rows, cols, cols)

        def fn(x, b, r):
            return F.gelu(x + b) + r
        return Case(op, (3 * rc + cols) * es, call, fn, (x, b, r),
                    lambda: ran(lib, call, out, lambda: fn(x, b, r)))
    if op == "layernorm":
        x, w, b, out = rand(rows, cols), rand(cols), rand(cols), rand(rows, cols)
        args = (ptr(out), ptr(None), ptr(x), ptr(None), ptr(w), ptr(b))

        def call():
            return lib.weft_layernorm(stream(), wd, *args, EPS, rows, cols, cols)

        def fn(x, w, b):
            return F.layer_norm(x, (cols,), w, b, EPS)
        return Case(op, (2 * rc + 2 * cols) * es, call, fn, (x, w, b),
                    lambda: ran(lib, call, out, lambda: fn(x, w, b)))
    if op == "add_layernorm":
        x, r, w, b = rand(rows, cols), rand(rows, cols), rand(cols), rand(cols)
        s, out = rand(rows, cols), rand(rows, cols)
        args = (ptr(out), ptr(s), ptr(x), ptr(r), ptr(w), ptr(b))

        def call():
            return lib.weft_layernorm(stream(), wd, *args, EPS, rows, cols, cols)

        def fn(x, r, w, b):
            t = x + r
            return t, F.layer_norm(t, (cols,), w, b, EPS)
        return Case(op, (4 * rc + 2 * cols) * es, call, fn, (x, r, w, b),
                    lambda: ran(lib, call, out, lambda: fn(x, r, w, b)[1]), outputs=(s,))
    if op == "rmsnorm":
        x, w, out = rand(rows, cols), rand(cols), rand(rows, cols)
        args = (ptr(out), ptr(None), ptr(x), ptr(None), ptr(w))

        def call():
            return lib.weft_rmsnorm(stream(), wd, *args, EPS, rows, cols, cols)

        if hasattr(F, "rms_norm"):
            def fn(x, w):
                return F.rms_norm(x, (cols,), w, EPS)
        else:
            def fn(x, w):
                xf = x.float()
                return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w
        return Case(op, (2 * rc + cols) * es, call, fn, (x, w),
                    lambda: ran(lib, call, out, lambda: fn(x, w)))
    if op == "gelu_layernorm":
        x, gb, r = rand(rows, cols), rand(cols), rand(rows, cols)
        w, b, out = rand(cols), rand(cols), rand(rows, cols)
        args = (ptr(out), ptr(None), ptr(x), ptr(gb), ptr(r), ptr(w), ptr(b))

        def call():
            return lib.weft_bias_gelu_residual_layernorm(stream(), wd, 1, *args, EPS, rows, cols,
                                                         cols)

        def fn(x, gb, r, w, b):
            return F.layer_norm(F.gelu(x + gb) + r, (cols,), w, b, EPS)
        return Case(op, (3 * rc + 3 * cols) * es, call, fn, (x, gb, r, w, b),
                    lambda: ran(lib, call, out, lambda: fn(x, gb, r, w, b)))
    if op == "softmax":
        x, out = rand(rows, cols), rand(rows, cols)
        args = (ptr(out), ptr(x))

        def call():
            return lib.weft_softmax(stream(), wd, *args, rows, cols, cols, None)

        def fn(x):
            return torch.softmax(x, -1)
        return Case(op, 2 * rc * es, call, fn, (x,),
                    lambda: ran(lib, call, out, lambda: fn(x)))
    if op == "rope":
        # rows tokens of cols / 128 heads of 128 for Q and for K, NeoX
        # halves layout; PyTorch gets cos/sin tables built beforehand.
        hd = 128
        heads = cols // hd
        q, k = rand(rows, cols), rand(rows, cols)
        pos = torch.randint(0, 32768, (rows,), device=dev, dtype=torch.int32)
        inv = 10000.0 ** (-2.0 * torch.arange(hd // 2, device=dev, dtype=torch.float64) / hd)
        ang = pos.double()[:, None] * inv[None, :]
        cos, sin = ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]
        args = (ptr(q), heads, cols, ptr(k), heads, cols, rows, hd, ptr(pos))

        def call():
            return lib.weft_rope(stream(), wd, 1, *args, 10000.0)

        def fn(q, k, cos, sin):
            def rot(t):
                t = t.view(rows, heads, hd)
                a, b = t[..., : hd // 2].float(), t[..., hd // 2:].float()
                return torch.cat((a * cos - b * sin, a * sin + b * cos), -1).to(t.dtype)
            return rot(q), rot(k)

        def check():
            q0, k0 = q.clone(), k.clone()
            want = fn(q0, k0, cos, sin)[0]
            call()
            got = q.view(rows, heads, hd).clone()
            q.copy_(q0), k.copy_(k0)
            return got, want
        return Case(op, (4 * rc) * es + 4 * rows, call, fn, (q, k, cos, sin), check)
    if op == "swiglu":
        x, out = rand(rows, 2 * cols), rand(rows, cols)
        args = (ptr(out), ptr(x))

        def call():
            return lib.weft_glu(stream(), wd, 0, *args, rows, cols, 2 * cols, cols)

        def fn(x):
            a, b = x.chunk(2, -1)
            return F.silu(a) * b
        return Case(op, 3 * rc * es, call, fn, (x,),
                    lambda: ran(lib, call, out, lambda: fn(x)))
    raise ValueError(op)


def compare(got, want, dtype_name):
    """Largest error relative to the largest value, and whether it is
    within what the dtype's rounding allows against PyTorch's own."""
    g, w = got.float(), want.float()
    bad = (g.isnan() != w.isnan()).any().item()
    err = ((g - w).nan_to_num().abs().max() / (w.nan_to_num().abs().max() + 1e-30)).item()
    return err, (not bad) and err <= (3e-2 if dtype_name != "f32" else 1e-4)


# ---- the run ---------------------------------------------------------------------


def main():
    args = parse_args()
    if args.check_symbols:
        return check_symbols(args.lib)
    lib_path = preload_self(args.lib)
    try:
        import torch
    except ImportError:
        die("PyTorch is not installed here: this benchmark measures weft against PyTorch eager "
            "and torch.compile, so it needs torch with CUDA (as on the GPU machine)")
    if not torch.cuda.is_available():
        print("bench_ops: no GPU here; nothing measured", file=sys.stderr)
        sys.exit(77)
    lib = load_weft(lib_path)
    global REST_MS, SM_CLOCK
    REST_MS = args.rest_ms
    if args.clocks:
        SM_CLOCK = SmClock()
        if SM_CLOCK.nvml is None:
            print("bench_ops: NVML cannot be loaded here: no clocks read", file=sys.stderr)
    # weft reads a NULL stream as "run on the host", and PyTorch's default
    # stream is CUDA's legacy NULL stream: everything runs on one of ours.
    with torch.cuda.stream(torch.cuda.Stream()):
        run(torch, lib, args)


def run(torch, lib, args):
    started = time.monotonic()

    def elapsed():
        return time.monotonic() - started

    reps = 3 if args.quick else 5
    ops = [o for o in args.ops.split(",") if o]
    dtypes = [d for d in args.dtypes.split(",") if d]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    for o in ops:
        if o not in OPS:
            die("unknown op %s (know %s)" % (o, ",".join(OPS)), 2)
    if not args.no_compile:
        dyn = torch._dynamo.config
        for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(dyn, knob):
                setattr(dyn, knob, 4096)

    bench = []  # (name, value, unit)
    failures = []
    notes = []

    def emit(name, value, unit):
        bench.append((name, value, unit))
        print("BENCH %s %.6g %s" % (name, value, unit), flush=True)

    def progress(msg):
        print("bench_ops: " + msg, file=sys.stderr, flush=True)

    # The ceiling: a device-to-device copy of 512 MiB (read 512, write 512).
    src = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    src.fill_(1)
    t_copy = time_per_call(torch, lambda: dst.copy_(src), reps)
    copy_tbps = 2 * src.numel() / t_copy / 1e12
    del src, dst
    emit("ops.copy.tbps", copy_tbps, "TB/s")

    rows_out = []  # (op, dtype, shape, weft, eager, compiled) in TB/s
    for op in ops:
        for dtype_name in dtypes:
            for (r, c) in shapes:
                tag = "%s.%s.%dx%d" % (op, dtype_name, r, c)
                progress(tag)
                torch.manual_seed(r * 7 + c)
                case = make_case(torch, lib, op, r, c, dtype_name)
                call = checked(lib, case.weft_call)
                try:
                    got, want = case.check()
                    torch.cuda.synchronize()
                    err, ok = compare(got, want, dtype_name)
                    del got, want
                    if not ok:
                        failures.append("%s: differs from PyTorch (relative error %.3g)" %
                                        (tag, err))
                    t_weft = time_per_call(torch, call, reps)
                except WeftError as e:
                    failures.append("%s: %s" % (tag, e))
                    continue
                eager = lambda: case.torch_fn(*case.torch_args)  # noqa: E731
                t_eager = time_per_call(torch, eager, reps)
                t_comp = None
                if not args.no_compile and elapsed() > 0.7 * args.budget:
                    notes.append("torch.compile left out past 70% of the time budget")
                elif not args.no_compile:
                    compiled = torch.compile(case.torch_fn, dynamic=False)
                    t_comp = time_per_call(torch, lambda: compiled(*case.torch_args), reps)
                bw = [case.nbytes / t / 1e12 if t else None for t in (t_weft, t_eager, t_comp)]
                emit("ops.%s.weft.tbps" % tag, bw[0], "TB/s")
                emit("ops.%s.weft.pct_copy" % tag, 100 * bw[0] / copy_tbps, "%")
                emit("ops.%s.eager.tbps" % tag, bw[1], "TB/s")
                if bw[2]:
                    emit("ops.%s.compile.tbps" % tag, bw[2], "TB/s")
                    emit("ops.%s.weft_vs_compile" % tag, bw[0] / bw[2], "x")
                rows_out.append((op, dtype_name, (r, c), bw[0], bw[1], bw[2], err))
                del case
                torch.cuda.empty_cache()

    # Tuning variants of the row kernels and of GELU, on the same shapes.
    variants_out = []  # (kernel, variant, dtype, shape, TB/s, SM MHz or None)
    if not args.no_variants and elapsed() > args.budget:
        notes.append("variants skipped: past the time budget")
    elif not args.no_variants:
        chosen = VARIANTS if args.variants is None else ["lib"] + args.variants.split(",")
        unknown = set(chosen) - set(VARIANTS)
        if unknown:
            die("bench_ops: no variants %s" % ", ".join(sorted(unknown)), 2)
        rounds = [(k, shape) for k in range(max(args.rounds, 1)) for shape in shapes]
        for dtype_name in dtypes:
            wd = WEFT_DTYPE[dtype_name]
            for rnd, (r, c) in rounds:
                progress("variants %s %dx%d%s" % (dtype_name, r, c, ", round %d" % (rnd + 1)
                                                  if args.rounds > 1 else ""))
                dt = torch_dtype(torch, dtype_name)
                es = torch.tensor([], dtype=dt).element_size()
                x = torch.randn(r, c, device="cuda", dtype=dt)
                y = torch.empty_like(x)
                z = torch.randn(r, c, device="cuda", dtype=dt)
                w = torch.randn(c, device="cuda", dtype=dt)
                b = torch.randn(c, device="cuda", dtype=dt)
                P, s = ctypes.c_void_p, cur_stream
                lib_out = {}
                lib_timed = {}  # kern: what times the library's kernel, for lib_last
                queued = []  # (kern, v, fn, nbytes, tag): checked, to be timed

                def time_variant(kern, v, fn, nbytes, tag=None, must_apply=False):
                    """Queues variant v of kern (fn launches it into y) for timing, if
                    it applies and computes what the library's kernel ("lib", run
                    first) does."""
                    if v not in chosen:
                        return
                    if fn() != 0:
                        if must_apply:
                            failures.append("variant %s %s: %s" %
                                            (kern, v, lib.weft_last_error().decode()))
                        return  # the variant does not apply to this shape
                    if v == "lib":
                        lib_out[kern] = y.float().clone()
                    elif kern in lib_out:
                        want = lib_out[kern]
                        err = (y.float() - want).abs().max().item()
                        if not err <= (2e-2 if dtype_name != "f32" else 1e-4) * \
                                max(want.abs().max().item(), 1e-30):
                            failures.append("variant %s %s %s %dx%d: differs from the "
                                            "library by %.3g" % (kern, v, dtype_name, r, c, err))
                            return
                    queued.append((kern, v, fn, nbytes, tag))

                for v in ROW_VARIANTS:
                    for kern in ("softmax", "layernorm"):
                        if kern == "softmax" and v == "lib":
                            fn = (lambda: lib.weft_softmax(
                                s(), wd, P(y.data_ptr()), P(x.data_ptr()), r, c, c, None))
                        elif kern == "softmax":
                            fn = (lambda v=v: lib.weft_bench_softmax_variant(
                                s(), wd, v.encode(), P(y.data_ptr()), P(x.data_ptr()), r, c))
                        elif v == "lib":
                            fn = (lambda: lib.weft_layernorm(
                                s(), wd, P(y.data_ptr()), None, P(x.data_ptr()), None,
                                P(w.data_ptr()), P(b.data_ptr()), EPS, r, c, c))
                        else:
                            fn = (lambda v=v: lib.weft_bench_layernorm_variant(
                                s(), wd, v.encode(), P(y.data_ptr()), P(x.data_ptr()),
                                P(w.data_ptr()), P(b.data_ptr()), r, c))
                        time_variant(kern, v, fn,
                                     (2 * r * c + (0 if kern == "softmax" else 2 * c)) * es)
                # RMSNorm: the ring against held, its cluster's statistics met at
                # barriers or pushed
                for v in RMS_VARIANTS:
                    if v == "lib":
                        fn = (lambda: lib.weft_rmsnorm(
                            s(), wd, P(y.data_ptr()), None, P(x.data_ptr()), None,
                            P(w.data_ptr()), EPS, r, c, c))
                    else:
                        fn = (lambda v=v: lib.weft_bench_rmsnorm_variant(
                            s(), wd, v.encode(), P(y.data_ptr()), P(x.data_ptr()),
                            P(w.data_ptr()), r, c))
                    time_variant("rmsnorm", v, fn, (2 * r * c + c) * es)
                # the norms' calls the library once left to the checked kernels
                # (without weight or bias, LayerNorm with the weight alone,
                # add+LayerNorm without the sum): the library's kernels for
                # them against those
                def ln(v, weight, bias, residual=None):
                    res = P(residual.data_ptr()) if residual is not None else None
                    if v == "lib":
                        return lib.weft_layernorm(
                            s(), wd, P(y.data_ptr()), None, P(x.data_ptr()), res, weight, bias,
                            EPS, r, c, c)
                    if residual is not None:
                        return lib.weft_bench_add_layernorm_variant(
                            s(), wd, v.encode(), P(y.data_ptr()), None, P(x.data_ptr()), res,
                            weight, bias, r, c)
                    return lib.weft_bench_layernorm_variant(
                        s(), wd, v.encode(), P(y.data_ptr()), P(x.data_ptr()), weight, bias, r, c)

                def rms_bare(v):
                    if v == "lib":
                        return lib.weft_rmsnorm(s(), wd, P(y.data_ptr()), None, P(x.data_ptr()),
                                                None, None, EPS, r, c, c)
                    return lib.weft_bench_rmsnorm_variant(
                        s(), wd, v.encode(), P(y.data_ptr()), P(x.data_ptr()), None, r, c)

                for v in CHECKED_VARIANTS:
                    time_variant("layernorm (bare)", v, lambda v=v: ln(v, None, None),
                                 2 * r * c * es, "layernorm_bare")
                    time_variant("rmsnorm (bare)", v, lambda v=v: rms_bare(v), 2 * r * c * es,
                                 "rmsnorm_bare")
                    time_variant("layernorm (weight)", v,
                                 lambda v=v: ln(v, P(w.data_ptr()), None),
                                 (2 * r * c + c) * es, "layernorm_weight")
                    time_variant("add_layernorm (no sum)", v,
                                 lambda v=v: ln(v, P(w.data_ptr()), P(b.data_ptr()), z),
                                 (3 * r * c + 2 * c) * es, "add_layernorm_no_sum")
                # add+LayerNorm (z the residual, the sum into u): packed where the
                # library holds the row as fp32, and the other way about
                u = torch.empty_like(x)
                for v in ADD_LN_VARIANTS:
                    if v == "lib":
                        fn = (lambda: lib.weft_layernorm(
                            s(), wd, P(y.data_ptr()), P(u.data_ptr()), P(x.data_ptr()),
                            P(z.data_ptr()), P(w.data_ptr()), P(b.data_ptr()), EPS, r, c, c))
                    else:
                        fn = (lambda v=v: lib.weft_bench_add_layernorm_variant(
                            s(), wd, v.encode(), P(y.data_ptr()), P(u.data_ptr()),
                            P(x.data_ptr()), P(z.data_ptr()), P(w.data_ptr()),
                            P(b.data_ptr()), r, c))
                    time_variant("add_layernorm", v, fn, (4 * r * c + 2 * c) * es)
                # the fused op: its held kernel with the inputs fixed or checked,
                # at 8 and 32 values a thread, and rows a warp holds unsplit
                for v in FUSED_VARIANTS:
                    if v == "lib":
                        fn = (lambda: lib.weft_bias_gelu_residual_layernorm(
                            s(), wd, 1, P(y.data_ptr()), None, P(x.data_ptr()), P(w.data_ptr()),
                            P(z.data_ptr()), P(w.data_ptr()), P(b.data_ptr()), EPS, r, c, c))
                    else:
                        fn = (lambda v=v: lib.weft_bench_gelu_layernorm_variant(
                            s(), wd, v.encode(), P(y.data_ptr()), P(x.data_ptr()),
                            P(w.data_ptr()), P(z.data_ptr()), P(w.data_ptr()), P(b.data_ptr()),
                            r, c))
                    time_variant("gelu_layernorm", v, fn, (3 * r * c + 3 * c) * es)
                # the fused op without its GELU bias (a GEMM's epilogue added
                # it): the library's kernels fixed for the call against the
                # checked ones it took before
                for v in ("lib", "lib_checked"):
                    if v == "lib":
                        fn = (lambda: lib.weft_bias_gelu_residual_layernorm(
                            s(), wd, 1, P(y.data_ptr()), None, P(x.data_ptr()), None,
                            P(z.data_ptr()), P(w.data_ptr()), P(b.data_ptr()), EPS, r, c, c))
                    else:
                        fn = (lambda v=v: lib.weft_bench_gelu_layernorm_variant(
                            s(), wd, v.encode(), P(y.data_ptr()), P(x.data_ptr()), None,
                            P(z.data_ptr()), P(w.data_ptr()), P(b.data_ptr()), r, c))
                    time_variant("gelu_layernorm (no GELU bias)", v, fn,
                                 (3 * r * c + 2 * c) * es, "gelu_layernorm_no_gelu_bias")
                # and without the residual (BERT's prediction head: dense,
                # GELU, LayerNorm), likewise
                for v in ("lib", "lib_checked"):
                    if v == "lib":
                        fn = (lambda: lib.weft_bias_gelu_residual_layernorm(
                            s(), wd, 1, P(y.data_ptr()), None, P(x.data_ptr()), P(w.data_ptr()),
                            None, P(w.data_ptr()), P(b.data_ptr()), EPS, r, c, c))
                    else:
                        fn = (lambda v=v: lib.weft_bench_gelu_layernorm_variant(
                            s(), wd, v.encode(), P(y.data_ptr()), P(x.data_ptr()),
                            P(w.data_ptr()), None, P(w.data_ptr()), P(b.data_ptr()), r, c))
                    time_variant("gelu_layernorm (no residual)", v, fn,
                                 (2 * r * c + 3 * c) * es, "gelu_layernorm_no_residual")
                # the plain walk's forms, by name
                walks = tuple((v, lambda v=v: lib.weft_bench_gelu_walk(
                    s(), wd, v.encode(), P(y.data_ptr()), P(x.data_ptr()), P(w.data_ptr()),
                    P(z.data_ptr()), r, c))
                    for v in ("libm_erfc", "fit7", "fit5", "fit3", "select", "flat", "once",
                              "wave", "tile2", "tile4"))
                for v, fn in (("lib", lambda: lib.weft_bias_gelu_residual(
                        s(), wd, 1, P(y.data_ptr()), P(x.data_ptr()), P(w.data_ptr()),
                        P(z.data_ptr()), r, c, c)),) + walks + (
                        ("pairs", lambda: lib.weft_bench_gelu_pairs(
                            s(), wd, P(y.data_ptr()), P(x.data_ptr()), P(w.data_ptr()),
                            P(z.data_ptr()), r, c)),
                        ("grid8", lambda: lib.weft_bench_gelu_grid8(
                            s(), wd, P(y.data_ptr()), P(x.data_ptr()), P(w.data_ptr()),
                            P(z.data_ptr()), r, c)),
                        ("offsets", lambda: lib.weft_bench_gelu_offsets(
                            s(), wd, P(y.data_ptr()), P(x.data_ptr()), P(w.data_ptr()),
                            P(z.data_ptr()), r, c))):
                    time_variant("bias_gelu_residual (erf)", v, fn, (3 * r * c + c) * es,
                                 tag="gelu_erf", must_apply=v != "fit3")  # fit3: bf16 only
                # SwiGLU of x's rows (gate, then up: out rows x c/2) into y
                h = c // 2
                for v, fn in (("lib", lambda: lib.weft_glu(
                        s(), wd, 0, P(y.data_ptr()), P(x.data_ptr()), r, h, c, h)),) + tuple(
                        (v, lambda v=v: lib.weft_bench_glu_variant(
                            s(), wd, v.encode(), P(y.data_ptr()), P(x.data_ptr()), r, h, c, h))
                        for v in GLU_VARIANTS if v != "lib"):
                    time_variant("swiglu (out cols / 2)", v, fn, (r * c + r * h) * es,
                                 must_apply=True)
                # The queued kernels, round k of n starting k/n of the way down
                # the list: where a kernel is timed in a shape's run has moved
                # its figure by 3-7% (bench/history/2026-12-02.md, 15:33), so
                # over rounds each takes other places.
                turn = rnd * len(queued) // max(args.rounds, 1)
                for kern, v, fn, nbytes, tag in queued[turn:] + queued[:turn]:
                    tbps = nbytes / time_per_call(torch, fn, reps) / 1e12
                    emit("ops.variant.%s.%s.%s.%dx%d.tbps" % (tag or kern, v, dtype_name, r, c),
                         tbps, "TB/s")
                    variants_out.append((kern, v, dtype_name, (r, c), tbps, last_clock()))
                    if v == "lib":
                        lib_timed[kern] = (fn, nbytes, tag)
                # RoPE in place on copies of x and z as Q and K (heads of 128,
                # halves layout), both as drawn for each variant: the library's
                # against its variants, bit for bit. (RoPE turning z itself, over
                # and over, changed the residual that lib_last's norms then read:
                # add+LayerNorm ran 4-10% faster on it.)
                hd, rope_lib = 128, None
                pos = torch.randint(0, 32768, (r,), device="cuda", dtype=torch.int32)
                q, k = x.clone(), z.clone()
                for v in ROPE_VARIANTS:
                    if v not in chosen:
                        continue
                    if v == "lib":
                        fn = (lambda: lib.weft_rope(
                            s(), wd, 1, P(q.data_ptr()), c // hd, c, P(k.data_ptr()), c // hd,
                            c, r, hd, P(pos.data_ptr()), 10000.0))
                    else:
                        fn = (lambda v=v: lib.weft_bench_rope_variant(
                            s(), wd, v.encode(), P(q.data_ptr()), c // hd, P(k.data_ptr()),
                            c // hd, r, hd, P(pos.data_ptr()), 10000.0))
                    q.copy_(x), k.copy_(z)
                    if fn() != 0:
                        failures.append("variant rope %s: %s" %
                                        (v, lib.weft_last_error().decode()))
                        continue
                    if v == "lib":
                        rope_lib = q.clone()
                    elif v in ("touch", "walk_only"):  # no RoPE: Q and K as they were
                        if not torch.equal(q, x):
                            failures.append("variant rope %s: changed Q" % v)
                            continue
                    elif v in ("reduced", "early_reduced"):  # within an ulp or two
                        eps = torch.finfo(q.dtype).eps
                        if rope_lib is None or not torch.allclose(
                                q, rope_lib, rtol=2 * eps,
                                atol=2 * eps * rope_lib.abs().max().item()):
                            failures.append("variant rope %s %s %dx%d: not within 2 ulp of the "
                                            "library" % (v, dtype_name, r, c))
                            continue
                    elif rope_lib is None or not torch.equal(q, rope_lib):
                        failures.append("variant rope %s %s %dx%d: differs from the library"
                                        % (v, dtype_name, r, c))
                        continue
                    t = time_per_call(torch, fn, reps)
                    tbps = (4 * r * c * es + 4 * r) / t / 1e12
                    emit("ops.variant.rope.%s.%s.%dx%d.tbps" % (v, dtype_name, r, c), tbps,
                         "TB/s")
                    variants_out.append(("rope", v, dtype_name, (r, c), tbps, last_clock()))
                # the library's kernels again, after every variant of the
                # shape (lib_last): a figure below lib's says the GPU slowed
                # as the run went on, against the variants timed later
                if len(chosen) > 1:
                    for kern, (fn, nbytes, tag) in lib_timed.items():
                        tbps = nbytes / time_per_call(torch, fn, reps) / 1e12
                        emit("ops.variant.%s.lib_last.%s.%dx%d.tbps" % (tag or kern, dtype_name,
                                                                        r, c), tbps, "TB/s")
                        variants_out.append((kern, "lib_last", dtype_name, (r, c), tbps,
                                             last_clock()))
                del x, y, z, u, w, b, q, k, rope_lib
                torch.cuda.empty_cache()

    # Small inputs: one kernel per call, against an empty kernel, both
    # launched back to back from one CUDA graph.
    small_out = []  # (op, rows, us, empty_us)
    progress("small inputs")
    s = cur_stream
    t_empty = time_in_graph(torch, checked(lib, lambda: lib.weft_bench_empty(s())), reps)
    emit("ops.small.empty_kernel.us", t_empty * 1e6, "us")
    if elapsed() > args.budget:
        notes.append("small inputs skipped: past the time budget")
        ops = []
    for dtype_name in args.small_dtypes.split(","):
        for op in ops:
            name = op if dtype_name == "bf16" else "%s (%s)" % (op, dtype_name)
            for r in SMALL_ROWS:
                case = make_case(torch, lib, op, r, 4096, dtype_name)
                try:
                    t = time_in_graph(torch, checked(lib, case.weft_call), reps)
                except (WeftError, RuntimeError) as e:
                    failures.append("small %s %d rows: %s" % (name, r, e))
                    continue
                emit("ops.small.%s.%s.%dx4096.us" % (op, dtype_name, r), t * 1e6, "us")
                emit("ops.small.%s.%s.%dx4096.vs_empty" % (op, dtype_name, r), t / t_empty, "x")
                small_out.append((name, r, t * 1e6, t_empty * 1e6))
    # RMSNorm's chosen variants on the same small inputs, where a lone row's
    # latency is the whole time
    small_variants = [] if args.no_variants or "rmsnorm" not in ops else \
        [v for v in (args.variants or "").split(",") if v in RMS_VARIANTS and v != "lib"]
    for v in small_variants:
        for r in SMALL_ROWS:
            x = torch.randn(r, 4096, device="cuda", dtype=torch.bfloat16)
            w, y = torch.randn(4096, device="cuda", dtype=torch.bfloat16), torch.empty_like(x)
            P = ctypes.c_void_p
            fn = (lambda v=v, x=x, w=w, y=y, r=r: lib.weft_bench_rmsnorm_variant(
                s(), WEFT_DTYPE["bf16"], v.encode(), P(y.data_ptr()), P(x.data_ptr()),
                P(w.data_ptr()), r, 4096))
            if fn() != 0:
                continue  # the variant does not apply to these rows
            try:
                t = time_in_graph(torch, checked(lib, fn), reps)
            except (WeftError, RuntimeError) as e:
                failures.append("small rmsnorm %s %d rows: %s" % (v, r, e))
                continue
            emit("ops.small.rmsnorm.%s.bf16.%dx4096.us" % (v, r), t * 1e6, "us")
            small_out.append(("rmsnorm " + v, r, t * 1e6, t_empty * 1e6))

    section = report(torch, args, copy_tbps, rows_out, variants_out, small_out, failures,
                     sorted(set(notes)))
    print()
    print(section)
    if not args.no_rows:
        write_rows(torch, args, copy_tbps, rows_out, small_out)
        progress("rows in %s (bench/results.py record %s: into the record)" %
                 (args.rows, args.rows))
    if failures:
        for f in failures:
            print("bench_ops: FAILED: " + f, file=sys.stderr)
        sys.exit(1)


# ---- the report -------------------------------------------------------------------


# the headline's targets against torch.compile: op -> the ratio (bf16)
COMPILE_TARGETS = (("gelu_layernorm", 1.5), ("softmax", 2.0))


def write_rows(torch, args, copy_tbps, rows_out, small_out):
    """The headline and the small inputs as rows (bench/results.py): each
    large shape's bandwidth beside torch.compile's, with its targets; each
    small input's time beside the empty kernel's."""
    mach, commit = machine(torch)
    common = run_fields(
        "ops", mach, commit,
        "Release build; median of %d runs of back-to-back calls, >= 10 ms each, after "
        "%swarm-up; torch.compile default mode, static shapes; effective bandwidth = bytes the "
        "op must move / time" % (3 if args.quick else 5,
                                 "%g ms idle and " % REST_MS if REST_MS else ""), args.quick)
    rows = [dict(common, case="copy ceiling: device-to-device copy of 512 MiB",
                 metric="bandwidth", value=round(copy_tbps, 4), unit="TB/s",
                 detail="read + write")]
    want = dict(COMPILE_TARGETS)
    for op, dt, (r, c), w, e, cmp_, err in rows_out:
        w = round(w, 4)
        targets = [{"goal": "90%% of the copy ceiling measured in the same run (%.2f TB/s)" %
                    copy_tbps, "op": ">=", "needed": round(0.9 * copy_tbps, 4)}]
        row = dict(common, case="%s %s %dx%d" % (op, dt, r, c), metric="bandwidth", value=w,
                   unit="TB/s", detail="%.0f%% of copy; eager %.2f TB/s; error vs eager %.1e" %
                   (100 * w / copy_tbps, e, err))
        if cmp_:
            row.update(peer="torch.compile", peer_value=round(cmp_, 4))
            if dt == "bf16" and op in want:
                targets.append({"goal": "%.1f × torch.compile" % want[op], "op": ">=",
                                "needed": round(want[op] * cmp_, 4)})
        for t in targets:
            t["met"] = w >= t["needed"]
        row["targets"] = targets
        rows.append(row)
    for name, n, t_us, empty_us in small_out:
        words = name.split()
        if words[0] not in OPS or len(words) > 2 or (len(words) == 2 and words[1][0] != "("):
            continue  # a tuning variant's: in the report alone
        dt = words[1].strip("()") if len(words) == 2 else "bf16"
        rows.append(dict(common, case="small: %s, %d row%s of 4096 %s" % (
            words[0], n, "" if n == 1 else "s", dt), metric="time per call",
            value=round(t_us, 4), unit="µs", detail="in a CUDA graph", peer="empty kernel",
            peer_value=round(empty_us, 4)))
    os.makedirs(os.path.dirname(os.path.abspath(args.rows)), exist_ok=True)
    with open(args.rows, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def report(torch, args, copy_tbps, rows_out, variants_out, small_out, failures, notes):
    mach, commit = machine(torch)
    when = utc_now()
    out = []
    head = "## GPU operator benchmarks, %s" % when
    if args.quick:
        head += " (quick smoke run: not figures to quote)"
    out += [head, ""]
    out.append("- GPU: " + mach)
    out.append("- commit %s, Release build; weft called through ctypes on PyTorch's tensors "
               "and current stream (bench/ops/bench_ops.py)" % commit)
    out.append("- copy ceiling: device-to-device copy of 512 MiB, **%.2f TB/s** (read + write)" %
               copy_tbps)
    out.append("- effective bandwidth = bytes the op must move (inputs read once, outputs "
               "written once) / time; median of %d runs of back-to-back calls, >= 10 ms each, "
               "after %swarm-up; torch.compile default mode, static shapes" %
               (3 if args.quick else 5, "%g ms idle and " % REST_MS if REST_MS else ""))
    out.append("- ops: bias_gelu_residual (exact erf GELU), layernorm (weight, bias), "
               "add_layernorm (residual add, sum written too), rmsnorm (weight), gelu_layernorm "
               "(weft_bias_gelu_residual_layernorm: bias + erf GELU + residual + LayerNorm, "
               "one kernel), softmax (plain), rope (Q and K, heads of 128, halves layout, in "
               "place; PyTorch gets cos/sin tables), swiglu (out rows x cols from rows x 2cols)")
    for note in notes:
        out.append("- note: " + note)
    if failures:
        out.append("- **failed:** " + "; ".join(failures))
    out.append("")
    out.append("| op | dtype | rows x cols | weft TB/s | % of copy | eager TB/s | "
               "compile TB/s | weft / compile | error vs eager |")
    out.append("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for op, dt, (r, c), w, e, cmp_, err in rows_out:
        out.append("| %s | %s | %dx%d | %.2f | %.0f%% | %.2f | %s | %s | %.1e |" %
                   (op, dt, r, c, w, 100 * w / copy_tbps, e,
                    "%.2f" % cmp_ if cmp_ else "—", "%.2f×" % (w / cmp_) if cmp_ else "—", err))
    out.append("")

    # Targets.
    below = [(op, dt, s, w) for op, dt, s, w, _, _, _ in rows_out if w < 0.9 * copy_tbps]
    if rows_out:
        verdict = "met" if not below else "missed"
        line = ("- target, every op ≥ 90%% of the copy at the large shapes (≥ %.2f TB/s, "
                "against this run's copy of %.2f): **%s** (%d of %d)" % (
                    0.9 * copy_tbps, copy_tbps, verdict, len(rows_out) - len(below),
                    len(rows_out)))
        if below:
            line += "; below: " + ", ".join("%s %s %dx%d %.0f%%" % (op, dt, s[0], s[1],
                                                                  100 * w / copy_tbps)
                                            for op, dt, s, w in below[:16])
            if len(below) > 16:
                line += ", and %d more" % (len(below) - 16)
        out.append(line)
    for op, want in COMPILE_TARGETS:
        for o, dt, (r, c), w, _, cmp_, _ in rows_out:
            if o == op and dt == "bf16" and cmp_:
                need = want * cmp_
                line = ("- target, %s bf16 %dx%d ≥ %.1f× torch.compile (≥ %.2f TB/s, against "
                        "its %.2f in this run): **%s** (%.2f TB/s, %.2f×)" % (
                            op, r, c, want, need, cmp_, "met" if w >= need else "missed", w,
                            w / cmp_))
                if w < need:  # how far, against the copy
                    line += "; it needs %.2f TB/s, %.0f%% of the copy" % (
                        need, 100 * need / copy_tbps)
                out.append(line)
    out.append("")

    if variants_out:
        rounds = (", the median of %d rounds, each on fresh tensors, and their range; "
                  "each round times a shape's kernels in the order of the one before "
                  "turned by 1/%d of the list" % (args.rounds, args.rounds)
                  if args.rounds > 1 else "")
        first = "timed first in the first round" if args.rounds > 1 else "timed first"
        out.append("Tuning variants, TB/s" + rounds + ": `lib` is the library's kernel, " +
                   first + ", `lib_last` the same again after every variant of the shape (a "
                   "drop from `lib` counts against the variants timed later) (for "
                   "these aligned rows: LayerNorm `held_wide` on bf16 rows of up to 8192; "
                   "LayerNorm and RMSNorm packed on bf16 rows over 8192, add+LayerNorm over "
                   "32768, in one block of up to 512 threads (rows up to 32768), else "
                   "`held_packed_quads`; in fp16 RMSNorm so over 16384, LayerNorm never; "
                   "the norms `held_push` on other rows; the fused op packed on every "
                   "half-type shape (32 values a thread, 64 on rows over 8192); softmax "
                   "`held_online_push` on bf16 rows of 65536, `held_online` on other bf16 "
                   "rows, `held_push` on fp32 rows of 65536; `held` otherwise), "
                   "`ring2`/`ring4` rows "
                   "copied ahead into a ring of 2 or 4 slots in shared memory, then held in "
                   "registers, `ring2_wide` that at twice the values a thread, `held` rows "
                   "loaded straight into registers, `held_narrow`/`held_wide` that "
                   "under other plans, `held_spread`/`held_spread8` long rows over clusters "
                   "of up to 8 blocks at 16 or 8 values a thread, `held_push` a cluster's "
                   "blocks pushing their statistics to each other (`held` meets at cluster "
                   "barriers; `held_online_push` softmax's `held_online` so, "
                   "`held_online_push16` that at 16 values a thread), "
                   "`held_packed`/`held_packed16` bf16 rows kept packed between "
                   "passes at 32 or 16 values a thread (up to 64 on long rows), blocks of up "
                   "to 1024 threads, `held_packed64` that at 64 values, `held_packed_pairs` "
                   "that in blocks of up to 512 threads (rows of 65536 over two blocks), "
                   "`held_packed_quads`/`held_packed_eights` in blocks of up to 256 or 128 "
                   "(rows of 65536 over four or eight; softmax's packed forms push a "
                   "cluster's statistics), `held_packed32` never more than 32 values a "
                   "thread, longer rows over clusters of blocks of up to 512 (the fused op "
                   "spills at 64), `ring2_packed_quads` the norms' rows copied ahead into "
                   "a ring of 2 slots and kept packed under `held_packed_quads`' plan, "
                   "`packed_quads_b3`/`packed_quads_b2` that plan in kernels bounded to 3 "
                   "or 2 resident blocks of 256 (up to 80 or 128 registers, not 64), "
                   "`tpr_packed_pairs`/`tpr_packed_quads` the pairs' and quads' plans in "
                   "kernels whose threads a row are fixed at compile time (uniform row "
                   "pointers, immediate offsets), `*_polled` (`held_push_polled`, "
                   "`held_packed_quads_polled`, `held_online_push_polled`) those kernels with "
                   "every thread polling the mbarrier of a cluster's exchange, as the library's "
                   "did before one warp polled for its block, `*_moments` "
                   "(`held_push_moments`, `held_wide_moments`, `held_packed_pairs_moments`, "
                   "`held_packed_quads_moments`, the fused op's `lib_moments` under the "
                   "library's plans) LayerNorm's kernels merging each thread's moments and "
                   "`*_passes` (likewise) each warp's from two passes of plain sums, where "
                   "the library picks one by kernel, "
                   "RMSNorm's `ring2` (formerly the library's on long rows) and "
                   "`held`/`held_push` (a cluster's statistics met at barriers or pushed) "
                   "and `held_packed64`/`held_packed_pairs`/`held_packed_quads` (as the "
                   "other norms'), add+LayerNorm's `held_push` and packed forms likewise, "
                   "`held_warp` the fused op's rows of up to 32 values a "
                   "thread in a warp (the library spreads them over warps at 16), "
                   "`packed_b6`/`packed_b5` the fused op packed at 32 values in blocks of up "
                   "to 256 threads, 6 or 5 resident an SM (40 or 48 registers, not 64), "
                   "`half_fit` the fused op's packed kernel in bf16 with fp16's GELU fit "
                   "(degree 5, 2.7e-5, where bf16's is of degree 3 in 1/(a + k), 7.3e-4), "
                   "`lib_no_ahead` the norms', the fused op's and softmax's kernels under "
                   "the library's plans with no rows asked of L2 ahead (the library asks "
                   "for 4 MiB of them where that measured faster: norm_held.cuh's "
                   "held_ahead and short_rows_ahead, and softmax's whole rows), "
                   "`lib_ahead4`/`lib_ahead8` with each block asking L2 for its share of "
                   "the row as many rows on as fill 4 or 8 MiB of the inputs, everywhere, "
                   "`lib_short_ahead` 4 MiB on rows under 4096 too, "
                   "`lib_split16`/`lib_split8` rows a warp holds spread over as many warps "
                   "as hold them at 16 or 8 values a thread, `lib_split*_ahead` those "
                   "asking as `lib_short_ahead` does, `lib_pairs` softmax's kernel in half "
                   "types with its max and sum merged pairwise at every step of the "
                   "reduction, as the library's were before (it now takes the max, then the "
                   "sums rescaled to it), "
                   "`lib_checked` the fused op's checked kernels under the library's plans "
                   "(`gelu_layernorm (no GELU bias)`, the call without the GELU bias, times "
                   "the library's kernels for it against those, which it took before, and "
                   "`gelu_layernorm (no residual)` likewise the call without the residual), "
                   "`*_checked` kernels that test at run time for "
                   "what the library fixes at compile time on these rows (as rows of any "
                   "length take them; `layernorm (bare)`/`rmsnorm (bare)`, the norms "
                   "without weight or bias, `layernorm (weight)`, LayerNorm with the "
                   "weight alone, and `add_layernorm (no sum)`, add+LayerNorm without "
                   "the sum written, time the library's kernels for those calls "
                   "against the checked ones it took before, `held_push_checked` and "
                   "`held_packed_pairs_checked`/`held_packed_quads_checked`), "
                   "`*_online` softmax taking its max and sum in one "
                   "reduction, "
                   "`staged` rows in shared memory, `regs*` the register-tile row "
                   "kernels under other plans, `libm_erfc` GELU with libm's erfcf, "
                   "`fit7`/`fit5`/`fit3` the erf form's fits of degree 7, 5 and 3 (the "
                   "library's for fp32, fp16 and bf16) in the same plain walk, `select` "
                   "that walk with the library's fit ending as it did before (Phi(x) by the sign, times x), `pairs` "
                   "GELU two chunks a step, `grid8` the library's GELU on its former grid of "
                   "8 blocks an SM, `offsets` the library's GELU kernel on its former walk "
                   "(tensor_walk: adds only, 32-bit offsets), SwiGLU's `rows` its kernel on "
                   "GELU's row_walk (the library's walks by adds alone; these rows of SwiGLU "
                   "have half the columns of the headline's), `flat` GELU's and SwiGLU's "
                   "kernels on a grid of a thread a chunk with their grid-stride walks run "
                   "once (the library's GELU in fp32 and SwiGLU take a thread a chunk "
                   "through chunk_once), `once` that walk everywhere, `wave` the library's "
                   "former grid of one wave of blocks walking the tensor, `tile2`/`tile4` "
                   "both on torch.compile's grid, a block a tile of 2 or 4 chunks a thread, "
                   "their loads issued first, `angles_each` RoPE with each "
                   "work item computing its pairs' inverse frequencies (the library keeps "
                   "them in a table a block), "
                   "`bounds4` that at 4 blocks an SM, `fewest` the fewest slices of heads that "
                   "fill the GPU (the library takes as many as leave an angle turning 24 "
                   "bytes, if more), `fill4` four times the fewest, `angle16`/`angle32` the "
                   "library's slicing with an angle turning 16 or 32 bytes, "
                   "`floats` RoPE's chunks held as fp32 from the load (the library holds them "
                   "as loaded), `heads4`/`heads4_b2` four heads a step (the library two), at 3 "
                   "or 2 blocks an SM, `runs` RoPE giving each slice a run of heads (the library "
                   "deals them to the slices in turn, so that a warp steps through "
                   "neighbouring heads of a token), `early` the first heads' loads in flight "
                   "while the angles are computed, `streamed` RoPE's loads and stores "
                   "evict-first, `reduced` the angles reduced by pi/2 in double and taken by "
                   "Taylor series (the library calls sincos), `early_reduced` both, `touch` "
                   "no RoPE but its bytes: Q and K read and written back in place, the "
                   "ceiling of an in-place op, `walk_only` that in RoPE's walk (its loads and "
                   "stores, no angles) "
                   "(bench/ops/variants_*.cu say more):")
        out.append("")
        shapes = sorted({(dt, s) for _, _, dt, s, _, _ in variants_out},
                        key=lambda k: (k[0], -k[1][1]))
        cols = ["%s %dx%d" % (dt, s[0], s[1]) for dt, s in shapes]
        out.append("| kernel | variant | " + " | ".join(cols) + " |")
        out.append("| --- | --- |" + " ---: |" * len(cols))
        keys = []
        for k, v, _, _, _, _ in variants_out:
            if (k, v) not in keys:
                keys.append((k, v))
        for k, v in keys:
            cells = []
            for dt, s in shapes:
                got = [(t, mhz) for kk, vv, d, ss, t, mhz in variants_out
                       if kk == k and vv == v and d == dt and ss == s]
                vals = [t for t, _ in got]
                mhz = [m for _, m in got if m is not None]
                cell = ("—" if not vals else "%.2f" % vals[0] if len(vals) == 1 else
                        "%.2f (%.2f-%.2f)" % (statistics.median(vals), min(vals), max(vals)))
                if mhz:
                    cell += " @ %d-%d MHz" % (min(mhz), max(mhz))
                cells.append(cell)
            out.append("| %s | %s | %s |" % (k, v, " | ".join(cells)))
        out.append("")

    if small_out:
        empty = small_out[0][3]
        out.append("Small inputs, rows of 4096 (bf16 unless named), one kernel per call, "
                   "launched back to back from a CUDA graph; an empty kernel takes %.2f µs the "
                   "same way. µs per call (× empty kernel):" % empty)
        out.append("")
        out.append("| op | " + " | ".join("%d rows" % r for r in SMALL_ROWS) + " |")
        out.append("| --- |" + " ---: |" * len(SMALL_ROWS))
        for op in dict.fromkeys(o for o, _, _, _ in small_out):
            cells = []
            for r in SMALL_ROWS:
                v = [us for o, rr, us, _ in small_out if o == op and rr == r]
                cells.append("%.2f (%.1f×)" % (v[0], v[0] / empty) if v else "—")
            if any(c != "—" for c in cells):
                out.append("| %s | %s |" % (op, " | ".join(cells)))
        out.append("")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
