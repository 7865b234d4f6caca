#!/usr/bin/env python3
"""bench_decode.py - weft_attention_decode over a paged KV cache against PyTorch's SDPA.

Cases (32 query heads on 8 kv heads, head dim 128, bf16, pages of 16 tokens
assigned in a shuffled order, one query per sequence, every sequence at the
full length):
  decode B16 L4096, B64 L2048, B1 L32768, B256 L512
      the KV cache's bytes read per second (2 x B x L x kv_heads x dim x 2
      bytes over the call's time) of weft_attention_decode with its own
      split choice, beside: the same with the split off (splits = 1), torch's
      F.scaled_dot_product_attention (enable_gqa=True) on the same K/V
      gathered into contiguous [B][kv_heads][L][dim] tensors (its time
      excludes the gather), and a device-to-device copy's rate (read + write
      of 256 MiB) measured in the same run: the ceiling.
  decode pages shuffled against in order, the same shapes
      the call's time on the shuffled pages against the same call with
      each sequence's pages in order (its K/V laid out densely, read
      through the same table): what the paging costs.
  decode FP8 E4M3 pages, the same shapes
      the call's time with the pools in FP8 (scale 1/64 a head), against
      SDPA on the bf16 values the FP8 bytes mean, and against the bf16
      pages' time.
Each case's output is checked against SDPA's before it is timed. weft is
loaded through ctypes from libweft.so and called on the tensors' data_ptr()
and torch's current stream. Rows (bench/results.py) go to --rows;
`make gpu-bench-decode RECORD=1` records them. --check-layout needs neither
a GPU nor PyTorch: it checks the ctypes structs against the C ones through
host calls (a ctest).
"""
import argparse
import ctypes
import functools
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common  # noqa: E402
from bench_common import (machine, own_stream, print_results, run_fields,  # noqa: E402
                          write_results)

# median of 5 runs of back-to-back calls, each >= 20 ms
time_per_call = functools.partial(bench_common.time_per_call, reps=5, min_ms=20.0)

BF16, F16 = 1, 2
ROPE_INTERLEAVED, ROPE_HALVES = 0, 1
KV_DTYPE, KV_FP8_E4M3 = 0, 1
HEADS, KV_HEADS, DIM, PAGE = 32, 8, 128, 16
CASES = ((16, 4096), (64, 2048), (1, 32768), (256, 512))


class KvCache(ctypes.Structure):
    """weft_kv_cache (include/weft/ops.h), field for field."""
    Z, P = ctypes.c_size_t, ctypes.c_void_p
    _fields_ = [("dtype", ctypes.c_int), ("k", P), ("v", P), ("pages", Z), ("page_size", Z),
                ("kv_heads", Z), ("head_dim", Z), ("block_table", P), ("seqs", Z),
                ("max_pages", Z), ("format", ctypes.c_int), ("k_scale", P), ("v_scale", P),
                ("reserved", ctypes.c_uint64 * 4)]


class KvRope(ctypes.Structure):
    """weft_kv_rope."""
    _fields_ = [("layout", ctypes.c_int), ("base", ctypes.c_float), ("scaling", ctypes.c_void_p)]


class DecodeDesc(ctypes.Structure):
    """weft_attention_decode_desc."""
    Z = ctypes.c_size_t
    _fields_ = [("q_len", Z), ("heads", Z), ("scale", ctypes.c_float), ("window", Z),
                ("max_seq_len", Z), ("splits", Z), ("q_stride", Z),
                ("q_rope", ctypes.POINTER(KvRope)),
                ("reserved", ctypes.c_uint64 * 2)]


