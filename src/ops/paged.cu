/*
 * paged.cu - the paged KV cache's kernels: the append (with RoPE on K) and
 * the decode attention with its split-KV merge (paged.c holds the checks,
 * paged_host.c the reference both must match).
 *
 * Append: a work item is one (token, kv head, rotation pair); it turns the
 * pair of K exactly as rope.cuh does (angle in double, fp32 rotation with
 * no fused multiply-adds) and copies the same two elements of V. A token
 * whose sequence, position or page is out of range writes nothing. The
 * append moves a few rows a step; its simplicity costs nothing measurable
 * beside the decode that reads the whole cache.
 *
 * Decode: decode reads every K/V byte once and does little arithmetic per
 * byte, so the kernel is built for bandwidth, and for short caches, where a
 * block's fixed costs are most of its time:
 *  - one block serves one kv head of one sequence and up to ROWS = 4 query
 *    rows (the q heads of that kv head's group, times q_len queries), so a
 *    key is read once for the group (larger groups take more blocks, which
 *    meet the same pages in L2);
 *  - each warp walks its own tiles of the block's keys with its own online
 *    softmax (no barrier until the end): a key's head is read by DIM / 8
 *    lanes, 16 bytes each, a thread's 4 keys of K and V loaded before any
 *    is used (their pages read from the block table a tile earlier); the
 *    scores are summed across a key's lanes by shuffles, and each thread
 *    accumulates P V for its keys and its 8 dims in registers;
 *  - at the end the warp's key slots meet by shuffles and the warps through
 *    shared memory, weighted by their maxima.
 * Scores are kept in base 2 (scale times log2 e folded into q) so each
 * exponential is one exp2f. Where seqs x kv_heads cannot fill a wave of
 * the GPU, the keys of a sequence are split into parts over the grid's y
 * dimension (flash-decoding): each part writes its normalised fp32 output
 * and its log-sum-exp into the caller's workspace, and decode_merge
 * combines them weighted by exp(lse - max lse). Parts are cut on page
 * boundaries from each sequence's own length, at least two tiles a warp
 * (unless the caller fixed the split), so short sequences split as little
 * as they need; a part with no keys writes lse = -Inf and weighs nothing.
 * Out-of-range lengths are clamped into [0, max_seq_len] and table
 * entries into [0, pages - 1], so no table reads outside the pools.
 *
 * FP8 pools: a thread reads its 8 elements as 8 bytes (the same threads
 * per token, half the bytes), converts them exactly through fp16 pairs,
 * and the heads' scales fold into the scores' scale (K) and the output's
 * (V), so the loop's arithmetic is the same as for 16-bit pools.
 */
#include <limits.h>

#include <cuda_fp8.h>

#include "ops/ops_cuda.cuh"
#include "ops/paged.h"
#include "ops/rope.cuh"

