/*
 * rope.cuh - the RoPE kernel and its launch, apart from the launcher
 * (rope.cu), which says what it computes and why, so that bench/ops/ can
 * time other forms and launches of it side by side.
 */
#ifndef WEFT_OPS_ROPE_CUH
#define WEFT_OPS_ROPE_CUH

#include <math.h>

#include "ops/ops_cuda.cuh"

namespace weft_ops
{

template <typename T> struct rope_params {
    T *q, *k;
    size_t q_heads, q_stride, k_heads, k_stride, tokens, head_dim;
    size_t slices, heads_per_slice, chunks; /* chunks per head */
    const int32_t *positions;
    weft__rope_freq freq; /* base and scaling: rope_freq.h */
    bool halves;
};

/* Pair i's inverse frequency, in double as the host computes it. */
template <typename T>
__device__ __forceinline__ double inverse_frequency(const rope_params<T> &p, size_t i)
{
    return weft__rope_inverse_frequency(&p.freq, i);
}

/* (x, y) turned by the angle with sine sn and cosine cs. */
__device__ __forceinline__ void rotate(float &x, float &y, float sn, float cs)
{
    float a = x, b = y;
    x = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
    y = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
}

/* sin and cos of the angle pos * inv_freq, in double, as the host. */
__device__ __forceinline__ void pair_angle(int32_t pos, double inv_freq, float &sn, float &cs)
{
    double s, c;
    sincos((double)pos * inv_freq, &s, &c);
    sn = (float)s;
    cs = (float)c;
}

/* One chunk of one head: CP pairs. Split halves: V elements from each
 * half, pair m = (x[m], x[V + m]); interleaved: 2 CP consecutive
 * elements, pair m = (x[2m], x[2m + 1]). V = 1 is the element-by-element
 * path (CP = 1), held as fp32. 16-byte chunks are held as loaded and
 * converted only to turn (RAW): a bf16 head in flight then takes 8
 * registers, not 16; held as fp32 the kernel spills at two heads a step,
 * and is slower. */
template <typename T, int V, int CP, bool HALVES, bool RAW = true, bool STREAMED = false>
struct rope_chunk {
    static constexpr int N = HALVES ? 2 * V : 2 * CP;
    static constexpr bool AS_RAW = RAW && V > 1;
    float x[N];
    uint4 raw[HALVES ? 2 : 1];

    static __device__ __forceinline__ uint4 load16(const T *p)
    {
        const uint4 *v = reinterpret_cast<const uint4 *>(p);
        return STREAMED ? __ldcs(v) : *v;
    }

    static __device__ __forceinline__ void store16(T *p, uint4 x)
    {
        uint4 *v = reinterpret_cast<uint4 *>(p);
        if (STREAMED)
            __stcs(v, x);
        else
            *v = x;
    }