def load_weft(path):
    lib = ctypes.CDLL(path)
    P, Z = ctypes.c_void_p, ctypes.c_size_t
    lib.weft_kv_append.argtypes = [P, ctypes.POINTER(KvCache), P, Z, P, Z, Z, P, P,
                                   ctypes.POINTER(KvRope)]
    lib.weft_kv_append.restype = ctypes.c_int
    lib.weft_attention_decode_workspace.argtypes = [ctypes.POINTER(KvCache),
                                                    ctypes.POINTER(DecodeDesc),
                                                    ctypes.POINTER(Z)]
    lib.weft_attention_decode_workspace.restype = ctypes.c_int
    lib.weft_attention_decode.argtypes = [P, ctypes.POINTER(KvCache), ctypes.POINTER(DecodeDesc),
                                          P, P, P, P, P, Z]
    lib.weft_attention_decode.restype = ctypes.c_int
    lib.weft_last_error.argtypes = []
    lib.weft_last_error.restype = ctypes.c_char_p
    return lib


def die(msg):
    print("bench_decode: " + msg, file=sys.stderr)
    sys.exit(1)


def check(lib, rc, what):
    if rc != 0:
        die("%s: %d: %s" % (what, rc, lib.weft_last_error().decode()))


# ---- the layout check (host calls, no GPU) ---------------------------------

def halves(values):
    """fp16 array (ctypes, 16-byte aligned in a larger buffer) of values."""
    raw = struct.pack("<%de" % len(values), *values)
    buf = ctypes.create_string_buffer(len(raw) + 16)
    off = (-ctypes.addressof(buf)) % 16
    ctypes.memmove(ctypes.addressof(buf) + off, raw, len(raw))
    return buf, ctypes.addressof(buf) + off


def read_halves(addr, n):
    return list(struct.unpack("<%de" % n, ctypes.string_at(addr, 2 * n)))


