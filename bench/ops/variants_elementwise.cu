/*
 * variants_elementwise.cu - the elementwise operators' tuning variants
 * (bias+GELU+residual, SwiGLU, RoPE) that bench_ops.py times beside the
 * library's own kernels, and the empty kernel that small inputs are
 * measured against. Built into libweft_ops_bench.so with the row
 * operators' (variants_rows.cuh) and all of weft.
 *
 * bias+GELU+residual in a plain walk with libm's erfcf in place of the
 * library's activation, which is what the activation's own fit buys, and
 * with the erf fits of degree 7 and 5 (fit7, fit5), which is what the half
 * types' shorter one buys, and bf16's shorter still (fit3), and with the
 * fit's former ending (select); with two chunks a step (pairs), twice the
 * loads in flight a thread, and the library's kernel on its former grid of 8
 * blocks an SM (grid8: a second, partial wave where fewer stay resident),
 * and on tensor_walk, as the library ran it before row_walk (offsets);
 * SwiGLU on row_walk (rows); both on grids of a block a tile, as
 * torch.compile runs them (flat, tile2, tile4), on chunk_once everywhere
 * (once) and on the library's former grid of one wave (wave); and RoPE computing each pair's
 * inverse frequency in every work item (angles_each), at 4 blocks an SM (bounds4), with the fewest
 * slices of heads that fill the GPU and four times as many (fewest, fill4), with each angle turning
 * 16 or 32 bytes (angle16, angle32), holding its chunks as fp32 (floats), and four heads a step
 * (heads4, heads4_b2), each slice a run of heads (runs), loads first
 * (early), evict-first (streamed), angles by a shorter road (reduced,
 * early_reduced); and RoPE's bytes moved in place with no arithmetic (touch,
 * its ceiling, and walk_only, in RoPE's order).
 *
 * Each entry point returns a weft status; WEFT_EINVAL means the variant
 * does not apply to that shape (the script leaves it out).
 */
#include <string.h>

#include <type_traits>

#include "ops/gelu.cuh"
#include "ops/glu.cuh"
#include "ops/rope.cuh"

namespace weft_ops
{
namespace
{

__global__ void empty_kernel()
{
}

/* bias + GELU + residual in a plain grid-stride walk, the GELU libm's
 * erfcf (libm_erfc) or the erf form's fits of degree 7, 5 and 3 (fit7,
 * fit5, fit3: the library's for fp32, fp16 and bf16; fit3 run on bf16
 * alone), or the library's fit with the former ending: Phi(x)
 * taken as the tail or 1 - tail by the sign, times x (select). */
enum gelu_variant { GELU_LIBM, GELU_FIT7, GELU_FIT5, GELU_FIT3, GELU_SELECT };

template <gelu_fit FIT> __device__ __forceinline__ float gelu_erf_select(float x)
{
    const float tail = normal_tail<FIT>(fminf(fabsf(x), 16.0f));
    return times_gate(x, x < 0.0f ? tail : 1.0f - tail);
}

template <typename T, int V, gelu_variant G>
__global__ void gelu_walk_kernel(T *out, const T *in, const T *bias, const T *res, size_t rows,
                                 size_t cols)
{
    constexpr gelu_fit FIT = G == GELU_FIT7   ? GELU_FIT_F32
                             : G == GELU_FIT5 ? GELU_FIT_HALF
                                              : GELU_FIT_BF16;
    for (chunk_walk w(rows, cols / V); w.more(); w.next()) {
        size_t j = w.chunk * V, i = w.row * cols + j;
        float h[V], r[V], b[V];
        load_vec<T, V>(h, in + i);
        load_vec<T, V>(b, bias + j);
        load_vec<T, V>(r, res + i);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float x = h[k] + b[k];
            if (G == GELU_LIBM)
                h[k] = 0.5f * x * erfcf(-x * 0.70710678118654752f) + r[k];
            else if (G == GELU_SELECT)
                h[k] = gelu_erf_select<gelu_fit_for<T>()>(x) + r[k];
            else
                h[k] = gelu_erf_fit<FIT>(x) + r[k];
        }
        store_vec<T, V>(out + i, h);
    }
}

/*
 * The elementwise ops in torch.compile's shape: a grid of one tile a block,
 * as many blocks as tiles, where the library keeps one wave of blocks
 * stepping through the tensor. A tile is U x 256 chunks, each thread's U
 * chunks 256 apart, all their loads issued before any arithmetic (tile2,
 * tile4); flat is the library's own kernel with a thread a chunk, its walk
 * run once. The tensors are the script's: contiguous rows, under 2^32
 * elements.
 */
template <int U> __device__ __forceinline__ uint32_t tile_chunk(int u)
{
    return (blockIdx.x * U + u) * 256u + threadIdx.x;
}

template <typename T, int V, int U>
__global__ void __launch_bounds__(256)
    gelu_tile_kernel(T *out, const T *in, const T *bias, const T *res, uint32_t chunks,
                     uint32_t per_row)
{
    float h[U][V], b[U][V], r[U][V];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint32_t g = tile_chunk<U>(u);
        if (g < chunks) {
            load_vec<T, V>(h[u], in + g * V);
            load_vec<T, V>(b[u], bias + g % per_row * V);
            load_vec<T, V>(r[u], res + g * V);
        }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint32_t g = tile_chunk<U>(u);
        if (g < chunks) {
#pragma unroll
            for (int k = 0; k < V; k++)
                h[u][k] = gelu<T>(WEFT_GELU_ERF, h[u][k] + b[u][k]) + r[u][k];
            store_vec<T, V>(out + g * V, h[u]);
        }
    }
}