namespace weft_ops
{
namespace
{

/* ---- append ---------------------------------------------------------------- */

template <typename T> struct append_params {
    void *kp, *vp; /* T, or FP8 bytes */
    const float *k_scale, *v_scale;
    const T *k, *v;
    const int32_t *table, *seq_ids, *positions;
    size_t k_stride, v_stride, tokens, kv_heads, head_dim, page_size, pages, seqs, max_pages;
    weft__rope_freq freq;
    bool rope, halves, fp8;
};

/* Element i of a pool := x: T, or x / scale rounded to E4M3 (nearest even,
 * saturating; NaN 0x7f), as weft__f32_to_e4m3 on the host. */
template <typename T>
__device__ __forceinline__ void pool_store(void *pool, bool fp8, float scale, size_t i, float x)
{
    if (fp8)
        static_cast<__nv_fp8_storage_t *>(pool)[i] =
            __nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3);
    else
        static_cast<T *>(pool)[i] = from_f32<T>(x);
}

template <typename T> __global__ void __launch_bounds__(256) append_kernel(append_params<T> p)
{
    start_as_dependent(); /* launched as one (launch.cuh) */
    const size_t pairs = p.head_dim / 2, n = p.tokens * p.kv_heads * pairs;
    for (size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x; x < n;
         x += (size_t)gridDim.x * blockDim.x) {
        size_t i = x % pairs, th = x / pairs, h = th % p.kv_heads, t = th / p.kv_heads;
        int32_t s = p.seq_ids[t], pos = p.positions[t];
        if (s < 0 || (size_t)s >= p.seqs || pos < 0 || (size_t)pos >= p.max_pages * p.page_size)
            continue;
        int32_t page = p.table[(size_t)s * p.max_pages + (size_t)pos / p.page_size];
        if (page < 0 || (size_t)page >= p.pages)
            continue;
        size_t dst = (((size_t)page * p.page_size + (size_t)pos % p.page_size) * p.kv_heads + h) *
                     p.head_dim;
        size_t lo = p.halves ? i : 2 * i, hi = p.halves ? i + pairs : 2 * i + 1;
        const T *ks = p.k + t * p.k_stride + h * p.head_dim;
        const T *vs = p.v + t * p.v_stride + h * p.head_dim;
        float u = to_f32(ks[lo]), w = to_f32(ks[hi]);
        if (p.rope) {
            float sn, cs;
            pair_angle(pos, weft__rope_inverse_frequency(&p.freq, i), sn, cs);
            rotate(u, w, sn, cs);
        }
        float kscale = p.fp8 ? p.k_scale[h] : 1.0f, vscale = p.fp8 ? p.v_scale[h] : 1.0f;
        pool_store<T>(p.kp, p.fp8, kscale, dst + lo, u);
        pool_store<T>(p.kp, p.fp8, kscale, dst + hi, w);
        pool_store<T>(p.vp, p.fp8, vscale, dst + lo, to_f32(vs[lo]));
        pool_store<T>(p.vp, p.fp8, vscale, dst + hi, to_f32(vs[hi]));
    }
}

template <typename T> int launch_append(cudaStream_t stream, const weft__kv_append_args *a)
{
    append_params<T> p = {};
    p.kp = a->c.k;
    p.vp = a->c.v;
    p.fp8 = a->c.format == WEFT_KV_FP8_E4M3;
    p.k_scale = a->c.k_scale;
    p.v_scale = a->c.v_scale;
    p.k = (const T *)a->k;
    p.v = (const T *)a->v;
    p.table = a->c.block_table;
    p.seq_ids = a->seq_ids;
    p.positions = a->positions;
    p.k_stride = a->k_stride;
    p.v_stride = a->v_stride;
    p.tokens = a->tokens;
    p.kv_heads = a->c.kv_heads;
    p.head_dim = a->c.head_dim;
    p.page_size = a->c.page_size;
    p.pages = a->c.pages;
    p.seqs = a->c.seqs;
    p.max_pages = a->c.max_pages;
    p.freq = a->freq;
    p.rope = a->rope != 0;
    p.halves = a->layout == WEFT_ROPE_HALVES;
    const unsigned threads = 256;
    auto kernel = append_kernel<T>;
    size_t work = p.tokens * p.kv_heads * (p.head_dim / 2);
    return launch_dependent("weft_kv_append", stream, dim3(grid_for(kernel, work, threads)),
                            dim3(threads), 0, kernel, p);
}

/* ---- decode ---------------------------------------------------------------- */

enum : int {
    DECODE_THREADS = 128,
    DECODE_WARPS = DECODE_THREADS / 32,
    DECODE_MAX_ROWS = 4,
    DECODE_TPT = 4, /* keys a thread reads a tile */
    MERGE_ROWS = 4
};

template <typename T> struct decode_params {
    const void *kp, *vp; /* T, or FP8 bytes */
    const float *k_scale, *v_scale;
    const T *q;
    long long q_stride; /* elements between query rows */
    T *out;
    float *lse;
    const int32_t *table, *seq_lens;
    float *part_o, *part_lse; /* the workspace, when split */
    int page_shift, kv_heads, heads, group, q_len, rows, row_groups, pages, max_pages;
    int window, max_len, splits, seqs;
    int min_part_pages;    /* the fewest pages a part takes (1 when the caller split) */
    bool q_rope, q_halves; /* turn q as it is read (weft_rope_scaled's rotation) */
    weft__rope_freq q_freq;
    float scale_log2; /* scale * log2(e): scores in base 2 */
};

/* The first and one-past-last key of sequence b that any of its queries
 * sees, and the sequence's length, clamped. */
template <typename T>
__device__ __forceinline__ void visible_keys(const decode_params<T> &p, int b, int &len, int &lo)
{
    len = p.seq_lens[b];
    len = len < 0 ? 0 : len > p.max_len ? p.max_len : len;
    lo = 0;
    if (p.window > 0) {
        int first = len - p.q_len - p.window + 1; /* query 0's first key */
        lo = first > 0 ? first : 0;
    }
}

/* Eight E4M3 bytes as fp32 (exact: through fp16 pairs). */
__device__ __forceinline__ void unpack_e4m3(float (&x)[8], uint2 raw)
{
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t word = k < 2 ? raw.x : raw.y;
        __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
            (__nv_fp8x2_storage_t)((word >> (16 * (k % 2))) & 0xffffu), __NV_E4M3);
        float2 f = __half22float2(__half2(h));
        x[2 * k] = f.x;
        x[2 * k + 1] = f.y;
    }
}

