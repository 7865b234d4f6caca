#!/usr/bin/env python3
"""bench_attention.py - weft_attention against PyTorch's fused attention, in one process.

Cases (bf16, dense [batch, seq, heads, dim] tensors, on PyTorch's current
stream, the same tensors for every side):
  B4 H32 S4096 D128             not causal, and causal
  B2 H32 Hkv8 S8192 D128        causal, grouped-query (4 query heads a kv head)
  B8 H16 S2048 D64              causal
  B1 H32 Hkv8 S16384 D128       causal, grouped-query
  B4 H32 S4096 D128 RoPE        causal, RoPE on Q and K as they are loaded,
                                against the same call without it
  B4 H32 Hkv8 D128 paged        a chunk of 512 after 3584 keys in pages of 16:
                                weft_attention_paged against weft_attention on
                                the same keys dense (the same bits)
Peers: torch.nn.functional.scaled_dot_product_attention with each of its
fused backends forced through torch.nn.attention.sdpa_kernel: flash
(FlashAttention-2), cuDNN and memory-efficient, on views of the same
tensors ([batch, heads, seq, dim] by transpose; GQA through enable_gqa).
A backend that refuses a case is listed as such. Every output (weft's and
each peer's) is checked against the math backend's in fp32 before
anything is timed. The target is the fastest peer of the same run.
On Hopper the script runs again in a process of its own with
WEFT_ATTENTION_WGMMA=1, weft's opt-in wgmma kernel (src/ops/
attention_wgmma.cu), on the same shapes (checked against torch's SDPA),
and shows its rate beside the default kernel's.
TFLOP/s counts 4 B H Sq Sk D (the two products), halved for causal.
weft is loaded through ctypes from libweft.so and called on the tensors'
data_ptr() and torch's current stream. Rows (bench/results.py) go to
--rows; `make gpu-bench-attention RECORD=1` records them.
"""
import argparse
import ctypes
import functools
import json
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common  # noqa: E402
from bench_common import machine, own_stream, run_fields  # noqa: E402
from bench_decode import KvCache  # noqa: E402  (weft_kv_cache, shared with the decode bench)

# median of 5 runs of back-to-back calls, each >= 50 ms
time_per_call = functools.partial(bench_common.time_per_call, reps=5, min_ms=50.0)

F32, BF16, F16 = 0, 1, 2
ROPE_INTERLEAVED, ROPE_HALVES = 0, 1

# (batch, heads, kv heads, seq, dim, causal)
SHAPES = [(4, 32, 32, 4096, 128, False), (4, 32, 32, 4096, 128, True),
          (2, 32, 8, 8192, 128, True), (8, 16, 16, 2048, 64, True),
          (1, 32, 8, 16384, 128, True)]


class AttentionDesc(ctypes.Structure):
    """weft_attention_desc (include/weft/ops.h), field for field."""
    Z, I, P = ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p
    _fields_ = [("dtype", I), ("batch", Z), ("heads", Z), ("kv_heads", Z), ("head_dim", Z),
                ("seq_q", Z), ("seq_k", Z), ("cu_seqlens_q", P), ("cu_seqlens_k", P),
                ("q_stride", Z), ("k_stride", Z), ("v_stride", Z), ("o_stride", Z),
                ("scale", ctypes.c_float), ("causal", I), ("window", Z),
                ("lse", P), ("lse_stride", Z), ("q_positions", P), ("k_positions", P),
                ("rope_layout", I), ("rope_base", ctypes.c_float),
                ("reserved", ctypes.c_uint64 * 8)]


def load_weft(path):
    lib = ctypes.CDLL(path)
    P = ctypes.c_void_p
    lib.weft_attention.argtypes = [P, ctypes.POINTER(AttentionDesc), P, P, P, P]
    lib.weft_attention.restype = ctypes.c_int
    lib.weft_attention_paged.argtypes = [P, ctypes.POINTER(KvCache), ctypes.POINTER(AttentionDesc),
                                         P, P, P]
    lib.weft_attention_paged.restype = ctypes.c_int
    lib.weft_last_error.argtypes = []
    lib.weft_last_error.restype = ctypes.c_char_p
    return lib


def die(msg):
    print("bench_attention: " + msg, file=sys.stderr)
    sys.exit(1)