/* Blocks for one tile of U x 256 of `chunks` each, if they and the
 * elements they reach fit the tile kernels' 32-bit offsets (0 if not). */
template <int U> unsigned tile_blocks(size_t chunks, size_t elements)
{
    const size_t blocks = (chunks + 256 * U - 1) / (256 * U);
    return elements < ((size_t)1 << 32) && blocks < ((size_t)1 << 31) ? (unsigned)blocks : 0;
}

template <typename T>
int gelu_tile(cudaStream_t s, const char *variant, void *out, const void *in, const void *bias,
              const void *res, size_t rows, size_t cols)
{
    constexpr int V = vec16<T>();
    const size_t chunks = rows * cols / V;
    const gelu_params<T> p = {(T *)out, (const T *)in, (const T *)bias, (const T *)res, rows,
                              cols,     cols};
    if (cols % V != 0)
        return WEFT_EINVAL;
    if (strcmp(variant, "flat") == 0) {
        const size_t blocks = (chunks + 255) / 256;
        if (blocks >= ((size_t)1 << 31))
            return WEFT_EINVAL;
        bias_gelu_residual_kernel<T, V, WEFT_GELU_ERF, row_walk>
            <<<(unsigned)blocks, 256, 0, s>>>(p);
        return launched("gelu flat variant");
    }
    if (strcmp(variant, "once") == 0 || strcmp(variant, "wave") == 0) {
        if (strcmp(variant, "wave") == 0) {
            auto kernel = bias_gelu_residual_kernel<T, V, WEFT_GELU_ERF, row_walk>;
            kernel<<<grid_for(kernel, chunks, 256), 256, 0, s>>>(p);
            return launched("gelu wave variant");
        }
        if (!chunk_once::fits(rows, cols, cols, V, 256))
            return WEFT_EINVAL;
        bias_gelu_residual_kernel<T, V, WEFT_GELU_ERF, chunk_once>
            <<<chunk_once::grid(rows, cols, V, 256), 256, 0, s>>>(p);
        return launched("gelu once variant");
    }
    const bool four = strcmp(variant, "tile4") == 0;
    if (!four && strcmp(variant, "tile2") != 0)
        return WEFT_EINVAL;
    const unsigned blocks =
        four ? tile_blocks<4>(chunks, rows * cols) : tile_blocks<2>(chunks, rows * cols);
    if (blocks == 0)
        return WEFT_EINVAL;
    auto kernel = four ? gelu_tile_kernel<T, V, 4> : gelu_tile_kernel<T, V, 2>;
    kernel<<<blocks, 256, 0, s>>>((T *)out, (const T *)in, (const T *)bias, (const T *)res,
                                  (uint32_t)chunks, (uint32_t)(cols / V));
    return launched("gelu tile variant");
}