/* A thread's 8 elements of a key or value: 16 bytes of T, or 8 of FP8. */
template <typename T, bool FP8> struct kv_chunk {
    using raw = std::conditional_t<FP8, uint2, uint4>;
    static constexpr size_t esize = FP8 ? 1 : sizeof(T);

    static __device__ __forceinline__ raw load(const void *pool, size_t at)
    {
        return *reinterpret_cast<const raw *>(static_cast<const char *>(pool) + at * esize);
    }

    static __device__ __forceinline__ void unpack8(float (&x)[8], raw r)
    {
        if constexpr (FP8)
            unpack_e4m3(x, r);
        else
            unpack<T, 8>(x, r);
    }
};

/* The pages of a thread's keys in the tile from t0 (TPT tokens, GROUPS
 * apart), read through the sequence's block table row and clamped into
 * the pool; -1 past t_end. */
template <int TPT, int GROUPS>
__device__ __forceinline__ void tile_pages(int (&pg)[TPT], const int32_t *table, int t0, int t_end,
                                           int gidx, int page_shift, int pages)
{
#pragma unroll
    for (int j = 0; j < TPT; j++) {
        int t = t0 + gidx + j * GROUPS, page = -1;
        if (t < t_end) {
            page = table[t >> page_shift];
            page = page < 0 ? 0 : page >= pages ? pages - 1 : page;
        }
        pg[j] = page;
    }
}

/* A thread's part of the keys' or values' tile from t0 on the pages pg
 * (tile_pages): each load issued, none waited for; zeros past the end. */
template <typename chunk, int TPT, int GROUPS>
__device__ __forceinline__ void load_tile(typename chunk::raw (&dst)[TPT], const void *pool,
                                          const int (&pg)[TPT], int t0, int gidx, int page_shift,
                                          size_t token_elems, size_t head_off)
{
    const int ps = 1 << page_shift;
#pragma unroll
    for (int j = 0; j < TPT; j++) {
        int t = t0 + gidx + j * GROUPS;
        if (pg[j] >= 0) {
            size_t at = (((size_t)pg[j] << page_shift) + (t & (ps - 1))) * token_elems + head_off;
            dst[j] = chunk::load(pool, at);
        } else {
            dst[j] = {};
        }
    }
}

/* Element e of a query row after weft_rope_scaled's rotation at position
 * pos (rope.cuh's angle and rotation), rounded to T as weft_rope leaves it. */
template <typename T, int DIM>
__device__ __forceinline__ float turned(const T *row, int e, int pos, bool halves,
                                        const weft__rope_freq &freq)
{
    int i = halves ? e % (DIM / 2) : e / 2;
    int lo = halves ? i : 2 * i, hi = halves ? i + DIM / 2 : 2 * i + 1;
    float u = to_f32(row[lo]), w = to_f32(row[hi]), sn, cs;
    pair_angle(pos, weft__rope_inverse_frequency(&freq, (size_t)i), sn, cs);
    rotate(u, w, sn, cs);
    return to_f32(from_f32<T>(e == lo ? u : w));
}

