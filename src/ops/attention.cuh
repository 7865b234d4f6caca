/*
 * attention.cuh - what weft_attention's two GPU kernels share: the
 * parameters, the copies into shared memory, the shared tiles' layout,
 * where a sequence's rows lie, which keys a query row sees, the online
 * softmax of one tile and the writing of O and the LSE.
 *
 * attention.cu holds the kernel that runs on any GPU weft builds for
 * (mma.sync); attention_wgmma.cu the one built for Hopper alone (wgmma,
 * sm_90a). A thread of either holds S and O in the m16n8 accumulator
 * layout: rows g and g + 8 of its warp's 16 (g = lane / 4), columns
 * 8n + 2t and 8n + 2t + 1 of each 8 (t = lane % 4), so everything past
 * the two products is written once, here.
 */
#ifndef WEFT_OPS_ATTENTION_CUH
#define WEFT_OPS_ATTENTION_CUH

#include <math.h>

#include "ops/attention.h"
#include "ops/ops_cuda.cuh"

namespace weft_ops
{
namespace attention
{

template <typename T> struct params {
    const T *q, *k, *v;
    T *o;
    float *lse;
    const int32_t *cu_q, *cu_k, *pos_q, *pos_k;
    const int32_t *table, *k_lens; /* paged: the block table and the key lengths */
    int page_shift, pages, max_pages;
    long long q_stride, k_stride, v_stride, o_stride, lse_stride;
    int seq_q, seq_k, group; /* group: query heads per kv head */
    int causal, halves;
    long long window; /* 0: none */
    float scale_log2; /* scale * log2(e) */
    double rope_base;
};

/* The checked arguments as a kernel reads them. */
template <typename T> params<T> params_of(const weft__attention_args *a)
{
    params<T> p = {};
    p.q = (const T *)a->q, p.k = (const T *)a->k, p.v = (const T *)a->v, p.o = (T *)a->o;
    p.lse = a->lse;
    p.cu_q = a->cu_seqlens_q, p.cu_k = a->cu_seqlens_k;
    p.pos_q = a->q_positions, p.pos_k = a->k_positions;
    p.q_stride = (long long)a->q_stride, p.k_stride = (long long)a->k_stride;
    p.v_stride = (long long)a->v_stride, p.o_stride = (long long)a->o_stride;
    p.lse_stride = (long long)a->lse_stride;
    p.seq_q = (int)a->seq_q, p.seq_k = (int)a->seq_k;
    p.group = (int)(a->heads / a->kv_heads);
    p.causal = a->causal;
    p.halves = a->rope_layout == WEFT_ROPE_HALVES;
    /* a window past every key is no window */
    p.window = a->window > a->seq_k ? 0 : (long long)a->window;
    p.scale_log2 = (float)((double)a->scale * 1.4426950408889634);
    p.rope_base = a->rope_base;
    if (a->paged) {
        p.table = a->table, p.k_lens = a->k_lens;
        p.pages = (int)a->pages, p.max_pages = (int)a->max_pages;
        while ((1u << p.page_shift) < a->page_size)
            p.page_shift++;
    }
    return p;
}

/*
 * The shared tiles: R rows of D 16-bit elements, in 16-byte chunks, chunk
 * c of a row stored at c ^ (row % 8) among its row's first eight (the eight
 * rows one ldmatrix or one tensor-core read takes fall in eight different
 * bank groups).
 *  - ROWS: row r whole at r D (the mma.sync kernel's).
 *  - PANELS: columns in panels of 64 (128 bytes), panel j holding every
 *    row's columns 64j .. 64j + 63, row r at 64 r within it: wgmma's
 *    128-byte swizzle, read by its descriptors (attention_wgmma.cu).
 * With D = 64 the two are the same.
 */
enum class layout { ROWS, PANELS };

template <layout L, int D, int R> __device__ __forceinline__ int at(int r, int e)
{
    constexpr int W = L == layout::ROWS ? D : 64;
    const int c = (e % W) >> 3;
    return (e / W) * (R * W) + r * W + (((c ^ (r & 7))) << 3) + (e & 7);
}

/* Rows [row0, row0 + R) of a head (D elements from src, rows stride
 * apart) into the tile dst; rows at or past `rows` zero-filled (cp.async's
 * source size 0), so they add nothing and padding past them is never
 * read. */
template <layout L, typename T, int D, int R, int THREADS>
__device__ __forceinline__ void load_tile(T *dst, const T *src, long long stride, int row0,
                                          int rows)
{
    constexpr int CHUNKS = D / 8;
#pragma unroll
    for (int i = threadIdx.x; i < R * CHUNKS; i += THREADS) {
        const int r = i / CHUNKS, c = i % CHUNKS;
        const bool ok = row0 + r < rows;
        const T *from = ok ? src + (long long)(row0 + r) * stride + c * 8 : src;
        cp_async16(dst + at<L, D, R>(r, 8 * c), from, ok ? 16 : 0);
    }
}

/* Rows [row0, row0 + R) of a sequence's keys in a paged pool (base: the
 * pool plus the kv head's offset, rows stride apart; key t in slot t %
 * page_size of page table[t / page_size], clamped into the pool) into the
 * tile dst; rows at or past `rows` zero-filled. Pages hold 16 rows or
 * more, so each 16-byte chunk is still one cp.async. */
template <layout L, typename T, int D, int R, int THREADS>
__device__ __forceinline__ void load_paged_tile(T *dst, const T *base, long long stride, int row0,
                                                int rows, const int32_t *table, int shift,
                                                int pages)
{
    constexpr int CHUNKS = D / 8;
#pragma unroll
    for (int i = threadIdx.x; i < R * CHUNKS; i += THREADS) {
        const int r = i / CHUNKS, c = i % CHUNKS, t = row0 + r;
        const bool ok = t < rows;
        const T *from = base;
        if (ok) {
            int page = table[t >> shift];
            page = page < 0 ? 0 : page >= pages ? pages - 1 : page;
            const long long row = ((long long)page << shift) + (t & ((1 << shift) - 1));
            from = base + row * stride + c * 8;
        }
        cp_async16(dst + at<L, D, R>(r, 8 * c), from, ok ? 16 : 0);
    }
}

/* BN rows of K and of V from row n0 on, from dense rows or the pages. */
template <layout L, typename T, int D, int BN, bool PAGED, int THREADS>
__device__ __forceinline__ void load_kv(T *ks, T *vs, const params<T> &p, const T *kh, const T *vh,
                                        const int32_t *table, int n0, int lk)
{
    if (PAGED) {
        load_paged_tile<L, T, D, BN, THREADS>(ks, kh, p.k_stride, n0, lk, table, p.page_shift,
                                              p.pages);
        load_paged_tile<L, T, D, BN, THREADS>(vs, vh, p.v_stride, n0, lk, table, p.page_shift,
                                              p.pages);
    } else {
        load_tile<L, T, D, BN, THREADS>(ks, kh, p.k_stride, n0, lk);
        load_tile<L, T, D, BN, THREADS>(vs, vh, p.v_stride, n0, lk);
    }
}

/*
 * RoPE, when asked, turns the Q tile once and each K tile as it arrives,
 * in shared memory, rounding to the dtype as weft_rope stores. Angles are
 * formed in double (position times the inverse frequency, computed once a
 * block as the host does) and reduced modulo 2 pi in double; the sine and
 * cosine of the reduced angle are fp32 (sincosf, not the fast intrinsic),
 * within ~2.5e-7 of the host's correctly rounded double ones.
 */
template <int D, int THREADS> __device__ void rope_frequencies(double *inv_freq, double base)
{
    for (int i = threadIdx.x; i < D / 2; i += THREADS)
        inv_freq[i] = pow(base, -2.0 * (double)i / (double)D);
}

/* RoPE on rows [0, R) of a tile in place: row r is sequence row row0 + r
 * (below rows), at position pos[row0 + r]. */
template <layout L, typename T, int D, int R, int THREADS>
__device__ void rotate_tile(T *tile, const int32_t *pos, int row0, int rows, bool halves,
                            const double *inv_freq)
{
    constexpr int PAIRS = D / 2;
    for (int w = threadIdx.x; w < R * PAIRS; w += THREADS) {
        const int r = w / PAIRS, i = w % PAIRS;
        if (row0 + r >= rows)
            continue;
        const int lo = halves ? i : 2 * i, hi = halves ? i + PAIRS : 2 * i + 1;
        double a = (double)pos[row0 + r] * inv_freq[i];
        a -= rint(a * 0.15915494309189535) * 6.283185307179586; /* into [-pi, pi] */
        float sn, cs;
        sincosf((float)a, &sn, &cs);
        T *pl = tile + at<L, D, R>(r, lo), *ph = tile + at<L, D, R>(r, hi);
        const float u = to_f32(*pl), v = to_f32(*ph);
        *pl = from_f32<T>(__fsub_rn(__fmul_rn(u, cs), __fmul_rn(v, sn)));
        *ph = from_f32<T>(__fadd_rn(__fmul_rn(u, sn), __fmul_rn(v, cs)));
    }
}

/* Two floats as the 32-bit pair of T an mma operand takes (lo first). */
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi)
{
    unsigned u;
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        memcpy(&u, &v, sizeof u);
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        memcpy(&u, &v, sizeof u);
    }
    return u;
}