/* SwiGLU in tiles likewise: output chunk g of a row of per_row chunks
 * reads its gate at g + row * per_row chunks into the input, its up half
 * per_row chunks on. */
template <typename T, int V, int U>
__global__ void __launch_bounds__(256)
    glu_tile_kernel(T *out, const T *in, uint32_t chunks, uint32_t per_row)
{
    float x[U][V], y[U][V];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint32_t g = tile_chunk<U>(u);
        if (g < chunks) {
            const T *gate = in + (g + g / per_row * per_row) * V;
            load_vec<T, V>(x[u], gate);
            load_vec<T, V>(y[u], gate + per_row * V);
        }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint32_t g = tile_chunk<U>(u);
        if (g < chunks) {
#pragma unroll
            for (int k = 0; k < V; k++)
                x[u][k] = silu(x[u][k]) * y[u][k];
            store_vec<T, V>(out + g * V, x[u]);
        }
    }
}

template <typename T>
int glu_tile(cudaStream_t s, const char *variant, void *out, const void *in, size_t rows,
             size_t cols)
{
    constexpr int V = vec16<T>();
    const size_t chunks = rows * cols / V;
    const glu_params<T> p = {(T *)out, (const T *)in, rows, cols, 2 * cols, cols};
    if (strcmp(variant, "flat") == 0) {
        const size_t blocks = (chunks + 255) / 256;
        if (blocks >= ((size_t)1 << 31) ||
            !tensor_walk<uint32_t>::fits32(rows, cols, 2 * cols, V, blocks * 256))
            return WEFT_EINVAL;
        glu_kernel<T, V, WEFT_GLU_SWIGLU, tensor_walk<uint32_t>>
            <<<(unsigned)blocks, 256, 0, s>>>(p);
        return launched("glu flat variant");
    }
    if (strcmp(variant, "once") == 0 || strcmp(variant, "wave") == 0) {
        if (strcmp(variant, "wave") == 0) {
            auto kernel = glu_kernel<T, V, WEFT_GLU_SWIGLU, tensor_walk<uint32_t>>;
            const unsigned blocks = grid_for(kernel, chunks, 256);
            if (!tensor_walk<uint32_t>::fits32(rows, cols, 2 * cols, V, (size_t)blocks * 256))
                return WEFT_EINVAL;
            kernel<<<blocks, 256, 0, s>>>(p);
            return launched("glu wave variant");
        }
        if (!chunk_once::fits(rows, cols, 2 * cols, V, 256))
            return WEFT_EINVAL;
        glu_kernel<T, V, WEFT_GLU_SWIGLU, chunk_once>
            <<<chunk_once::grid(rows, cols, V, 256), 256, 0, s>>>(p);
        return launched("glu once variant");
    }
    const bool four = strcmp(variant, "tile4") == 0;
    if (!four && strcmp(variant, "tile2") != 0)
        return WEFT_EINVAL;
    const unsigned blocks =
        four ? tile_blocks<4>(chunks, 2 * rows * cols) : tile_blocks<2>(chunks, 2 * rows * cols);
    if (blocks == 0)
        return WEFT_EINVAL;
    auto kernel = four ? glu_tile_kernel<T, V, 4> : glu_tile_kernel<T, V, 2>;
    kernel<<<blocks, 256, 0, s>>>((T *)out, (const T *)in, (uint32_t)chunks, (uint32_t)(cols / V));
    return launched("glu tile variant");
}

