/*
 * rope.cu - rotary position embedding of Q and K on the GPU (rope.c holds
 * the checks and the host reference).
 *
 * Design: a work item is (token, chunk of pairs, slice of heads). Its
 * thread computes the chunk's angles once and applies them to every head
 * of the slice, Q's heads then K's, reading and writing each element once,
 * in place. Slices are only as many as it takes to give the GPU enough
 * threads when tokens are few, so a small call is many short threads
 * rather than a few long ones. Consecutive threads take consecutive
 * chunks of a head, so each access of a warp is contiguous.
 *
 * Angles: the host forms pos * base^(-2i/d) in double and takes its sine
 * and cosine in double, since fp32 would lose 1e-2 radians at position
 * 1e5. Double sincos is long (and pow longer), which made a call of one
 * token a chain of microseconds. Here only the part that needs double is
 * done in double: the frequency, base^(-2i/d) / 2 pi, is 2^(i c) for the
 * chunk's first pair and one multiply by 2^c for each next one (c from
 * the host); the angle in turns is reduced to [-1/2, 1/2] in double; the
 * sine and cosine of that fraction come from the special function unit,
 * within 4e-7 (the tests allow 1e-5 of the row's largest element).
 *
 * Chunks: with 16-byte access, V elements of a head (V/2 interleaved
 * pairs), or V pairs of the split-halves layout (a vector from each half);
 * otherwise one pair, element by element.
 */
#include <math.h>

#include "ops/ops_cuda.cuh"