template <typename T, int DIM, int ROWS, bool FP8>
__global__ void __launch_bounds__(DECODE_THREADS, 4) decode_kernel(decode_params<T> p)
{
    start_as_dependent(); /* launched as one (launch.cuh) */
    using chunk = kv_chunk<T, FP8>;
    constexpr int LANES = DIM / 8;    /* threads a key */
    constexpr int SLOTS = 32 / LANES; /* keys a warp reads at once */
    constexpr int TPT = DECODE_TPT;
    constexpr int TILE = SLOTS * TPT; /* keys a warp's tile */
    __shared__ __align__(16) float q_s[ROWS][DIM];
    __shared__ __align__(16) float o_s[DECODE_WARPS][ROWS][DIM];
    __shared__ float m_s[DECODE_WARPS][ROWS], l_s[DECODE_WARPS][ROWS];

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int sub = lane % LANES, slot = lane / LANES;
    const int h = blockIdx.x % p.kv_heads, rg = (blockIdx.x / p.kv_heads) % p.row_groups;
    const int b = blockIdx.x / p.kv_heads / p.row_groups, split = blockIdx.y;

    int len, seq_lo;
    visible_keys(p, b, len, seq_lo);
    /* FP8: K's scale folds into the scores', V's into the output */
    const float score_scale = FP8 ? p.scale_log2 * p.k_scale[h] : p.scale_log2;
    const float out_scale = FP8 ? p.v_scale[h] : 1.0f;

    /* this part's keys: pages [first + split * per, ...) of the visible ones */
    const int ps = 1 << p.page_shift;
    int first_page = seq_lo >> p.page_shift, last_page = (len + ps - 1) >> p.page_shift;
    int np = last_page - first_page, per = max((np + p.splits - 1) / p.splits, p.min_part_pages);
    int part_lo = (first_page + min(np, split * per)) << p.page_shift;
    int part_hi = (first_page + min(np, (split + 1) * per)) << p.page_shift;
    part_lo = max(part_lo, seq_lo);
    part_hi = min(part_hi, len);

    /* the rows: row r is query i = gr / group of head h * group + gr % group,
     * kept in shared memory with the score's scale folded in */
    int row_lo[ROWS], row_hi[ROWS];         /* keys [lo, hi) each row sees */
    int t_begin = INT_MAX, t_end = INT_MIN; /* the keys any row sees in this part */
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        int gr = rg * ROWS + r;
        row_lo[r] = 0, row_hi[r] = 0;
        if (gr < p.rows) {
            row_hi[r] = len - p.q_len + gr / p.group + 1;
            row_lo[r] = p.window > 0 ? max(0, row_hi[r] - p.window) : 0;
            int lo = max(part_lo, row_lo[r]), hi = min(part_hi, row_hi[r]);
            if (lo < hi) {
                t_begin = min(t_begin, lo);
                t_end = max(t_end, hi);
            }
        }
    }
    if (t_begin >= t_end) /* no keys here: the loop below must not start */
        t_begin = t_end = 0;
    for (int x = tid; x < ROWS * DIM; x += DECODE_THREADS) {
        int r = x / DIM, e = x % DIM, gr = rg * ROWS + r;
        float v = 0.0f;
        if (gr < p.rows) {
            int i = gr / p.group, head = h * p.group + gr % p.group;
            const T *row = p.q + ((size_t)b * p.q_len + i) * p.q_stride + (size_t)head * DIM;
            v = to_f32(row[e]);
            if (p.q_rope) /* e's pair turned at the query's position, rounded as q would be */
                v = turned<T, DIM>(row, e, len - p.q_len + i, p.q_halves, p.q_freq);
        }
        q_s[r][e] = v * score_scale;
    }
    __syncthreads();

    /* Each warp runs its own online softmax over its tiles (tiles warp,
     * warp + WARPS, ... of the part), so nothing waits for another warp
     * until the end; a thread's m, l and acc cover its slot's keys. */
    float m[ROWS], l[ROWS], acc[ROWS][8];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++)
            acc[r][e] = 0.0f;
    }
    const size_t head_off = (size_t)h * DIM + sub * 8, token_elems = (size_t)p.kv_heads * DIM;
    const int32_t *table = p.table + (size_t)b * p.max_pages;
    /* A tile's pages are read from the table a tile ahead, so a tile's
     * loads wait on one round trip to memory, not two. */
    constexpr int STRIDE = DECODE_WARPS * TILE;
    int pg[TPT];
    tile_pages<TPT, SLOTS>(pg, table, t_begin + warp * TILE, t_end, slot, p.page_shift, p.pages);
    for (int t0 = t_begin + warp * TILE; t0 < t_end; t0 += STRIDE) {
        typename chunk::raw kr[TPT], vr[TPT];
        load_tile<chunk, TPT, SLOTS>(kr, p.kp, pg, t0, slot, p.page_shift, token_elems, head_off);
        load_tile<chunk, TPT, SLOTS>(vr, p.vp, pg, t0, slot, p.page_shift, token_elems, head_off);
        tile_pages<TPT, SLOTS>(pg, table, t0 + STRIDE, t_end, slot, p.page_shift, p.pages);
        /* scores: a key's LANES threads each dot 8 dims, then sum (every
         * lane of the slot ends with the same bits) */
        float s[TPT][ROWS];
#pragma unroll
        for (int j = 0; j < TPT; j++) {
            int t = t0 + slot + j * SLOTS;
            float kf[8];
            chunk::unpack8(kf, kr[j]);
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const float4 *qv = reinterpret_cast<const float4 *>(&q_s[r][sub * 8]);
                float4 a = qv[0], c = qv[1];
                float dot = a.x * kf[0] + a.y * kf[1] + a.z * kf[2] + a.w * kf[3] + c.x * kf[4] +
                            c.y * kf[5] + c.z * kf[6] + c.w * kf[7];
#pragma unroll
                for (int off = LANES / 2; off > 0; off >>= 1)
                    dot += __shfl_xor_sync(0xffffffffu, dot, off);
                s[j][r] = t < t_end && t >= row_lo[r] && t < row_hi[r] ? dot : -INFINITY;
            }
        }
        /* the online softmax: the tile's maximum over the warp's slots */
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float mx = s[0][r];
#pragma unroll
            for (int j = 1; j < TPT; j++)
                mx = fmaxf(mx, s[j][r]);