template <typename T>
int gelu_walk(cudaStream_t s, const char *variant, void *out, const void *in, const void *bias,
              const void *res, size_t rows, size_t cols)
{
    constexpr int V = vec16<T>();
    if (strcmp(variant, "flat") == 0 || strcmp(variant, "once") == 0 ||
        strcmp(variant, "wave") == 0 || strncmp(variant, "tile", 4) == 0)
        return gelu_tile<T>(s, variant, out, in, bias, res, rows, cols);
    if (cols % V != 0 || (strcmp(variant, "fit3") == 0 && !std::is_same<T, __nv_bfloat16>::value))
        return WEFT_EINVAL;
    auto kernel = strcmp(variant, "fit7") == 0     ? gelu_walk_kernel<T, V, GELU_FIT7>
                  : strcmp(variant, "fit3") == 0   ? gelu_walk_kernel<T, V, GELU_FIT3>
                  : strcmp(variant, "fit5") == 0   ? gelu_walk_kernel<T, V, GELU_FIT5>
                  : strcmp(variant, "select") == 0 ? gelu_walk_kernel<T, V, GELU_SELECT>
                                                   : gelu_walk_kernel<T, V, GELU_LIBM>;
    kernel<<<grid_for(kernel, rows * cols / V, 256), 256, 0, s>>>(
        (T *)out, (const T *)in, (const T *)bias, (const T *)res, rows, cols);
    return launched("gelu walk variant");
}

/* bias + GELU (erf, the library's) + residual taking two chunks a step:
 * both chunks' loads are issued before either is computed, twice the
 * bytes in flight a thread of the library's one chunk a step. */
template <typename T, int V>
__global__ void __launch_bounds__(256)
    gelu_pairs_kernel(T *out, const T *in, const T *bias, const T *res, size_t rows, size_t cols)
{
    tensor_walk<uint32_t> w(rows, cols, cols, cols, V);
    while (w.more()) {
        tensor_walk<uint32_t> w2 = w;
        w2.next();
        const bool two = w2.more();
        float h[2][V], b[2][V], r[2][V];
        load_vec<T, V>(h[0], in + w.at);
        load_vec<T, V>(b[0], bias + w.col);
        load_vec<T, V>(r[0], res + w.at);
        if (two) {
            load_vec<T, V>(h[1], in + w2.at);
            load_vec<T, V>(b[1], bias + w2.col);
            load_vec<T, V>(r[1], res + w2.at);
        }
#pragma unroll
        for (int c = 0; c < 2; c++) {
            if (c == 1 && !two)
                break;
#pragma unroll
            for (int k = 0; k < V; k++)
                h[c][k] = gelu<T>(WEFT_GELU_ERF, h[c][k] + b[c][k]) + r[c][k];
            store_vec<T, V>(out + (c == 0 ? w.at : w2.at), h[c]);
        }
        w = w2;
        if (two)
            w.next();
    }
}

template <typename T>
int gelu_pairs(cudaStream_t s, void *out, const void *in, const void *bias, const void *res,
               size_t rows, size_t cols)
{
    constexpr int V = vec16<T>();
    auto kernel = gelu_pairs_kernel<T, V>;
    const unsigned blocks = grid_for(kernel, rows * cols / V, 256);
    if (cols % V != 0 || !tensor_walk<uint32_t>::fits32(rows, cols, cols, V, (size_t)blocks * 256))
        return WEFT_EINVAL;
    kernel<<<blocks, 256, 0, s>>>((T *)out, (const T *)in, (const T *)bias, (const T *)res, rows,
                                  cols);
    return launched("gelu pairs variant");
}

/* The library's bias + GELU (erf) + residual kernel on its former grid:
 * 8 blocks an SM, however many stay resident (grid8). */
template <typename T>
int gelu_grid8(cudaStream_t s, void *out, const void *in, const void *bias, const void *res,
               size_t rows, size_t cols)
{
    constexpr int V = vec16<T>();
    const size_t want = (rows * cols / V + 255) / 256, cap = (size_t)sm_count() * 8;
    const unsigned blocks = (unsigned)(want < cap ? want : cap);
    const gelu_params<T> p = {(T *)out, (const T *)in, (const T *)bias, (const T *)res, rows,
                              cols,     cols};
    if (cols % V != 0)
        return WEFT_EINVAL;
    bias_gelu_residual_kernel<T, V, WEFT_GELU_ERF, row_walk><<<blocks, 256, 0, s>>>(p);
    return launched("gelu grid8 variant");
}

/* The library's kernel and grid on tensor_walk, adds only and 32-bit
 * offsets, as the library ran it before row_walk (offsets). */