def check(lib, rc, what):
    if rc != 0:
        die("%s returned %d: %s" % (what, rc, lib.weft_last_error().decode()))


# ---- the layout check (host calls, no GPU) -------------------------------

def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def f16(x):
    return struct.unpack("e", struct.pack("e", x))[0]


class Aligned:
    """n elements of a ctypes type at a 64-byte aligned address."""

    def __init__(self, ctype, n):
        self.buf = ctypes.create_string_buffer(n * ctypes.sizeof(ctype) + 64)
        self.addr = (ctypes.addressof(self.buf) + 63) // 64 * 64
        self.view = (ctype * n).from_address(self.addr)


def check_layout(lib):
    """One host call (NULL stream) through AttentionDesc with every field
    set - GQA, strides, scale, causal with a window, the LSE with its
    stride, RoPE - against the definition computed here, so that a struct
    that drifted from the C one is caught without a GPU."""
    heads, kvh, dim, sq, sk = 2, 1, 64, 2, 4
    qs, ks, vs, os_ = heads * dim + 8, kvh * dim + 16, kvh * dim + 8, heads * dim + 24
    window, scale, base = 2, 0.3, 1000.0
    u16 = ctypes.c_uint16

    def fill(rows, stride, width, seed):
        vals = [[f16(math.sin(seed + 0.37 * r + 0.11 * e)) for e in range(width)]
                for r in range(rows)]
        buf = Aligned(u16, rows * stride)
        for r in range(rows):
            for e in range(width):
                buf.view[r * stride + e] = struct.unpack("H", struct.pack("e", vals[r][e]))[0]
        return vals, buf

    q, Q = fill(sq, qs, heads * dim, 1.0)
    k, K = fill(sk, ks, kvh * dim, 2.0)
    v, V = fill(sk, vs, kvh * dim, 3.0)
    O = Aligned(u16, sq * os_)
    lse_stride = sq + 3
    L = Aligned(ctypes.c_float, heads * lse_stride)
    pos_q, pos_k = Aligned(ctypes.c_int32, sq), Aligned(ctypes.c_int32, sk)
    for i in range(sk):
        pos_k.view[i] = 500 + i
    for i in range(sq):
        pos_q.view[i] = 500 + sk - sq + i

    def rotate(x, pos):  # weft_rope's halves layout, fp32 arithmetic, rounded to fp16
        out = list(x)
        for i in range(dim // 2):
            a = pos * base ** (-2.0 * i / dim)
            sn, cs = f32(math.sin(a)), f32(math.cos(a))
            uu, vv = x[i], x[i + dim // 2]
            out[i] = f16(f32(f32(uu * cs) - f32(vv * sn)))
            out[i + dim // 2] = f16(f32(f32(uu * sn) + f32(vv * cs)))
        return out

    desc = AttentionDesc(dtype=F16, batch=1, heads=heads, kv_heads=kvh, head_dim=dim, seq_q=sq,
                         seq_k=sk, q_stride=qs, k_stride=ks, v_stride=vs, o_stride=os_,
                         scale=scale, causal=1, window=window, lse=L.addr,
                         lse_stride=lse_stride, q_positions=pos_q.addr, k_positions=pos_k.addr,
                         rope_layout=ROPE_HALVES, rope_base=base)
    check(lib, lib.weft_attention(None, ctypes.byref(desc), O.addr, Q.addr, K.addr, V.addr),
          "weft_attention")
    worst = 0.0
    for h in range(heads):
        for i in range(sq):
            qi = rotate(q[i][h * dim:(h + 1) * dim], pos_q.view[i])
            p = i + sk - sq
            keys = [j for j in range(sk) if p - window < j <= p]
            s = {j: f32(scale) * sum(a * b for a, b in zip(qi, rotate(k[j][:dim], pos_k.view[j])))
                 for j in keys}
            m = max(s.values())
            w = {j: math.exp(s[j] - m) for j in keys}
            tot = sum(w.values())
            for e in range(dim):
                want = sum(w[j] * v[j][e] for j in keys) / tot
                got = struct.unpack("e", struct.pack("H", O.view[i * os_ + h * dim + e]))[0]
                worst = max(worst, abs(got - want) / (abs(want) + 1e-2))
            lse = L.view[h * lse_stride + i]
            if abs(lse - (m + math.log(tot))) > 1e-4 * (1 + abs(lse)):
                die("AttentionDesc does not match weft_attention_desc: LSE %g, want %g" %
                    (lse, m + math.log(tot)))
    if worst > 2e-3:
        die("AttentionDesc does not match weft_attention_desc: output off by %.2e" % worst)
    print("bench_attention: AttentionDesc matches weft_attention_desc (%d bytes)" %
          ctypes.sizeof(AttentionDesc))
    check_paged_layout(lib)


def check_paged_layout(lib):
    """A host call of weft_attention_paged through KvCache, its keys in
    pages of 16 in reverse order, against weft_attention over the same keys
    dense: the same bits, or the struct drifted from weft_kv_cache."""
    heads, kvh, dim, sq, sk, page = 2, 1, 64, 3, 40, 16
    pages = (sk + page - 1) // page
    u16 = ctypes.c_uint16
    Q, O, O2 = Aligned(u16, sq * heads * dim), Aligned(u16, sq * heads * dim), \
        Aligned(u16, sq * heads * dim)
    K, V = Aligned(u16, sk * kvh * dim), Aligned(u16, sk * kvh * dim)
    KP, VP = Aligned(u16, pages * page * kvh * dim), Aligned(u16, pages * page * kvh * dim)
    for i in range(sq * heads * dim):
        Q.view[i] = struct.unpack("H", struct.pack("e", math.sin(0.3 * i)))[0]
    table, lens = Aligned(ctypes.c_int32, pages), Aligned(ctypes.c_int32, 1)
    for p in range(pages):
        table.view[p] = pages - 1 - p
    lens.view[0] = sk
    for j in range(sk):
        row = table.view[j // page] * page + j % page
        for e in range(kvh * dim):
            kb = struct.unpack("H", struct.pack("e", math.cos(0.7 * j + 0.05 * e)))[0]
            vb = struct.unpack("H", struct.pack("e", math.sin(0.2 * j - 0.03 * e)))[0]
            K.view[j * kvh * dim + e], V.view[j * kvh * dim + e] = kb, vb
            KP.view[row * kvh * dim + e], VP.view[row * kvh * dim + e] = kb, vb
    desc = AttentionDesc(dtype=F16, batch=1, heads=heads, kv_heads=kvh, head_dim=dim, seq_q=sq,
                         seq_k=sk, causal=1)
    check(lib, lib.weft_attention(None, ctypes.byref(desc), O.addr, Q.addr, K.addr, V.addr),
          "weft_attention")
    cache = KvCache(dtype=F16, k=KP.addr, v=VP.addr, pages=pages, page_size=page, kv_heads=kvh,
                    head_dim=dim, block_table=table.addr, seqs=1, max_pages=pages)
    check(lib, lib.weft_attention_paged(None, ctypes.byref(cache), ctypes.byref(desc), lens.addr,
                                        O2.addr, Q.addr), "weft_attention_paged")
    if any(O.view[i] != O2.view[i] for i in range(sq * heads * dim)):
        die("KvCache does not match weft_kv_cache: paged keys give other bits than dense ones")
    print("bench_attention: KvCache matches weft_kv_cache (%d bytes)" % ctypes.sizeof(KvCache))


# ---- the benchmark --------------------------------------------------------

def rel_err(torch, got, want):
    got, want = got.double(), want.double()
    return (torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want)).item()


def weft_call(torch, lib, out, q, k, v, causal, positions=None):
    """weft_attention on the tensors; positions (int32 on the GPU, one a
    row of a sequence's Q and K alike) turn RoPE on, in the halves
    layout."""
    b, s, h, d = q.shape
    desc = AttentionDesc(dtype=BF16, batch=b, heads=h, kv_heads=k.shape[2], head_dim=d,
                         seq_q=s, seq_k=k.shape[1], causal=1 if causal else 0)
    if positions is not None:
        desc.q_positions = desc.k_positions = positions.data_ptr()
        desc.rope_layout = ROPE_HALVES
    args = (ctypes.byref(desc), out.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr())

    def call():
        st = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        rc = lib.weft_attention(st, *args)
        if rc != 0:
            die("weft_attention returned %d: %s" % (rc, lib.weft_last_error().decode()))
    call.desc, call.positions = desc, positions  # kept alive with the closure
    return call


def shape_tensors(torch, b, h, hkv, s, d):
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16)
    return q, k, v


def shape_flop(b, h, s, d, causal):
    return 4.0 * b * h * s * s * d / (2 if causal else 1)


def weft_rates(torch, lib, quick):
    """weft's TFLOP/s on every shape, each output first checked against
    torch's SDPA on the same tensors: what the run with
    WEFT_ATTENTION_WGMMA=1 reports back."""
    import torch.nn.functional as F
    torch.manual_seed(0)
    rates = []
    for b, h, hkv, s, d, causal in SHAPES:
        s = 1024 if quick else s
        q, k, v = shape_tensors(torch, b, h, hkv, s, d)
        out = torch.empty_like(q)
        call = weft_call(torch, lib, out, q, k, v, causal)
        call()
        want = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2), is_causal=causal,
                                              enable_gqa=hkv != h)
        err = rel_err(torch, out.transpose(1, 2), want)
        if not err <= 1e-2:
            die("B%d H%d S%d D%d causal %s: weft differs from torch's SDPA by %.2e" %
                (b, h, s, d, causal, err))
        rates.append(shape_flop(b, h, s, d, causal) / time_per_call(torch, call) / 1e12)
        del q, k, v, out, want
        torch.cuda.empty_cache()
    return rates