/* Where block (query block mb, sequence b) works: its sequence's first Q
 * and K rows (q0, k0), their counts (lq, lk), its block-table row (paged),
 * and the keys its BM rows from m0 see, [n_begin, n_end), n_begin on a
 * multiple of BN. */
struct span {
    long long q0, k0, shift; /* shift: lk - lq, query i's diagonal key i + shift */
    int lq, lk, m0;
    long long n_begin, n_end;
    const int32_t *table;
};

/* Sequence b's first row and row count from a varlen table (clamped into
 * [0, most]). */
__device__ __forceinline__ void varlen(const int32_t *cu, int b, int most, long long &first,
                                       int &count)
{
    const long long start = cu[b];
    long long n = cu[b + 1] - start;
    n = n < 0 ? 0 : n > most ? most : n;
    first = start < 0 ? 0 : start;
    count = (int)n;
}

template <typename T, bool PAGED, int BM, int BN>
__device__ __forceinline__ span span_of(const params<T> &p, int b, int mb)
{
    span s;
    s.table = nullptr;
    if (p.cu_q) {
        varlen(p.cu_q, b, p.seq_q, s.q0, s.lq);
    } else {
        s.q0 = (long long)b * p.seq_q;
        s.lq = p.seq_q;
    }
    if (PAGED) { /* keys from position 0 of the sequence's pages */
        const long long nk = p.k_lens[b];
        s.k0 = 0;
        s.lk = (int)(nk < 0 ? 0 : nk > p.seq_k ? p.seq_k : nk);
        s.table = p.table + (long long)b * p.max_pages;
    } else if (p.cu_k) {
        varlen(p.cu_k, b, p.seq_k, s.k0, s.lk);
    } else {
        s.k0 = (long long)b * p.seq_k;
        s.lk = p.seq_k;
    }
    s.m0 = mb * BM;
    /* Query i sees keys [i + shift - window + 1, i + shift] (causal), all
     * below lk. */
    s.shift = (long long)s.lk - s.lq;
    s.n_end = s.lk, s.n_begin = 0;
    if (p.causal) {
        const long long last = s.m0 + BM + s.shift; /* past the last row's diagonal */
        s.n_end = last < s.n_end ? last : s.n_end;
        if (p.window) {
            const long long first = s.m0 + s.shift - p.window + 1;
            s.n_begin = first > 0 ? first / BN * BN : 0;
        }
    }
    return s;
}