template <typename T>
int gelu_offsets(cudaStream_t s, void *out, const void *in, const void *bias, const void *res,
                 size_t rows, size_t cols)
{
    constexpr int V = vec16<T>();
    const gelu_params<T> p = {(T *)out, (const T *)in, (const T *)bias, (const T *)res, rows,
                              cols,     cols};
    auto kernel = bias_gelu_residual_kernel<T, V, WEFT_GELU_ERF, tensor_walk<uint32_t>>;
    const unsigned blocks = grid_for(kernel, rows * cols / V, 256);
    if (cols % V != 0 || !tensor_walk<uint32_t>::fits32(rows, cols, cols, V, (size_t)blocks * 256))
        return WEFT_EINVAL;
    kernel<<<blocks, 256, 0, s>>>(p);
    return launched("gelu offsets variant");
}

/* SwiGLU on row_walk, bias+GELU+residual's walk, where the library's
 * takes tensor_walk (rows). */
template <typename T>
int glu_variant(cudaStream_t s, const char *variant, void *out, const void *in, size_t rows,
                size_t cols, size_t in_stride, size_t out_stride)
{
    constexpr int V = vec16<T>();
    const glu_params<T> p = {(T *)out, (const T *)in, rows, cols, in_stride, out_stride};
    if (cols % V != 0 || in_stride % V != 0 || out_stride % V != 0 || !aligned16(out) ||
        !aligned16(in))
        return WEFT_EINVAL;
    if (strcmp(variant, "rows") != 0)
        return in_stride == 2 * cols && out_stride == cols
                   ? glu_tile<T>(s, variant, out, in, rows, cols)
                   : WEFT_EINVAL;
    auto kernel = glu_kernel<T, V, WEFT_GLU_SWIGLU, row_walk>;
    kernel<<<grid_for(kernel, rows * (cols / V), 256), 256, 0, s>>>(p);
    return launched("glu variant");
}

/* Every 16 bytes of p[0, n) read and written back in place, two a thread
 * in flight: the ceiling of an op that, as RoPE does, updates its tensors
 * in place (a copy reads one buffer and writes another). */
__global__ void __launch_bounds__(256) touch_kernel(uint4 *p, size_t n)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 2 * step) {
        uint4 a = __ldcs(p + i), b;
        if (i + step < n)
            b = __ldcs(p + i + step);
        __stcs(p + i, a);
        if (i + step < n)
            __stcs(p + i + step, b);
    }
}

int touch_in_place(cudaStream_t s, void *p, size_t bytes)
{
    size_t n = bytes / 16;
    touch_kernel<<<grid_for(touch_kernel, (n + 1) / 2, 256), 256, 0, s>>>((uint4 *)p, n);
    return launched("touch variant");
}

/* rope_tuning's angle by a shorter road: the angle, the same double as the
 * host's, reduced by pi/2 (exactly: k pi/2 in two parts, the first taken off
 * by one fused multiply-add) to r in about [-pi/4, pi/4], and sin r, cos r
 * by their Taylor series to r^11 and r^12 (off by under 1e-11 of the value),
 * each rounded to float once. Angles past 2^40 take pair_angle. */
__device__ __forceinline__ void pair_angle_reduced(int32_t pos, double inv_freq, float &sn,
                                                   float &cs)
{
    const double x = (double)pos * inv_freq;
    if (fabs(x) > 0x1p40) {
        pair_angle(pos, inv_freq, sn, cs);
        return;
    }
    const double pio2_hi = 1.5707963267948966, pio2_lo = 6.123233995736766e-17;
    const double k = rint(x * 0.6366197723675814);
    const double r = fma(-k, pio2_lo, fma(-k, pio2_hi, x)), r2 = r * r;
    double ps = -1.0 / 39916800;
    ps = fma(ps, r2, 1.0 / 362880);
    ps = fma(ps, r2, -1.0 / 5040);
    ps = fma(ps, r2, 1.0 / 120);
    ps = fma(ps, r2, -1.0 / 6);
    const double s = fma(r * r2, ps, r);
    double pc = 1.0 / 479001600;
    pc = fma(pc, r2, -1.0 / 3628800);
    pc = fma(pc, r2, 1.0 / 40320);
    pc = fma(pc, r2, -1.0 / 720);
    pc = fma(pc, r2, 1.0 / 24);
    pc = fma(pc, r2, -0.5);
    const double c = fma(r2, pc, 1.0);
    /* quadrant q: (sin, cos) of r + q pi/2 */
    const unsigned q = (unsigned)(long long)k & 3u;
    const double qs = q & 1 ? c : s, qc = q & 1 ? s : c;
    sn = (float)(q & 2 ? -qs : qs);
    cs = (float)((q + 1) & 2 ? -qc : qc);
}