def wgmma_rates(args):
    """weft_rates in a process of its own with WEFT_ATTENTION_WGMMA=1, which
    the library reads once: the opt-in wgmma kernel on every shape."""
    try:
        return bench_common.rerun_with_switch(
            __file__, "WEFT_ATTENTION_WGMMA", "1",
            ["--lib", args.lib] + (["--quick"] if args.quick else []) + ["--weft-rates"])
    except RuntimeError as e:
        die(str(e))


def rope_case(torch, lib, quick):
    """B4 H32 S4096 D128 causal with RoPE on Q and K as they are loaded,
    against the same call without it; checked against weft_attention on
    Q and K turned beforehand by torch in fp32 (weft_rope's halves layout,
    base 10000), to bf16's rounding."""
    b, h, s, d = 4, 32, 1024 if quick else 4096, 128
    q, k, v = shape_tensors(torch, b, h, h, s, d)
    pos = torch.arange(s, device="cuda", dtype=torch.int32).repeat(b)
    out, out_plain = torch.empty_like(q), torch.empty_like(q)
    roped = weft_call(torch, lib, out, q, k, v, True, pos)
    plain = weft_call(torch, lib, out_plain, q, k, v, True)
    inv = 10000.0 ** (-torch.arange(0, d, 2, device="cuda", dtype=torch.float64) / d)
    ang = torch.arange(s, device="cuda", dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos().float()[None, :, None, :], ang.sin().float()[None, :, None, :]

    def turn(x):
        lo, hi = x[..., :d // 2].float(), x[..., d // 2:].float()
        return torch.cat([lo * cos - hi * sin, lo * sin + hi * cos], -1).to(torch.bfloat16)
    check_out = torch.empty_like(q)
    weft_call(torch, lib, check_out, turn(q), turn(k), v, True)()
    roped()
    torch.cuda.synchronize()
    err = rel_err(torch, out, check_out)
    if not err <= 1e-2:
        die("RoPE in the load differs from RoPE beforehand by %.2e" % err)
    flop = shape_flop(b, h, s, d, True)
    tr, tp = time_per_call(torch, roped), time_per_call(torch, plain)
    case = "attention bf16 B%d H%d S%d D%d causal, RoPE fused" % (b, h, s, d)
    detail = "%.1f us; without RoPE %.1f us (%.1f%% more); error vs RoPE beforehand %.1e" % (
        tr * 1e6, tp * 1e6, 100.0 * (tr / tp - 1.0), err)
    print("%-44s weft %6.1f TFLOP/s  %s" % (case, flop / tr / 1e12, detail))
    return case, flop / tr / 1e12, {"plain": flop / tp / 1e12}, detail


def paged_case(torch, lib, quick):
    """Chunked prefill: B4 H32 Hkv8 D128, a chunk of 512 queries continuing
    a prefix (keys 4096 in all, 1024 quick) in shuffled pages of 16:
    weft_attention_paged against weft_attention over the same keys laid out
    densely, whose bits it must equal."""
    b, h, hkv, d, lq, lk, page = 4, 32, 8, 128, 512, 1024 if quick else 4096, 16
    per = lk // page
    q = torch.randn(b, lq, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, lk, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, lk, hkv, d, device="cuda", dtype=torch.bfloat16)
    table = torch.randperm(b * per, device="cuda", dtype=torch.int32).view(b, per)
    kp = torch.empty(b * per, page, hkv, d, device="cuda", dtype=torch.bfloat16)
    vp = torch.empty_like(kp)
    kp[table.flatten().long()] = k.reshape(b * per, page, hkv, d)
    vp[table.flatten().long()] = v.reshape(b * per, page, hkv, d)
    lens = torch.full((b,), lk, device="cuda", dtype=torch.int32)
    out, out_dense = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    desc = AttentionDesc(dtype=BF16, batch=b, heads=h, kv_heads=hkv, head_dim=d, seq_q=lq,
                         seq_k=lk, causal=1)
    cache = KvCache(dtype=BF16, k=kp.data_ptr(), v=vp.data_ptr(), pages=b * per, page_size=page,
                    kv_heads=hkv, head_dim=d, block_table=table.data_ptr(), seqs=b,
                    max_pages=per)

    def paged():
        st = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        check(lib, lib.weft_attention_paged(st, ctypes.byref(cache), ctypes.byref(desc),
                                            lens.data_ptr(), out.data_ptr(), q.data_ptr()),
              "weft_attention_paged")
    dense = weft_call(torch, lib, out_dense, q, k, v, True)
    paged()
    dense()
    torch.cuda.synchronize()
    if not torch.equal(out, out_dense):
        die("paged keys give other bits than the same keys dense")
    pairs = lq * (lk - lq) + lq * (lq + 1) // 2  # what the causal chunk sees
    flop = 4.0 * b * h * d * pairs
    tp, td = time_per_call(torch, paged), time_per_call(torch, dense)
    case = "paged prefill bf16 B%d H%d Hkv%d D%d, chunk %d after %d keys, pages of %d" % (
        b, h, hkv, d, lq, lk - lq, page)
    detail = "%.1f us; dense keys %.1f us; the same bits" % (tp * 1e6, td * 1e6)
    print("%-44s weft %6.1f TFLOP/s  %s" % (case, flop / tp / 1e12, detail))
    return case, flop / tp / 1e12, {"dense": flop / td / 1e12}, detail


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench_common.add_run_options(
        ap, "attention.rows.jsonl", "sequences of 1024; rows marked quick",
        "without a GPU or PyTorch: AttentionDesc is the C struct (a host call)")
    ap.add_argument("--weft-rates", metavar="FILE",
                    help="time weft alone on every shape, TFLOP/s as JSON to FILE (the run "
                    "with WEFT_ATTENTION_WGMMA=1 is one of these)")
    args = ap.parse_args()
    if args.check_layout:
        check_layout(load_weft(args.lib))
        return

    import torch
    if not torch.cuda.is_available():
        die("no GPU")
    lib = load_weft(args.lib)
    with own_stream(torch):
        if args.weft_rates:
            with open(args.weft_rates, "w") as f:
                json.dump(weft_rates(torch, lib, args.quick), f)
            return
        run(torch, lib, args, wgmma_rates(args) if gpu_arch(torch) == "sm_90" else None)


def gpu_arch(torch):
    major, minor = torch.cuda.get_device_capability()
    return "sm_%d%d" % (major, minor)


def run(torch, lib, args, wgmma):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    peers = [("flash", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION),
             ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    torch.manual_seed(0)
    results = []  # (case, weft TFLOP/s, {peer: TFLOP/s or None}, detail)
    for shape, (b, h, hkv, s, d, causal) in enumerate(SHAPES):
        if args.quick:
            s = 1024
        q, k, v = shape_tensors(torch, b, h, hkv, s, d)
        out = torch.full_like(q, float("nan"))
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        gqa = hkv != h

        extra = {"enable_gqa": True} if gqa else {}

        def sdpa(backend):
            def f():
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, **extra)
            return f
        # the math backend in fp32 on a slice of the batch and of the heads
        # (its scores fill memory: about 4 GB of them, whole kv groups), the
        # kv heads repeated for their query heads
        group = h // hkv
        hc = max(group, min(h, int(4e9 // (4 * s * s)) // group * group))
        rk = kt[:1, :hc // group].float().repeat_interleave(group, dim=1)
        rv = vt[:1, :hc // group].float().repeat_interleave(group, dim=1)
        with sdpa_kernel([SDPBackend.MATH]):
            ref = F.scaled_dot_product_attention(qt[:1, :hc].float(), rk, rv, is_causal=causal)
        del rk, rv
        call = weft_call(torch, lib, out, q, k, v, causal)
        call()
        torch.cuda.synchronize()
        err = rel_err(torch, out[:1, :, :hc].transpose(1, 2), ref)
        if not err <= 1e-2:
            die("B%d H%d S%d causal %s: weft differs from the math backend by %.2e" %
                (b, h, s, causal, err))
        flop = shape_flop(b, h, s, d, causal)
        tw = time_per_call(torch, call)
        rates, notes = {}, []
        for name, backend in peers:
            f = sdpa(backend)
            try:
                y = f()
                torch.cuda.synchronize()
            except (RuntimeError, TypeError) as e:
                rates[name] = None
                notes.append("%s refused (%s)" % (name, str(e).splitlines()[0][:80]))
                continue
            pe = rel_err(torch, y[:1, :hc], ref)
            if not pe <= 1e-2:
                die("%s differs from the math backend by %.2e" % (name, pe))
            rates[name] = flop / time_per_call(torch, f) / 1e12
            del y
        case = "attention bf16 B%d H%d%s S%d D%d%s" % (
            b, h, " Hkv%d" % hkv if gqa else "", s, d, " causal" if causal else "")
        detail = "; ".join(["%s %.0f" % (n, r) for n, r in rates.items() if r is not None] +
                           notes + ["error vs math (fp32) %.1e" % err] +
                           (["weft's wgmma kernel (opt-in) %.0f" % wgmma[shape]] if wgmma else []))
        results.append((case, flop / tw / 1e12, rates, detail))
        print("%-44s weft %6.1f TFLOP/s  %s" % (case, flop / tw / 1e12, detail))
        del q, k, v, out, qt, kt, vt, ref
        torch.cuda.empty_cache()

    results.append(rope_case(torch, lib, args.quick))
    results.append(paged_case(torch, lib, args.quick))

    if args.no_rows:
        return
    mach, commit = machine(torch)
    common = run_fields("attention", mach, commit,
                        "Release build; median of 5 runs of back-to-back calls, >= 50 ms "
                        "each, after warm-up, on PyTorch's current stream; bf16, dense "
                        "[B, S, H, D] tensors (torch reads them transposed)", args.quick)
    os.makedirs(os.path.dirname(os.path.abspath(args.rows)), exist_ok=True)
    with open(args.rows, "w") as f:
        for case, tflops, rates, detail in results:
            row = dict(common, case=case, metric="TFLOP/s", value=round(tflops, 2),
                       unit="TFLOP/s", detail=detail)
            if rates.get("dense") is not None:
                row.update(peer="weft_attention, the same keys dense",
                           peer_value=round(rates["dense"], 2))
                row["targets"] = [{"goal": "within 5% of the same call on dense keys",
                                   "op": ">=", "needed": round(0.95 * rates["dense"], 2),
                                   "met": tflops >= 0.95 * rates["dense"]}]
            elif rates.get("plain") is not None:
                row.update(peer="weft_attention, the same call without RoPE",
                           peer_value=round(rates["plain"], 2))
                row["targets"] = [{"goal": "RoPE fused costs at most 3%", "op": ">=",
                                   "needed": round(0.97 * rates["plain"], 2),
                                   "met": tflops >= 0.97 * rates["plain"]}]
            elif any(r is not None for r in rates.values()):
                name, best = max(((n, r) for n, r in rates.items() if r is not None),
                                 key=lambda nr: nr[1])
                row.update(peer="torch SDPA %s (the fastest backend)" % name,
                           peer_value=round(best, 2))
                row["targets"] = [{"goal": "at or above the fastest peer in the same run",
                                   "op": ">=", "needed": round(best, 2),
                                   "met": round(tflops, 2) >= round(best, 2)}]
            f.write(json.dumps(row) + "\n")
    print("bench_attention: rows in %s" % args.rows)


if __name__ == "__main__":
    main()