#pragma unroll
            for (int off = LANES; off < 32; off <<= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            float m_new = fmaxf(m[r], mx), alpha = 1.0f, sum = 0.0f;
            if (m_new != -INFINITY) {
                alpha = exp2f(m[r] - m_new);
#pragma unroll
                for (int j = 0; j < TPT; j++) {
                    s[j][r] = exp2f(s[j][r] - m_new);
                    sum += s[j][r];
                }
            } else {
#pragma unroll
                for (int j = 0; j < TPT; j++)
                    s[j][r] = 0.0f;
            }
            m[r] = m_new;
            l[r] = l[r] * alpha + sum;
#pragma unroll
            for (int e = 0; e < 8; e++)
                acc[r][e] *= alpha;
        }
        /* P V for this thread's keys and dims */
#pragma unroll
        for (int j = 0; j < TPT; j++) {
            float vf[8];
            chunk::unpack8(vf, vr[j]);
#pragma unroll
            for (int r = 0; r < ROWS; r++)
#pragma unroll
                for (int e = 0; e < 8; e++)
                    acc[r][e] = fmaf(s[j][r], vf[e], acc[r][e]);
        }
    }

    /* the warp's slots meet (they share m), then the warps, weighted by
     * 2^(m_w - max m) */
#pragma unroll
    for (int off = LANES; off < 32; off <<= 1)
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], off);
#pragma unroll
            for (int e = 0; e < 8; e++)
                acc[r][e] += __shfl_xor_sync(0xffffffffu, acc[r][e], off);
        }
    if (slot == 0)
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float4 *dst = reinterpret_cast<float4 *>(&o_s[warp][r][sub * 8]);
            dst[0] = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
            dst[1] = make_float4(acc[r][4], acc[r][5], acc[r][6], acc[r][7]);
            if (sub == 0)
                m_s[warp][r] = m[r], l_s[warp][r] = l[r];
        }
    __syncthreads();
    for (int x = tid; x < ROWS * DIM; x += DECODE_THREADS) {
        int r = x / DIM, e = x % DIM, gr = rg * ROWS + r;
        if (gr >= p.rows)
            continue;
        float mx = m_s[0][r];
#pragma unroll
        for (int w = 1; w < DECODE_WARPS; w++)
            mx = fmaxf(mx, m_s[w][r]);
        float sum = 0.0f, lsum = 0.0f;
        if (mx != -INFINITY)
#pragma unroll
            for (int w = 0; w < DECODE_WARPS; w++) {
                float wt = exp2f(m_s[w][r] - mx);
                sum += wt * o_s[w][r][e];
                lsum += wt * l_s[w][r];
            }
        float o = lsum > 0.0f ? sum / lsum * out_scale : 0.0f;
        float lse = lsum > 0.0f ? (mx + log2f(lsum)) * 0.6931471805599453f : -INFINITY;
        int i = gr / p.group, head = h * p.group + gr % p.group;
        size_t row = ((size_t)b * p.q_len + i) * p.heads + head;
        if (p.splits > 1) {
            p.part_o[(row * p.splits + split) * DIM + e] = o;
            if (e == 0)
                p.part_lse[row * p.splits + split] = lse;
        } else {
            p.out[row * DIM + e] = from_f32<T>(o);
            if (e == 0 && p.lse)
                p.lse[row] = lse;
        }
    }
}