/* RoPE's forms beside the library's (rope_tuning), each a change to it. */
struct rope_walk_only : rope_tuning {
    static constexpr bool turn = false;
};
struct rope_runs : rope_tuning {
    static constexpr bool dealt = false;
};
struct rope_early : rope_tuning {
    static constexpr bool early = true;
};
struct rope_streamed : rope_tuning {
    static constexpr bool streamed = true;
};
struct rope_reduced : rope_tuning {
    static __device__ __forceinline__ void angle(int32_t pos, double inv_freq, float &sn, float &cs)
    {
        pair_angle_reduced(pos, inv_freq, sn, cs);
    }
};
struct rope_early_reduced : rope_reduced {
    static constexpr bool early = true;
};
struct rope_fewest : rope_tuning {
    static size_t slices(size_t, size_t items, size_t fill, size_t)
    {
        return (fill + items - 1) / items;
    }
};
struct rope_fill4 : rope_tuning {
    static size_t slices(size_t, size_t items, size_t fill, size_t)
    {
        return 4 * ((fill + items - 1) / items);
    }
};
/* The library's slicing with each angle turning BYTES, not 24. */
template <size_t BYTES> struct rope_angle_bytes : rope_tuning {
    static size_t slices(size_t all, size_t items, size_t fill, size_t esize)
    {
        return slices_turning(BYTES, all, items, fill, esize);
    }
};
using rope_angle16 = rope_angle_bytes<16>;
using rope_angle32 = rope_angle_bytes<32>;
struct rope_bounds4 : rope_tuning {
    static constexpr int min_blocks = 4;
};
struct rope_floats : rope_tuning {
    static constexpr bool raw = false;
};
struct rope_heads4 : rope_tuning {
    static constexpr int heads = 4;
};
struct rope_heads4_b2 : rope_tuning {
    static constexpr int heads = 4, min_blocks = 2;
};

/* RoPE on aligned heads of the split-halves layout (the script's case) with
 * each work item computing its pairs' inverse frequencies, as the library
 * did before its table in shared memory (angles_each), at 4 blocks an SM,
 * not 3 (bounds4: the compiler spills), and with the fewest slices of heads
 * that fill the GPU, as before it sliced them by the bytes an angle turns,
 * and four times as many (fewest, fill4), and with each angle turning 16 or
 * 32 bytes, not 24 (angle16, angle32); with its chunks held as fp32 from the
 * load (floats: the library's form before it held them as loaded); and with
 * four heads' loads in flight a thread, not two, at 3 and at 2 blocks an SM
 * (heads4, heads4_b2); with each slice a run of heads, as before the library
 * dealt them (runs); with a step's loads in flight while the angles are
 * computed (early); with evict-first loads and stores (streamed); with its
 * angles by pair_angle_reduced (reduced, and early_reduced both). touch and
 * walk_only are no RoPE: Q and K read and written back unchanged, RoPE's
 * bytes at a copy's pace (touch) or in the library's walk, its loads and
 * stores without the angles (walk_only). */