/* A block's opening: its head's Q tile (waited for) and its kv head's
 * first K and V tile (on their way) copied in by cp.async, and Q turned
 * when RoPE is asked (its frequencies left in inv_freq); kh and vh are set
 * to the kv head's K and V rows. A barrier must come before Q is read. */
template <layout L, typename T, int D, int BM, int BN, bool ROPE, bool PAGED, int THREADS>
__device__ __forceinline__ void open_block(const params<T> &p, const span &sp, int h, T *sq, T *sk,
                                           T *sv, double *inv_freq, const T *&kh, const T *&vh)
{
    const int kvh = h / p.group;
    const T *qh = p.q + sp.q0 * p.q_stride + (long long)h * D;
    kh = p.k + sp.k0 * p.k_stride + (long long)kvh * D;
    vh = p.v + sp.k0 * p.v_stride + (long long)kvh * D;
    load_tile<L, T, D, BM, THREADS>(sq, qh, p.q_stride, sp.m0, sp.lq);
    cp_async_commit();
    if (sp.n_begin < sp.n_end) {
        load_kv<L, T, D, BN, PAGED, THREADS>(sk, sv, p, kh, vh, sp.table, (int)sp.n_begin, sp.lk);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    if (ROPE) {
        rope_frequencies<D, THREADS>(inv_freq, p.rope_base);
        __syncthreads();
        rotate_tile<L, T, D, BM, THREADS>(sq, p.pos_q + sp.q0, sp.m0, sp.lq, p.halves, inv_freq);
    }
}

/* The keys query row i sees, [lo, hi), both within [0, lk]. */
template <typename T>
__device__ __forceinline__ void row_keys(const params<T> &p, const span &s, long long i, int &lo,
                                         int &hi)
{
    const long long h = p.causal && i + s.shift + 1 < s.lk ? i + s.shift + 1 : s.lk;
    const long long l = p.window ? i + s.shift - p.window + 1 : 0;
    hi = (int)(h < 0 ? 0 : h);
    lo = (int)(l < 0 ? 0 : l > s.lk ? s.lk : l);
}

/* Whether the BN keys from n0 are visible to every one of the block's BM
 * rows, so that the tile needs no mask. */
template <typename T, int BM, int BN>
__device__ __forceinline__ bool tile_whole(const params<T> &p, const span &s, long long n0)
{
    return n0 + BN <= s.lk && (!p.causal || n0 + BN - 1 <= s.m0 + s.shift) &&
           (!p.window || n0 > s.m0 + BM - 1 + s.shift - p.window);
}

/* One key tile's online softmax for a thread's two rows: S (scores of
 * keys n0 ..) scaled into log2 units and masked outside [lo, hi) unless
 * the tile is whole, the rows' maxima raised, O and the partial sums
 * rescaled, and S turned into P = exp2(S - max). The sums stay partial
 * (this thread's columns) until store_rows. */
template <int BN, int D>
__device__ __forceinline__ void softmax_tile(float (&s)[BN / 8][4], float (&acc)[D / 8][4],
                                             float (&row_max)[2], float (&row_sum)[2],
                                             const int (&lo)[2], const int (&hi)[2], bool whole,
                                             long long n0, float scale_log2)
{
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = e / 2;
            const int j = (int)n0 + n * 8 + 2 * t + e % 2;
            float x = s[n][e] * scale_log2;
            if (!whole && (j < lo[r] || j >= hi[r]))
                x = -INFINITY;
            s[n][e] = x;
        }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float m = row_max[r];
#pragma unroll
        for (int n = 0; n < BN / 8; n++)
            m = fmaxf(m, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        const float base = m == -INFINITY ? 0.0f : m; /* a row that has seen nothing */
        const float corr = exp2f(row_max[r] - base);
        row_max[r] = m;
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < BN / 8; n++) {
            s[n][2 * r] = exp2f(s[n][2 * r] - base);
            s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - base);
            sum += s[n][2 * r] + s[n][2 * r + 1];
        }
        row_sum[r] = row_sum[r] * corr + sum;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            acc[n][2 * r] *= corr;
            acc[n][2 * r + 1] *= corr;
        }
    }
}