def check_layout(lib):
    """Appends 5 tokens (with RoPE of the split-halves layout) to a cache of
    fp16 pages of 16 (dim 64, one kv head, pages given in reverse), decodes
    q_len 2 over 2 heads with a window of 3 and a scale of 0.5, and checks
    the output and LSE against a float64 computation here: a struct that
    drifted from the C one moves a field and fails."""
    dim, tokens, pages = 64, 5, 3
    k = [math.sin(0.37 * i) for i in range(tokens * dim)]
    v = [math.cos(0.11 * i) for i in range(tokens * dim)]
    q = [math.sin(0.05 * i + 1) for i in range(2 * 2 * dim)]
    k16 = list(struct.unpack("<%de" % len(k), struct.pack("<%de" % len(k), *k)))
    v16 = list(struct.unpack("<%de" % len(v), struct.pack("<%de" % len(v), *v)))
    q16 = list(struct.unpack("<%de" % len(q), struct.pack("<%de" % len(q), *q)))
    kb, ka = halves(k16)
    vb, va = halves(v16)
    qb, qa = halves(q16)
    kp, kpa = halves([0.0] * (pages * 16 * dim))
    vp, vpa = halves([0.0] * (pages * 16 * dim))
    ob, oa = halves([0.0] * (2 * 2 * dim))
    table = (ctypes.c_int32 * 2)(2, 1)
    seq_ids = (ctypes.c_int32 * tokens)(*([0] * tokens))
    positions = (ctypes.c_int32 * tokens)(*range(tokens))
    lens = (ctypes.c_int32 * 1)(tokens)
    lse = (ctypes.c_float * 4)()
    cache = KvCache(dtype=F16, k=kpa, v=vpa, pages=pages, page_size=16, kv_heads=1, head_dim=dim,
                    block_table=ctypes.addressof(table), seqs=1, max_pages=2)
    rope = KvRope(layout=ROPE_HALVES, base=10000.0)
    check(lib, lib.weft_kv_append(None, ctypes.byref(cache), ka, 0, va, 0, tokens, seq_ids,
                                  positions, ctypes.byref(rope)), "weft_kv_append")
    desc = DecodeDesc(q_len=2, heads=2, scale=0.5, window=3, max_seq_len=20, splits=1)
    ws = ctypes.c_size_t(99)
    check(lib, lib.weft_attention_decode_workspace(ctypes.byref(cache), ctypes.byref(desc),
                                                   ctypes.byref(ws)), "workspace")
    if ws.value != 0:
        die("KvCache/DecodeDesc drifted: a call that never splits asks %d bytes" % ws.value)
    # the FP8 fields: a cache of that format is taken with both scales, refused without v's
    scales = (ctypes.c_float * 2)(1.0, 1.0)
    fp8 = KvCache.from_buffer_copy(cache)
    fp8.format, fp8.k_scale, fp8.v_scale = KV_FP8_E4M3, ctypes.addressof(scales), \
        ctypes.addressof(scales)
    check(lib, lib.weft_attention_decode_workspace(ctypes.byref(fp8), ctypes.byref(desc),
                                                   ctypes.byref(ws)), "an FP8 cache")
    fp8.v_scale = None
    if lib.weft_attention_decode_workspace(ctypes.byref(fp8), ctypes.byref(desc),
                                           ctypes.byref(ws)) == 0:
        die("KvCache drifted: an FP8 cache without v_scale was taken")
    check(lib, lib.weft_attention_decode(None, ctypes.byref(cache), ctypes.byref(desc), oa,
                                         ctypes.addressof(lse), qa, lens, None, 0),
          "weft_attention_decode")
    # the pages: token t at page table[t // 16] = 2, slot t
    keys = [read_halves(kpa + 2 * (2 * 16 * dim + t * dim), dim) for t in range(tokens)]
    vals = [read_halves(vpa + 2 * (2 * 16 * dim + t * dim), dim) for t in range(tokens)]
    for t in range(tokens):
        for i in range(dim // 2):
            a = t * 10000.0 ** (-2.0 * i / dim)
            x, y = k16[t * dim + i], k16[t * dim + i + dim // 2]
            want = (x * math.cos(a) - y * math.sin(a), x * math.sin(a) + y * math.cos(a))
            got = (keys[t][i], keys[t][i + dim // 2])
            if any(abs(g - w) > 2e-3 * (1 + abs(w)) for g, w in zip(got, want)):
                die("KvRope/KvCache drifted: key %d pair %d is %s, want %s" % (t, i, got, want))
        if vals[t] != v16[t * dim:(t + 1) * dim]:
            die("KvCache drifted: value %d was not copied" % t)
    out = read_halves(oa, 2 * 2 * dim)
    for i in range(2):
        hi = tokens - 2 + i
        seen = range(max(0, hi - 2), hi + 1)
        for h in range(2):
            qv = q16[(i * 2 + h) * dim:(i * 2 + h + 1) * dim]
            s = [0.5 * sum(a * b for a, b in zip(qv, keys[j])) for j in seen]
            m = max(s)
            p = [math.exp(x - m) for x in s]
            want = [sum(pj * vals[j][e] for pj, j in zip(p, seen)) / sum(p) for e in range(dim)]
            got = out[(i * 2 + h) * dim:(i * 2 + h + 1) * dim]
            if any(abs(g - w) > 2e-3 for g, w in zip(got, want)):
                die("DecodeDesc drifted: query %d head %d differs" % (i, h))
            if abs(lse[i * 2 + h] - (m + math.log(sum(p)))) > 1e-3:
                die("DecodeDesc drifted: query %d head %d's LSE differs" % (i, h))
    print("bench_decode: KvCache (%d bytes), KvRope and DecodeDesc (%d bytes) match the C "
          "structs" % (ctypes.sizeof(KvCache), ctypes.sizeof(DecodeDesc)))


# ---- the GPU run -------------------------------------------------------------

class Case:
    """One shape's paged cache, query and outputs on the GPU; with fp8, the
    pools hold E4M3 bytes of the values over a scale of 1/64 a head (the
    values as the pools give them back are kept for the peer)."""

    def __init__(self, torch, lib, batch, length, fp8=False):
        self.torch, self.lib = torch, lib
        dev, bf = "cuda", torch.bfloat16
        per_seq = -(-length // PAGE)
        pages = batch * per_seq
        self.kp = torch.randn(pages, PAGE, KV_HEADS, DIM, device=dev, dtype=bf)
        self.vp = torch.randn(pages, PAGE, KV_HEADS, DIM, device=dev, dtype=bf)
        self.scales = torch.full((KV_HEADS,), 1.0 / 64, device=dev, dtype=torch.float32)
        self.fp8 = fp8
        if fp8:
            e4m3 = torch.float8_e4m3fn
            self.k8 = (self.kp.float() * 64).to(e4m3).view(torch.uint8)
            self.v8 = (self.vp.float() * 64).to(e4m3).view(torch.uint8)
            # what the pools mean: exact in bf16 (3 mantissa bits over a power of two)
            self.kp = (self.k8.view(e4m3).float() / 64).to(bf)
            self.vp = (self.v8.view(e4m3).float() / 64).to(bf)
        self.table = torch.randperm(pages, device=dev).to(torch.int32).view(batch, per_seq)
        self.lens = torch.full((batch,), length, device=dev, dtype=torch.int32)
        self.q = torch.randn(batch, 1, HEADS, DIM, device=dev, dtype=bf)
        self.out = torch.empty_like(self.q)
        self.lse = torch.empty(batch, 1, HEADS, device=dev, dtype=torch.float32)
        pools = (self.k8, self.v8) if fp8 else (self.kp, self.vp)
        self.cache = KvCache(dtype=BF16, k=pools[0].data_ptr(), v=pools[1].data_ptr(),
                             pages=pages, page_size=PAGE, kv_heads=KV_HEADS, head_dim=DIM,
                             block_table=self.table.data_ptr(), seqs=batch, max_pages=per_seq)
        if fp8:
            self.cache.format = KV_FP8_E4M3
            self.cache.k_scale = self.cache.v_scale = self.scales.data_ptr()
        self.batch, self.length = batch, length
        self.kv_bytes = 2.0 * batch * length * KV_HEADS * DIM * (1 if fp8 else 2)

    def weft(self, splits):
        """A closure running the decode with desc.splits = splits."""
        torch, lib = self.torch, self.lib
        desc = DecodeDesc(q_len=1, heads=HEADS, max_seq_len=self.length, splits=splits)
        bytes_ = ctypes.c_size_t()
        check(lib, lib.weft_attention_decode_workspace(ctypes.byref(self.cache),
                                                       ctypes.byref(desc), ctypes.byref(bytes_)),
              "weft_attention_decode_workspace")
        ws = torch.empty(max(bytes_.value, 16), device="cuda", dtype=torch.uint8)
        args = (ctypes.byref(self.cache), ctypes.byref(desc), self.out.data_ptr(),
                self.lse.data_ptr(), self.q.data_ptr(), self.lens.data_ptr(),
                ws.data_ptr() if bytes_.value else None, bytes_.value)

        def call():
            s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            rc = lib.weft_attention_decode(s, *args)
            if rc != 0:
                raise RuntimeError("weft_attention_decode: %d: %s" %
                                   (rc, lib.weft_last_error().decode()))
        call.keep = (desc, ws)
        return call

    def pages_in_order(self):
        """Each sequence's pages consecutive in the pool, in order: its keys
        and values laid out densely, read through the same table."""
        t = self.table
        t.copy_(self.torch.arange(t.numel(), device=t.device, dtype=t.dtype).view_as(t))

    def contiguous(self):
        """K and V as [B][kv_heads][L][dim], gathered through the table."""
        b, L = self.batch, self.length
        k = self.kp[self.table.long()].reshape(b, -1, KV_HEADS, DIM)[:, :L].transpose(1, 2)
        v = self.vp[self.table.long()].reshape(b, -1, KV_HEADS, DIM)[:, :L].transpose(1, 2)
        return k.contiguous(), v.contiguous()


def run(torch, F, lib, args):
    results = []  # (case, metric, value, unit, peer, peer_value, detail, targets)
    src = torch.empty(256 << 20, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    t = time_per_call(torch, lambda: dst.copy_(src))
    copy_tbps = 2 * src.numel() / t / 1e12
    results.append(("copy ceiling: device-to-device copy of 256 MiB", "bandwidth", copy_tbps,
                    "TB/s", None, None, "read + write", []))
    del src, dst
    cases = ((4, 1024), (1, 4096)) if args.quick else CASES
    for batch, length in cases:
        bf16_time = None
        for fp8 in (False, True):
            c = Case(torch, lib, batch, length, fp8)
            auto, single = c.weft(0), c.weft(1)
            k, v = c.contiguous()
            qs = c.q.transpose(1, 2)  # [B][heads][1][dim]
            sdpa = lambda: F.scaled_dot_product_attention(qs, k, v, enable_gqa=True)  # noqa
            want = sdpa().transpose(1, 2).double()
            for name, fn in (("split chosen", auto), ("split off", single)):
                fn()
                err = ((c.out.double() - want).norm() / want.norm()).item()
                if not err <= 1e-2:
                    die("B%d L%d%s (%s): weft differs from SDPA by %.2e" % (
                        batch, length, " FP8" if fp8 else "", name, err))
            tw, t1, ts = (time_per_call(torch, auto), time_per_call(torch, single),
                          time_per_call(torch, sdpa))
            bw = c.kv_bytes / tw / 1e12
            shape = "B%d L%d (heads 32, kv heads 8, dim 128, bf16, page 16)" % (batch, length)
            if not fp8:
                bf16_time = tw
                results.append((
                    "decode " + shape, "KV read bandwidth", bw, "TB/s",
                    "F.scaled_dot_product_attention (contiguous K/V)", c.kv_bytes / ts / 1e12,
                    "%.1f us, %.0f%% of copy (%.2f TB/s); split off %.2f TB/s; SDPA %.1f us; "
                    "error vs SDPA %.1e" % (tw * 1e6, 100 * bw / copy_tbps, copy_tbps,
                                            c.kv_bytes / t1 / 1e12, ts * 1e6, err),
                    [("SDPA on contiguous K/V in the same run", ">=", c.kv_bytes / ts / 1e12)]))
                # the same call with the pages in order: what the paging costs
                c.pages_in_order()
                td = time_per_call(torch, auto)
                results.append((
                    "decode pages shuffled against in order " + shape, "time", tw * 1e6, "us",
                    "the same call, each sequence's pages in order (dense K/V)", td * 1e6,
                    "%.2fx the in-order time" % (tw / td),
                    [("within 5% of the in-order pages", "<=", 1.05 * td * 1e6)]))
            else:
                results.append((
                    "decode FP8 E4M3 pages " + shape, "time", tw * 1e6, "us",
                    "F.scaled_dot_product_attention (bf16, contiguous K/V)", ts * 1e6,
                    "%.2f TB/s of FP8 K/V read, %.0f%% of copy; %.2fx the bf16 pages' time; "
                    "split off %.1f us; error vs SDPA on the same values %.1e" % (
                        bw, 100 * bw / copy_tbps, tw / bf16_time, t1 * 1e6, err), []))
            del c, k, v, auto, single
            torch.cuda.empty_cache()

    print_results(results)
    if args.no_rows:
        return
    mach, commit = machine(torch)
    write_results(args.rows, run_fields(
        "decode", mach, commit, "Release build; median of 5 runs of back-to-back calls, >= 20 ms "
        "each, after warm-up, on PyTorch's current stream", args.quick), results)
    print("bench_decode: rows in %s" % args.rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench_common.add_run_options(ap, "decode.rows.jsonl", "smaller shapes; rows marked quick",
                                 "without a GPU or PyTorch: the ctypes structs are the C ones")
    args = ap.parse_args()
    lib = load_weft(args.lib)
    if args.check_layout:
        check_layout(lib)
        return
    import torch
    import torch.nn.functional as F
    if not torch.cuda.is_available():
        die("no GPU")
    with own_stream(torch):
        torch.manual_seed(0)
        run(torch, F, lib, args)


if __name__ == "__main__":
    main()