template <typename T>
int rope_variant(cudaStream_t s, const char *variant, void *q, size_t q_heads, void *k,
                 size_t k_heads, size_t tokens, size_t head_dim, const int32_t *positions,
                 double base)
{
    constexpr int V = vec16<T>();
    rope_params<T> p = {};
    p.q = (T *)q;
    p.k = (T *)k;
    p.q_heads = q_heads;
    p.q_stride = q_heads * head_dim;
    p.k_heads = k_heads;
    p.k_stride = k_heads * head_dim;
    p.tokens = tokens;
    p.head_dim = head_dim;
    p.positions = positions;
    p.freq.base = base;
    p.freq.head_dim = head_dim;
    p.halves = true;
    if (head_dim % (2 * V) != 0 || !aligned16(q) || !aligned16(k))
        return WEFT_EINVAL;
    size_t pairs = head_dim / 2;
    if (strcmp(variant, "touch") == 0) {
        int rc = touch_in_place(s, q, tokens * q_heads * head_dim * sizeof(T));
        return rc ? rc : touch_in_place(s, k, tokens * k_heads * head_dim * sizeof(T));
    }
    if (strcmp(variant, "angles_each") == 0)
        return launch_rope_chunks<T, V, V, true, false>(s, p, pairs);
#define TUNED(name)                                                                                \
    if (strcmp(variant, #name) == 0)                                                               \
        return launch_rope_chunks<T, V, V, true, true, rope_##name>(s, p, pairs);
    TUNED(walk_only)
    TUNED(runs)
    TUNED(early)
    TUNED(streamed)
    TUNED(reduced)
    TUNED(early_reduced)
    TUNED(bounds4)
    TUNED(floats)
    TUNED(heads4)
    TUNED(heads4_b2)
    TUNED(fewest)
    TUNED(fill4)
    TUNED(angle16)
    TUNED(angle32)
#undef TUNED
    return WEFT_EINVAL;
}

} // namespace
} // namespace weft_ops

using namespace weft_ops;

extern "C" {

int weft_bench_empty(void *stream)
{
    empty_kernel<<<1, 1, 0, (cudaStream_t)stream>>>();
    return launched("empty kernel");
}

int weft_bench_gelu_pairs(void *stream, int dtype, void *out, const void *in, const void *bias,
                          const void *res, size_t rows, size_t cols)
{
    return by_dtype((weft_dtype)dtype, [&](auto t) {
        return gelu_pairs<decltype(t)>((cudaStream_t)stream, out, in, bias, res, rows, cols);
    });
}

int weft_bench_gelu_grid8(void *stream, int dtype, void *out, const void *in, const void *bias,
                          const void *res, size_t rows, size_t cols)
{
    return by_dtype((weft_dtype)dtype, [&](auto t) {
        return gelu_grid8<decltype(t)>((cudaStream_t)stream, out, in, bias, res, rows, cols);
    });
}

int weft_bench_gelu_offsets(void *stream, int dtype, void *out, const void *in, const void *bias,
                            const void *res, size_t rows, size_t cols)
{
    return by_dtype((weft_dtype)dtype, [&](auto t) {
        return gelu_offsets<decltype(t)>((cudaStream_t)stream, out, in, bias, res, rows, cols);
    });
}

int weft_bench_glu_variant(void *stream, int dtype, const char *variant, void *out, const void *in,
                           size_t rows, size_t cols, size_t in_stride, size_t out_stride)
{
    return by_dtype((weft_dtype)dtype, [&](auto t) {
        return glu_variant<decltype(t)>((cudaStream_t)stream, variant, out, in, rows, cols,
                                        in_stride, out_stride);
    });
}

int weft_bench_gelu_walk(void *stream, int dtype, const char *variant, void *out, const void *in,
                         const void *bias, const void *res, size_t rows, size_t cols)
{
    return by_dtype((weft_dtype)dtype, [&](auto t) {
        return gelu_walk<decltype(t)>((cudaStream_t)stream, variant, out, in, bias, res, rows,
                                      cols);
    });
}

int weft_bench_rope_variant(void *stream, int dtype, const char *variant, void *q, size_t q_heads,
                            void *k, size_t k_heads, size_t tokens, size_t head_dim,
                            const int32_t *positions, double base)
{
    return by_dtype((weft_dtype)dtype, [&](auto t) {
        return rope_variant<decltype(t)>((cudaStream_t)stream, variant, q, q_heads, k, k_heads,
                                         tokens, head_dim, positions, base);
    });
}
}