/* The parts of each query row combined: weights exp(lse_s - max lse). A
 * warp a row, DIM / 32 dims a lane. */
template <typename T, int DIM>
__global__ void __launch_bounds__(MERGE_ROWS * 32)
    decode_merge(const float *part_o, const float *part_lse, T *out, float *lse, int rows,
                 int splits)
{
    start_as_dependent(); /* launched as one (launch.cuh) */
    constexpr int E = DIM / 32;
    int row = blockIdx.x * MERGE_ROWS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows)
        return;
    const float *pl = part_lse + (size_t)row * splits;
    float m = -INFINITY;
    for (int s = 0; s < splits; s++)
        m = fmaxf(m, pl[s]);
    float acc[E] = {}, total = 0.0f;
    if (m != -INFINITY) {
        for (int s = 0; s < splits; s++) {
            if (pl[s] == -INFINITY) /* a part with no keys */
                continue;
            float w = expf(pl[s] - m);
            total += w;
            const float *po = part_o + ((size_t)row * splits + s) * DIM;
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[e] += w * po[lane + 32 * e];
        }
    }
#pragma unroll
    for (int e = 0; e < E; e++)
        out[(size_t)row * DIM + lane + 32 * e] = from_f32<T>(total > 0.0f ? acc[e] / total : 0.0f);
    if (lse && lane == 0)
        lse[row] = total > 0.0f ? m + logf(total) : -INFINITY;
}

/* How many blocks of this kernel one SM holds at once (asked of CUDA once
 * a kernel; 1 if it will not say). */
template <typename K> int blocks_an_sm(K kernel)
{
    static std::atomic<int> known{0};
    int n = known.load(std::memory_order_relaxed);
    if (n > 0)
        return n;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, DECODE_THREADS, 0) !=
            cudaSuccess ||
        n < 1)
        n = 1;
    known.store(n, std::memory_order_relaxed);
    return n;
}

template <typename T, int DIM, int ROWS, bool FP8>
int launch_decode_rows(cudaStream_t stream, decode_params<T> p, const weft__decode_args *a)
{
    auto kernel = decode_kernel<T, DIM, ROWS, FP8>;
    constexpr int TILE = 32 / (DIM / 8) * DECODE_TPT;
    /* The split: as fixed by the caller, or as many parts as fill one wave
     * of the GPU's blocks (more would leave a ragged second wave), no more
     * than the shape's workspace holds; a part the split makes takes at
     * least two tiles a warp, so short sequences stay whole. */
    size_t base = (size_t)p.seqs * p.kv_heads * (size_t)p.row_groups, parts = a->max_splits;
    p.min_part_pages = 1;
    if (!a->forced) {
        size_t wave = (size_t)blocks_an_sm(kernel) * (size_t)sm_count();
        size_t want = wave > base ? wave / base : 1;
        parts = want < parts ? want : parts;
        p.min_part_pages = (2 * DECODE_WARPS * TILE + (1 << p.page_shift) - 1) >> p.page_shift;
    }
    p.splits = (int)(parts < 1 ? 1 : parts);
    size_t rows = (size_t)p.seqs * p.q_len * p.heads;
    if (p.splits > 1) {
        p.part_o = (float *)a->workspace;
        p.part_lse =
            (float *)((char *)a->workspace + weft__decode_lse_offset(rows, (size_t)p.splits, DIM));
    }
    int rc =
        launch_dependent("weft_attention_decode", stream, dim3((unsigned)base, (unsigned)p.splits),
                         dim3(DECODE_THREADS), 0, kernel, p);
    if (rc != WEFT_OK || p.splits == 1)
        return rc;
    unsigned mblocks = (unsigned)((rows + MERGE_ROWS - 1) / MERGE_ROWS);
    return launch_dependent("weft_attention_decode (merge)", stream, dim3(mblocks),
                            dim3(MERGE_ROWS * 32), 0, decode_merge<T, DIM>, p.part_o, p.part_lse,
                            p.out, p.lse, (int)rows, p.splits);
}