namespace weft_ops
{
namespace
{

template <typename T> struct rope_params {
    T *q, *k;
    size_t q_heads, q_stride, k_heads, k_stride, tokens, head_dim;
    size_t slices, heads_per_slice, chunks; /* chunks per head */
    const int32_t *positions;
    /* c = -2 log2(base) / head_dim: pair i turns 2^(i c) / 2 pi a position */
    double log2_ratio;
    double ratio; /* 2^c */
    bool halves;
};

/* (x, y) turned by the angle with sine sn and cosine cs. */
__device__ __forceinline__ void rotate(float &x, float &y, float sn, float cs)
{
    float a = x, b = y;
    x = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
    y = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
}

/* sin and cos of the angles of pairs first, first + 1, ... at position
 * pos (see the top of the file). */
template <typename T, int CP>
__device__ __forceinline__ void chunk_angles(const rope_params<T> &p, int32_t pos, size_t first,
                                             float (&sn)[CP], float (&cs)[CP])
{
    double freq = exp2((double)first * p.log2_ratio) * 0.15915494309189534; /* turns */
#pragma unroll
    for (int m = 0; m < CP; m++) {
        double turns = (double)pos * freq;
        float frac = (float)(turns - rint(turns));
        __sincosf(frac * 6.2831853071795865f, &sn[m], &cs[m]);
        freq *= p.ratio;
    }
}

/* One chunk of one head: CP pairs, held as loaded and converted to fp32
 * only to be turned, so that half types take half the registers while
 * the angles are worked out. Split halves: V elements from each half,
 * pair m = (lo[m], hi[m]); interleaved: 2 CP consecutive elements, pair
 * m = (lo[2m], lo[2m + 1]). V = 1 is the element-by-element path (CP = 1,
 * a pair as lo and hi in either layout). */
template <typename T, int V, int CP, bool HALVES> struct rope_chunk {
    static constexpr bool SPLIT = HALVES || V == 1; /* a pair is (lo[m], hi[m]) */
    static constexpr int W = SPLIT ? V : 2 * CP;    /* elements per access */
    vec<T, W> lo, hi;

    __device__ __forceinline__ static const vec<T, W> *at(const T *p)
    {
        return reinterpret_cast<const vec<T, W> *>(p);
    }

    __device__ __forceinline__ void load(const T *head, size_t first_pair, size_t half)
    {
        if (HALVES) {
            lo = *at(head + first_pair);
            hi = *at(head + first_pair + half);
        } else if (V == 1) {
            lo = *at(head + 2 * first_pair);
            hi = *at(head + 2 * first_pair + 1);
        } else {
            lo = *at(head + 2 * first_pair);
        }
    }

    __device__ __forceinline__ void turn(const float (&sn)[CP], const float (&cs)[CP])
    {
        float a[W], b[W];
        load_vec<T, W>(a, lo.e);
        if (SPLIT)
            load_vec<T, W>(b, hi.e);
#pragma unroll
        for (int m = 0; m < CP; m++) {
            if (SPLIT)
                rotate(a[m], b[m], sn[m], cs[m]);
            else
                rotate(a[2 * m], a[2 * m + 1], sn[m], cs[m]);
        }
        store_vec<T, W>(lo.e, a);
        if (SPLIT)
            store_vec<T, W>(hi.e, b);
    }

    __device__ __forceinline__ void store(T *head, size_t first_pair, size_t half) const
    {
        T *p = head + (HALVES ? first_pair : 2 * first_pair);
        *reinterpret_cast<vec<T, W> *>(p) = lo;
        if (SPLIT)
            *reinterpret_cast<vec<T, W> *>(p + (HALVES ? half : 1)) = hi;
    }
};

/* Head h of token t: Q's heads first, then K's. */
template <typename T>
__device__ __forceinline__ T *head_at(const rope_params<T> &p, size_t t, size_t h)
{
    return h < p.q_heads ? p.q + t * p.q_stride + h * p.head_dim
                         : p.k + t * p.k_stride + (h - p.q_heads) * p.head_dim;
}

/* CP pairs per chunk; V elements per access. Two heads a step, both
 * loaded before either is stored, so that each thread has two heads'
 * loads in flight (the compiler cannot move a load above a store that
 * might alias it). The first head is loaded before the angles are worked
 * out, so that a short call (a head a thread) waits for memory and the
 * arithmetic at once rather than one after the other; a second one would
 * hold too many registers meanwhile. */
template <typename T, int V, int CP, bool HALVES>
__global__ void __launch_bounds__(256, 3) rope_kernel(rope_params<T> p)
{
    const size_t half = p.head_dim / 2, all = p.q_heads + p.k_heads;
    for (chunk_walk w(p.tokens * p.slices, p.chunks); w.more(); w.next()) {
        size_t t = w.row / p.slices, slice = w.row % p.slices;
        size_t first_pair = w.chunk * CP;
        /* every slice has a head: slices = ceil(all / heads_per_slice) */
        size_t h = slice * p.heads_per_slice, end = h + p.heads_per_slice;
        if (end > all)
            end = all;

        rope_chunk<T, V, CP, HALVES> c0, c1;
        bool two = h + 1 < end;
        T *head0 = head_at(p, t, h), *head1 = two ? head_at(p, t, h + 1) : nullptr;
        c0.load(head0, first_pair, half);
        float sn[CP], cs[CP];
        chunk_angles<T, CP>(p, p.positions[t], first_pair, sn, cs);
        for (;;) {
            if (two)
                c1.load(head1, first_pair, half);
            c0.turn(sn, cs);
            c0.store(head0, first_pair, half);
            if (two) {
                c1.turn(sn, cs);
                c1.store(head1, first_pair, half);
            }
            if ((h += 2) >= end)
                break;
            two = h + 1 < end;
            head0 = head_at(p, t, h);
            head1 = two ? head_at(p, t, h + 1) : nullptr;
            c0.load(head0, first_pair, half);
        }
    }
}

template <typename T, int V, int CP, bool HALVES>
int launch_chunks(cudaStream_t stream, rope_params<T> p, size_t pairs)
{
    const unsigned threads = 256;
    size_t all = p.q_heads + p.k_heads;
    p.chunks = pairs / CP;
    /* Enough items for every SM's threads, each slice as many heads as
     * that allows: the angles are computed once per slice. */
    size_t items = p.tokens * p.chunks, want = (size_t)sm_count() * 2048;
    p.slices = items >= want ? 1 : (want + items - 1) / items;
    if (p.slices > all)
        p.slices = all;
    p.heads_per_slice = (all + p.slices - 1) / p.slices;
    p.slices = (all + p.heads_per_slice - 1) / p.heads_per_slice;
    rope_kernel<T, V, CP, HALVES>
        <<<grid_for(p.tokens * p.slices * p.chunks, threads, 8), threads, 0, stream>>>(p);
    return launched("weft_rope");
}

template <typename T> int launch(cudaStream_t stream, const weft__rope_args *a)
{
    rope_params<T> p = {};
    p.q = (T *)a->q;
    p.k = (T *)a->k;
    p.q_heads = a->q_heads;
    p.q_stride = a->q_stride;
    p.k_heads = a->k_heads;
    p.k_stride = a->k_stride;
    p.tokens = a->tokens;
    p.head_dim = a->head_dim;
    p.positions = a->positions;
    p.log2_ratio = -2.0 * log2(a->base) / (double)a->head_dim;
    p.ratio = exp2(p.log2_ratio);
    p.halves = a->layout == WEFT_ROPE_HALVES;

    constexpr int V = vec16<T>();
    size_t pairs = a->head_dim / 2;
    /* every head's chunks 16-byte aligned: the pointers, both strides and
     * the head (or half-head) length */
    size_t span = p.halves ? pairs : a->head_dim;
    bool vec = aligned16(a->q) && aligned16(a->k) && a->q_stride % V == 0 &&
               (a->k == NULL || a->k_stride % V == 0) && a->head_dim % V == 0 && span % V == 0;

    if (vec && p.halves)
        return launch_chunks<T, V, V, true>(stream, p, pairs);
    if (vec)
        return launch_chunks<T, V, V / 2, false>(stream, p, pairs);
    if (p.halves)
        return launch_chunks<T, 1, 1, true>(stream, p, pairs);
    return launch_chunks<T, 1, 1, false>(stream, p, pairs);
}

} // namespace
} // namespace weft_ops

extern "C" int weft__rope_cuda(void *stream, const weft__rope_args *a)
{
    return weft_ops::by_dtype(
        a->dtype, [&](auto t) { return weft_ops::launch<decltype(t)>((cudaStream_t)stream, a); });
}