/* P's 16 keys from 16 kk as an m16n8k16 A fragment (the accumulator of two
 * key columns is the A fragment of the next product). */
template <typename T, int BN>
__device__ __forceinline__ void p_fragment(unsigned (&a)[4], const float (&s)[BN / 8][4], int kk)
{
    a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

/* A thread's two rows (i0 and i0 + 8 of the sequence) of O and the LSE:
 * the row sums meet across the row's four threads first. A row that saw
 * no key is zeros, its LSE -inf. */
template <typename T, int D>
__device__ __forceinline__ void store_rows(const params<T> &p, const span &s, int h, int i0,
                                           const float (&acc)[D / 8][4], const float (&row_max)[2],
                                           const float (&row_sum)[2])
{
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = row_sum[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int i = i0 + 8 * r;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        if (i >= s.lq)
            continue;
        T *out = p.o + (s.q0 + i) * p.o_stride + (long long)h * D + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            const unsigned v = pack2<T>(acc[n][2 * r] * inv, acc[n][2 * r + 1] * inv);
            *reinterpret_cast<unsigned *>(out + n * 8) = v;
        }
        if (p.lse && t == 0)
            p.lse[(long long)h * p.lse_stride + s.q0 + i] =
                l > 0.0f ? row_max[r] * 0.6931471805599453f + logf(l) : -INFINITY;
    }
}

} // namespace attention
} // namespace weft_ops

#endif