template <typename T, int DIM, bool FP8>
int launch_decode_dim(cudaStream_t stream, decode_params<T> p, const weft__decode_args *a)
{
    switch (p.rows <= 1 ? 1 : p.rows <= 2 ? 2 : 4) {
    case 1:
        return launch_decode_rows<T, DIM, 1, FP8>(stream, p, a);
    case 2:
        return launch_decode_rows<T, DIM, 2, FP8>(stream, p, a);
    default:
        return launch_decode_rows<T, DIM, DECODE_MAX_ROWS, FP8>(stream, p, a);
    }
}

template <typename T> int launch_decode(cudaStream_t stream, const weft__decode_args *a)
{
    const weft_kv_cache *c = &a->c;
    decode_params<T> p = {};
    p.kp = c->k;
    p.vp = c->v;
    p.k_scale = c->k_scale;
    p.v_scale = c->v_scale;
    p.q = (const T *)a->q;
    p.q_stride = (long long)a->q_stride;
    p.out = (T *)a->out;
    p.lse = a->lse;
    p.table = c->block_table;
    p.seq_lens = a->seq_lens;
    p.page_shift = 0;
    while (((size_t)1 << p.page_shift) < c->page_size)
        p.page_shift++;
    p.kv_heads = (int)c->kv_heads;
    p.heads = (int)a->heads;
    p.group = (int)(a->heads / c->kv_heads);
    p.q_len = (int)a->q_len;
    p.rows = p.group * p.q_len;
    int per_block = p.rows <= 1 ? 1 : p.rows <= 2 ? 2 : DECODE_MAX_ROWS;
    p.row_groups = (p.rows + per_block - 1) / per_block;
    p.pages = (int)c->pages;
    p.max_pages = (int)c->max_pages;
    /* a window past every length is no window */
    p.window = a->window > a->max_seq_len ? 0 : (int)a->window;
    p.max_len = (int)a->max_seq_len;
    p.seqs = (int)c->seqs;
    p.scale_log2 = a->scale * 1.4426950408889634f;
    p.q_rope = a->q_rope != 0;
    p.q_halves = a->q_layout == WEFT_ROPE_HALVES;
    p.q_freq = a->q_freq;

    if (c->format == WEFT_KV_FP8_E4M3)
        return c->head_dim == 64 ? launch_decode_dim<T, 64, true>(stream, p, a)
                                 : launch_decode_dim<T, 128, true>(stream, p, a);
    return c->head_dim == 64 ? launch_decode_dim<T, 64, false>(stream, p, a)
                             : launch_decode_dim<T, 128, false>(stream, p, a);
}

template <typename F> int by_half_type(weft_dtype dtype, F launch_as)
{
    if (dtype == WEFT_DTYPE_F16)
        return launch_as(__half{});
    return launch_as(__nv_bfloat16{});
}

} // namespace
} // namespace weft_ops

extern "C" int weft__kv_append_cuda(void *stream, const weft__kv_append_args *a)
{
    return weft_ops::by_half_type(a->c.dtype, [&](auto t) {
        return weft_ops::launch_append<decltype(t)>((cudaStream_t)stream, a);
    });
}

extern "C" int weft__decode_cuda(void *stream, const weft__decode_args *a)
{
    return weft_ops::by_half_type(a->c.dtype, [&](auto t) {
        return weft_ops::launch_decode<decltype(t)>((cudaStream_t)stream, a);
    });
}
