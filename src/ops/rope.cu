/*
 * rope.cu - rotary position embedding of Q and K on the GPU (rope.c holds
 * the checks and the host reference).
 *
 * Design: a work item is (token, chunk of pairs, slice of heads). Its
 * thread computes the chunk's angles once - pow and sincos in double, as
 * the host does, so positions in the hundreds of thousands keep fp32
 * accuracy - and applies them to every head of the slice, Q's heads then
 * K's, reading and writing each element once, in place. The double
 * precision work is paid once per (token, pair, slice) and shared by the
 * slice's heads; slices are only as many as it takes to give the GPU
 * enough threads when tokens are few. Consecutive threads take consecutive
 * chunks of a head, so each access of a warp is contiguous. The rotation
 * is rounded as on the host (no fused multiply-adds), so results match the
 * host's bit for bit whenever the double sine and cosine round alike.
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
    double base;
    bool halves;
};

/* (x, y) turned by the angle with sine sn and cosine cs. */
__device__ __forceinline__ void rotate(float &x, float &y, float sn, float cs)
{
    float a = x, b = y;
    x = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
    y = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
}

/* sin and cos of pair i's angle at position pos, in double, as the host. */
template <typename T>
__device__ __forceinline__ void pair_angle(const rope_params<T> &p, int32_t pos, size_t i,
                                           float &sn, float &cs)
{
    double inv_freq = pow(p.base, -2.0 * (double)i / (double)p.head_dim);
    double s, c;
    sincos((double)pos * inv_freq, &s, &c);
    sn = (float)s;
    cs = (float)c;
}

/* One chunk of one head: CP pairs, held as fp32. Split halves: V
 * elements from each half, pair m = (x[m], x[V + m]); interleaved: 2 CP
 * consecutive elements, pair m = (x[2m], x[2m + 1]). V = 1 is the
 * element-by-element path (CP = 1). */
template <typename T, int V, int CP, bool HALVES> struct rope_chunk {
    static constexpr int N = HALVES ? 2 * V : 2 * CP;
    float x[N];

    __device__ __forceinline__ void load(const T *head, size_t first_pair, size_t half)
    {
        if (HALVES) {
            const T *lo = head + first_pair;
            float a[V], b[V];
            load_vec<T, V>(a, lo);
            load_vec<T, V>(b, lo + half);
#pragma unroll
            for (int e = 0; e < V; e++) {
                x[e] = a[e];
                x[V + e] = b[e];
            }
        } else if (V > 1) {
            float a[2 * CP];
            load_vec<T, 2 * CP>(a, head + 2 * first_pair);
#pragma unroll
            for (int e = 0; e < 2 * CP; e++)
                x[e] = a[e];
        } else {
            x[0] = to_f32(head[2 * first_pair]);
            x[1] = to_f32(head[2 * first_pair + 1]);
        }
    }

    __device__ __forceinline__ void turn(const float (&sn)[CP], const float (&cs)[CP])
    {
#pragma unroll
        for (int m = 0; m < CP; m++) {
            if (HALVES)
                rotate(x[m], x[V + m], sn[m], cs[m]);
            else
                rotate(x[2 * m], x[2 * m + 1], sn[m], cs[m]);
        }
    }

    __device__ __forceinline__ void store(T *head, size_t first_pair, size_t half) const
    {
        if (HALVES) {
            T *lo = head + first_pair;
            float a[V], b[V];
#pragma unroll
            for (int e = 0; e < V; e++) {
                a[e] = x[e];
                b[e] = x[V + e];
            }
            store_vec<T, V>(lo, a);
            store_vec<T, V>(lo + half, b);
        } else if (V > 1) {
            float a[2 * CP];
#pragma unroll
            for (int e = 0; e < 2 * CP; e++)
                a[e] = x[e];
            store_vec<T, 2 * CP>(head + 2 * first_pair, a);
        } else {
            head[2 * first_pair] = from_f32<T>(x[0]);
            head[2 * first_pair + 1] = from_f32<T>(x[1]);
        }
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
 * might alias it). */
template <typename T, int V, int CP, bool HALVES>
__global__ void __launch_bounds__(256, 3) rope_kernel(rope_params<T> p)
{
    const size_t half = p.head_dim / 2, all = p.q_heads + p.k_heads;
    for (chunk_walk w(p.tokens * p.slices, p.chunks); w.more(); w.next()) {
        size_t t = w.row / p.slices, slice = w.row % p.slices;
        size_t first_pair = w.chunk * CP;
        float sn[CP], cs[CP];
#pragma unroll
        for (int m = 0; m < CP; m++)
            pair_angle(p, p.positions[t], first_pair + m, sn[m], cs[m]);

        size_t h = slice * p.heads_per_slice, end = h + p.heads_per_slice;
        if (end > all)
            end = all;
        for (; h < end; h += 2) {
            const bool two = h + 1 < end;
            rope_chunk<T, V, CP, HALVES> c0, c1;
            T *head0 = head_at(p, t, h), *head1 = two ? head_at(p, t, h + 1) : nullptr;
            c0.load(head0, first_pair, half);
            if (two)
                c1.load(head1, first_pair, half);
            c0.turn(sn, cs);
            c0.store(head0, first_pair, half);
            if (two) {
                c1.turn(sn, cs);
                c1.store(head1, first_pair, half);
            }
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
    auto kernel = rope_kernel<T, V, CP, HALVES>;
    kernel<<<grid_for(kernel, p.tokens * p.slices * p.chunks, threads), threads, 0, stream>>>(p);
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
    p.base = a->base;
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