    __device__ __forceinline__ void load(const T *head, size_t first_pair, size_t half)
    {
        if (AS_RAW) {
            raw[0] = load16(head + (HALVES ? first_pair : 2 * first_pair));
            if (HALVES)
                raw[1] = load16(head + first_pair + half);
        } else if (HALVES) {
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
        if constexpr (AS_RAW) {
            float a[V], b[V];
            unpack<T, V>(a, raw[0]);
            if (HALVES)
                unpack<T, V>(b, raw[1]);
#pragma unroll
            for (int m = 0; m < CP; m++) {
                if (HALVES)
                    rotate(a[m], b[m], sn[m], cs[m]);
                else
                    rotate(a[2 * m], a[2 * m + 1], sn[m], cs[m]);
            }
            raw[0] = pack<T, V>(a);
            if (HALVES)
                raw[1] = pack<T, V>(b);
        } else {
#pragma unroll
            for (int m = 0; m < CP; m++) {
                if (HALVES)
                    rotate(x[m], x[V + m], sn[m], cs[m]);
                else
                    rotate(x[2 * m], x[2 * m + 1], sn[m], cs[m]);
            }
        }
    }

    __device__ __forceinline__ void store(T *head, size_t first_pair, size_t half) const
    {
        if (AS_RAW) {
            store16(head + (HALVES ? first_pair : 2 * first_pair), raw[0]);
            if (HALVES)
                store16(head + first_pair + half, raw[1]);
        } else if (HALVES) {
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

/* Heads up to this size keep their pairs' inverse frequencies in a table
 * in shared memory, filled once a block. */
enum : unsigned { ROPE_TABLE_PAIRS = 512 };

/*
 * How rope_kernel walks and computes: the library's choice, from which
 * other forms derive (bench/ops times them beside it).
 *   min_blocks  blocks an SM, as __launch_bounds__ takes it
 *   heads       heads a step, all loaded before any is stored, so that
 *               each thread has their loads in flight together (the
 *               compiler cannot move a load above a store that might
 *               alias it)
 *   raw         16-byte chunks held as loaded (rope_chunk)
 *   turn        false leaves the angles and turns out: the walk's loads
 *               and stores alone
 *   dealt       the heads dealt to the slices in turn - slice s takes
 *               heads s, s + slices, ... - so that a warp's slices of a
 *               token step through neighbouring heads together; false
 *               gives each slice a run of heads_per_slice heads. Dealt is
 *               faster in bf16 with many heads a token.
 *   early       the first step's loads issued before the angles are
 *               computed, so that they are in flight meanwhile
 *   streamed    loads and stores marked evict-first
 *   angle       the sine and cosine of a pair's angle
 *   slices      how many slices the heads take (see below)
 */
struct rope_tuning {
    static constexpr int min_blocks = 3, heads = 2;
    static constexpr bool raw = true, turn = true, dealt = true, early = false, streamed = false;

    static __device__ __forceinline__ void angle(int32_t pos, double inv_freq, float &sn, float &cs)
    {
        pair_angle(pos, inv_freq, sn, cs);
    }

    /* The slices of `all` heads of esize-byte elements, where one slice
     * has `items` work items and `fill` items give every SM's threads
     * enough: as many as leave each slice's angles turning 24 bytes (the
     * sine and cosine applied to 12 / esize heads), more where those are
     * too few to fill the GPU. Each slice pays the sines and cosines again,
     * but small work items even out the threads' shares, and a warp's
     * slices of a token walk neighbouring heads. 24 bytes an angle is
     * faster than the fewest slices, and than 16 bytes or fewer, whose
     * extra sines and cosines cost more than the evener shares gain. */
    static constexpr size_t angle_bytes = 24;

    static size_t slices(size_t all, size_t items, size_t fill, size_t esize)
    {
        return slices_turning(angle_bytes, all, items, fill, esize);
    }

    static size_t slices_turning(size_t bytes, size_t all, size_t items, size_t fill, size_t esize)
    {
        size_t by_angles = all / (bytes / (2 * esize)), by_items = (fill + items - 1) / items;
        return by_angles > by_items ? by_angles : by_items;
    }
};

/* CP pairs per chunk; V elements per access. TABLE: the inverse
 * frequencies come from the block's table (head_dim / 2 <=
 * ROPE_TABLE_PAIRS), each pow computed once a block instead of once a work
 * item, the same bits. */
template <typename T, int V, int CP, bool HALVES, bool TABLE, typename TUNE = rope_tuning>
__global__ void __launch_bounds__(256, TUNE::min_blocks) rope_kernel(rope_params<T> p)
{
    constexpr int HEADS = TUNE::heads;
    using chunk = rope_chunk<T, V, CP, HALVES, TUNE::raw, TUNE::streamed>;
    const size_t half = p.head_dim / 2, all = p.q_heads + p.k_heads;
    __shared__ double table[TABLE ? ROPE_TABLE_PAIRS : 1];
    if (TABLE) {
        for (unsigned i = threadIdx.x; i < half; i += blockDim.x)
            table[i] = inverse_frequency(p, i);
        __syncthreads();
    }
    for (chunk_walk w(p.tokens * p.slices, p.chunks); w.more(); w.next()) {
        size_t t = w.row / p.slices, slice = w.row % p.slices;
        size_t first_pair = w.chunk * CP;
        int32_t pos = p.positions[t];
        float sn[CP], cs[CP];
        auto angles = [&] {
#pragma unroll
            for (int m = 0; m < CP; m++)
                TUNE::angle(pos,
                            TABLE ? table[first_pair + m] : inverse_frequency(p, first_pair + m),
                            sn[m], cs[m]);
        };
        if (TUNE::turn && !TUNE::early)
            angles();

        /* the slice's heads: every slices-th, or a run of heads_per_slice */
        const size_t gap = TUNE::dealt ? p.slices : 1;
        size_t h = TUNE::dealt ? slice : slice * p.heads_per_slice;
        size_t end = TUNE::dealt ? all : h + p.heads_per_slice;
        if (end > all)
            end = all;
        for (bool first = true; h < end; h += HEADS * gap, first = false) {
            chunk c[HEADS];
            T *head[HEADS];
#pragma unroll
            for (int i = 0; i < HEADS; i++) {
                head[i] = h + i * gap < end ? head_at(p, t, h + i * gap) : nullptr;
                if (head[i])
                    c[i].load(head[i], first_pair, half);
            }
            if (TUNE::turn && TUNE::early && first)
                angles();
#pragma unroll
            for (int i = 0; i < HEADS; i++) {
                if (head[i]) {
                    if (TUNE::turn)
                        c[i].turn(sn, cs);
                    c[i].store(head[i], first_pair, half);
                }
            }
        }
    }
}

/* The launch of rope_kernel<T, V, CP, HALVES, TABLE, TUNE> over p's
 * tokens, in chunks of CP of a head's `pairs`. */
template <typename T, int V, int CP, bool HALVES, bool TABLE, typename TUNE = rope_tuning>
int launch_rope_chunks(cudaStream_t stream, rope_params<T> p, size_t pairs)
{
    const unsigned threads = 256;
    size_t all = p.q_heads + p.k_heads;
    p.chunks = pairs / CP;
    p.slices = TUNE::slices(all, p.tokens * p.chunks, (size_t)sm_count() * 2048, sizeof(T));
    if (p.slices > all)
        p.slices = all;
    p.heads_per_slice = (all + p.slices - 1) / p.slices;
    p.slices = (all + p.heads_per_slice - 1) / p.heads_per_slice;
    auto kernel = rope_kernel<T, V, CP, HALVES, TABLE, TUNE>;
    kernel<<<grid_for(kernel, p.tokens * p.slices * p.chunks, threads), threads, 0, stream>>>(p);
    return launched("weft_rope");
}

} // namespace weft_ops

#endif
