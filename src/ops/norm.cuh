/*
 * norm.cuh - what the LayerNorm/RMSNorm kernels share (their parameters,
 * the statistics' finish), and the kernels for rows not held in
 * registers: staged in shared memory (aligned rows too long to hold) and
 * in register tiles (unaligned tensors, longer rows), with the register
 * kernel's launch by plan. The held kernels, the main path, are
 * norm_held.cuh's. RMSNorm into FP8 (weft_rmsnorm_fp8) instantiates each
 * kernel again with norm_fp8_params, its own output after RMSNorm's
 * statistics. Apart from the launcher (norm.cu), which says what
 * they compute and why, so that bench/ops/ can time other plans of the
 * same kernels side by side.
 */
#ifndef WEFT_OPS_NORM_CUH
#define WEFT_OPS_NORM_CUH

#include "ops/quantize.cuh"
#include "ops/rows.cuh"

namespace weft_ops
{

template <typename T> struct norm_params {
    T *out, *sum_out;
    const T *in, *gelu_bias, *residual, *weight, *bias;
    size_t rows, cols, stride;
    float eps;
    bool rms, gelu;
    weft_gelu_form form;
};

/* RMSNorm into FP8 (weft_rmsnorm_fp8): norm_params (out unused) and, in
 * its place, rows of q_type q_stride apart with a scale a row; q_whole
 * when q and q_stride allow a vector's codes as one store. A type of its
 * own, so that the kernels of the other norms keep their parameters and
 * their code. */
template <typename T> struct norm_fp8_params : norm_params<T> {
    __nv_fp8_storage_t *q;
    float *scales;
    size_t q_stride;
    fp8_type q_type;
    bool q_whole;
};

/* Whether P is norm_fp8_params: a kernel writing FP8. */
template <typename P> struct writes_fp8 : std::false_type {
};
template <typename T> struct writes_fp8<norm_fp8_params<T>> : std::true_type {
};

/* The codes of the first n of V values (a normalized row rounded to T) at
 * q, each divided by scale (quantize.cuh): one store of V bytes when
 * n == V and `whole`, else a byte each. */
template <int V>
__device__ __forceinline__ void store_codes(__nv_fp8_storage_t *q, const float (&y)[V], int n,
                                            float scale, fp8_type type, bool whole)
{
    vec<__nv_fp8_storage_t, V> c;
#pragma unroll
    for (int e = 0; e < V; e++)
        c.e[e] = fp8_code(y[e], scale, type);
    if (n == V && whole) {
        *reinterpret_cast<vec<__nv_fp8_storage_t, V> *>(q) = c;
        return;
    }
#pragma unroll
    for (int e = 0; e < V; e++)
        if (e < n)
            q[e] = c.e[e];
}

/* The statistics' finish, with a reciprocal in place of each division
 * (within the tests' bounds, and instructions fewer a row). LayerNorm in
 * the register-tile and staged kernels: the host's corrected two-pass
 * algorithm (norm.c), the first mean corrected by the deviations' sum, and
 * 1 / sqrt(variance + eps) (the held kernels merge moments instead: one
 * reduction, not two); RMSNorm: 1 / sqrt(mean square + eps). */
__device__ __forceinline__ float layer_rstd(float &mean, sum2 dev, float inv_n, float eps)
{
    mean += dev.a * inv_n;
    float var = (dev.b - dev.a * dev.a * inv_n) * inv_n;
    return rsqrtf(fmaxf(var, 0.0f) + eps);
}
__device__ __forceinline__ float rms_rstd(float mean_square, float eps)
{
    return rsqrtf(mean_square + eps);
}

/* acc plus x's square (RMSNorm) or x, each rounding spelled out: a choice
 * made at run time is otherwise the compiler's to contract into an fma or
 * not, and it decides per kernel, so weft_rmsnorm_fp8's statistics would
 * not be those of the weft_rmsnorm call it stands for. */
__device__ __forceinline__ float accumulate(float acc, float x, bool squares)
{
    return squares ? __fmaf_rn(x, x, acc) : __fadd_rn(acc, x);
}

/* s for column j from in (h), the residual (r) and the GELU bias (g). */
template <typename T>
__device__ __forceinline__ float form_sum(const norm_params<T> &p, float h, float r, float g)
{
    if (p.gelu) {
        float y = gelu<T>(p.form, p.gelu_bias ? h + g : h);
        return round_to<T>(p.residual ? y + r : y);
    }
    return p.residual ? round_to<T>(h + r) : h;
}

/* Vector k of tile t into x[k] (as s); elements past the row are 0. */
template <typename T, int V>
__device__ __forceinline__ void load_sums(const norm_params<T> &p, const row_place &at, size_t t,
                                          int k, float (&x)[V])
{
    size_t j = elem_at<V>(at, t, k), i = at.row * p.stride + j;
    if (V > 1 && j + V <= p.cols) {
        float h[V], r[V], g[V];
        load_vec<T, V>(h, p.in + i);
        if (p.residual)
            load_vec<T, V>(r, p.residual + i);
        if (p.gelu && p.gelu_bias)
            load_vec<T, V>(g, p.gelu_bias + j);
#pragma unroll
        for (int e = 0; e < V; e++)
            x[e] = form_sum(p, h[e], r[e], g[e]);
        return;
    }
#pragma unroll
    for (int e = 0; e < V; e++) {
        x[e] = 0.0f;
        if (j + e < p.cols) {
            float r = p.residual ? to_f32(p.residual[i + e]) : 0.0f;
            float g = p.gelu && p.gelu_bias ? to_f32(p.gelu_bias[j + e]) : 0.0f;
            x[e] = form_sum(p, to_f32(p.in[i + e]), r, g);
        }
    }
}

/* Writes vector k of tile t: s to sum_out, the normalized value to out. */
template <typename T, int V>
__device__ __forceinline__ void store_row(const norm_params<T> &p, const row_place &at, size_t t,
                                          int k, const float (&x)[V], float mean, float rstd)
{
    size_t j = elem_at<V>(at, t, k), i = at.row * p.stride + j;
    float y[V], w[V], b[V];
    bool whole = V > 1 && j + V <= p.cols;

    if (whole) {
        if (p.weight)
            load_vec<T, V>(w, p.weight + j);
        if (p.bias)
            load_vec<T, V>(b, p.bias + j);
    } else {
#pragma unroll
        for (int e = 0; e < V; e++) {
            w[e] = p.weight && j + e < p.cols ? to_f32(p.weight[j + e]) : 1.0f;
            b[e] = p.bias && j + e < p.cols ? to_f32(p.bias[j + e]) : 0.0f;
        }
    }
#pragma unroll
    for (int e = 0; e < V; e++) {
        /* the host's roundings: (s - mean) * rstd, times w, plus b */
        float v = __fmul_rn(x[e] - mean, rstd);
        if (p.weight)
            v = __fmul_rn(v, w[e]);
        if (p.bias)
            v = __fadd_rn(v, b[e]);
        y[e] = v;
    }
    if (whole) {
        if (p.sum_out)
            store_vec<T, V>(p.sum_out + i, x);
        store_vec<T, V>(p.out + i, y);
        return;
    }
#pragma unroll
    for (int e = 0; e < V; e++) {
        if (j + e < p.cols) {
            if (p.sum_out)
                p.sum_out[i + e] = from_f32<T>(x[e]);
            p.out[i + e] = from_f32<T>(y[e]);
        }
    }
}

/* RMSNorm's normalized values of the V sums x at column j with their
 * roundings as store_row's ((s - mean) * rstd, times w: RMSNorm has no
 * bias), rounded to T: what weft_rmsnorm writes and weft_quantize_fp8
 * reads back. The register and staged kernels' FP8 output. */
template <typename T, int V>
__device__ __forceinline__ void rms_rounded(const norm_params<T> &p, size_t j, const float (&x)[V],
                                            float mean, float rstd, float (&y)[V])
{
    float w[V];
    if (p.weight && V > 1 && j + V <= p.cols) {
        load_vec<T, V>(w, p.weight + j);
    } else {
#pragma unroll
        for (int e = 0; e < V; e++)
            w[e] = p.weight && j + e < p.cols ? to_f32(p.weight[j + e]) : 1.0f;
    }
#pragma unroll
    for (int e = 0; e < V; e++) {
        float v = __fmul_rn(x[e] - mean, rstd);
        if (p.weight)
            v = __fmul_rn(v, w[e]);
        y[e] = round_to<T>(v);
    }
}

/* The largest magnitude of vector k of tile t's rounded values, and amax. */
template <typename T, int V>
__device__ __forceinline__ float rounded_amax(const norm_params<T> &p, const row_place &at,
                                              size_t t, int k, const float (&x)[V], float mean,
                                              float rstd, float amax)
{
    size_t j = elem_at<V>(at, t, k);
    float y[V];
    rms_rounded<T, V>(p, j, x, mean, rstd, y);
#pragma unroll
    for (int e = 0; e < V; e++)
        if (j + e < p.cols)
            amax = fmaxf(amax, fabsf(y[e]));
    return amax;
}

/* Writes vector k of tile t in FP8: s to sum_out, the rounded values'
 * codes, over the row's scale, to q. */
template <typename T, int V>
__device__ __forceinline__ void store_row_fp8(const norm_fp8_params<T> &p, const row_place &at,
                                              size_t t, int k, const float (&x)[V], float mean,
                                              float rstd, float scale)
{
    size_t j = elem_at<V>(at, t, k);
    int n = part_of<V>(j, p.cols);
    float y[V];

    if (n == 0)
        return;
    rms_rounded<T, V>(p, j, x, mean, rstd, y);
    if (p.sum_out)
        store_part<T, V>(p.sum_out + at.row * p.stride + j, x, n);
    store_codes<V>(p.q + at.row * p.q_stride + j, y, n, scale, p.q_type, p.q_whole);
}

/* The register kernel: VPT vectors of V elements a thread, in registers
 * as fp32; `tiles` > 1 makes it loop over tiles, reading each again per
 * pass. P norm_fp8_params: RMSNorm into FP8 (weft_rmsnorm_fp8), the
 * statistics as RMSNorm's, then a pass for the row's largest magnitude
 * and one that writes (sum_out there, each vector's last read of in and
 * the residual, which it may be). */
template <typename T, int V, int VPT, typename P = norm_params<T>>
__global__ void __launch_bounds__(512, 2)
    norm_kernel(P p, size_t row0, unsigned cluster, size_t tiles)
{
    start_as_dependent(); /* launched as one (launch.cuh) */
    __shared__ reduce_scratch<float> s1;
    __shared__ reduce_scratch<sum2> s2;
    const row_place at = place_row<V>(row0, cluster, tiles, VPT);
    if (at.row >= p.rows) /* only whole idle warps (a warp per row) */
        return;
    const bool once = tiles == 1; /* held, read once */
    const float inv_n = 1.0f / (float)p.cols;
    float x[VPT][V];

    if (once) {
#pragma unroll
        for (int k = 0; k < VPT; k++)
            load_sums<T, V>(p, at, at.first, k, x[k]);
    }

    /* The mean (or, for RMSNorm, the mean square). */
    float acc = 0.0f;
    for (size_t t = at.first; t < at.first + tiles; t++) {
#pragma unroll
        for (int k = 0; k < VPT; k++) {
            if (!once)
                load_sums<T, V>(p, at, t, k, x[k]);
#pragma unroll
            for (int e = 0; e < V; e++)
                acc = accumulate(acc, x[k][e], p.rms);
        }
    }
    float mean = row_reduce(acc, op_sum(), s1, cluster) * inv_n, rstd;

    if (p.rms) {
        rstd = rms_rstd(mean, p.eps);
        mean = 0.0f;
    } else {
        /* Deviations and their squares; past the row's end s is 0 but its
         * deviation is not, so those elements are left out by index. */
        sum2 dev = {0.0f, 0.0f};
        for (size_t t = at.first; t < at.first + tiles; t++) {
#pragma unroll
            for (int k = 0; k < VPT; k++) {
                if (!once)
                    load_sums<T, V>(p, at, t, k, x[k]);
                size_t j = elem_at<V>(at, t, k);
#pragma unroll
                for (int e = 0; e < V; e++) {
                    if (j + e < p.cols) {
                        float d = x[k][e] - mean;
                        dev.a += d;
                        dev.b += d * d;
                    }
                }
            }
        }
        dev = row_reduce(dev, op_sum(), s2, cluster);
        rstd = layer_rstd(mean, dev, inv_n, p.eps);
    }

    if constexpr (writes_fp8<P>::value) {
        float amax = 0.0f;
        for (size_t t = at.first; t < at.first + tiles; t++) {
#pragma unroll
            for (int k = 0; k < VPT; k++) {
                if (!once)
                    load_sums<T, V>(p, at, t, k, x[k]);
                amax = rounded_amax<T, V>(p, at, t, k, x[k], mean, rstd, amax);
            }
        }
        /* s1 is free again: the statistics' reduction waited for its readers */
        const float scale = fp8_scale(row_reduce(amax, op_max(), s1, cluster), p.q_type);
        if (at.tid == 0 && at.rank == 0)
            p.scales[at.row] = scale;
        for (size_t t = at.first; t < at.first + tiles; t++) {
#pragma unroll
            for (int k = 0; k < VPT; k++) {
                if (!once)
                    load_sums<T, V>(p, at, t, k, x[k]);
                store_row_fp8<T, V>(p, at, t, k, x[k], mean, rstd, scale);
            }
        }
    } else {
        for (size_t t = at.first; t < at.first + tiles; t++) {
#pragma unroll
            for (int k = 0; k < VPT; k++) {
                if (!once)
                    load_sums<T, V>(p, at, t, k, x[k]);
                store_row<T, V>(p, at, t, k, x[k], mean, rstd);
            }
        }
    }
}

/* The staged kernel's FP8 output, from the row's sums in in_s (this
 * thread's vectors from `mine`, `step` apart, of the block's segment of
 * seg elements from column first): the largest magnitude of the rounded
 * values (s1 is free again), the scale, then sum_out and the codes. */
template <typename T>
__device__ __forceinline__ void staged_fp8_out(const norm_fp8_params<T> &p, const row_place &at,
                                               const T *in_s, size_t first, size_t seg, size_t mine,
                                               size_t step, float mean, float rstd,
                                               reduce_scratch<float> &s1, unsigned cluster)
{
    constexpr int V = vec16<T>();
    float amax = 0.0f;
    for (size_t l = mine; l < seg; l += step) {
        int m = part_of<V>(first + l, p.cols);
        if (m == 0)
            break;
        float x[V], y[V];
        load_part<T, V>(x, in_s + l, m);
        rms_rounded<T, V>(p, first + l, x, mean, rstd, y);
#pragma unroll
        for (int e = 0; e < V; e++)
            if (e < m)
                amax = fmaxf(amax, fabsf(y[e]));
    }
    const float scale = fp8_scale(row_reduce(amax, op_max(), s1, cluster), p.q_type);
    if (at.tid == 0 && at.rank == 0)
        p.scales[at.row] = scale;
    T *sum_g = p.sum_out ? p.sum_out + at.row * p.stride : nullptr;
    __nv_fp8_storage_t *q = p.q + at.row * p.q_stride;
    for (size_t l = mine; l < seg; l += step) {
        size_t j = first + l;
        int m = part_of<V>(j, p.cols);
        if (m == 0)
            break;
        float x[V], y[V];
        load_part<T, V>(x, in_s + l, m);
        rms_rounded<T, V>(p, j, x, mean, rstd, y);
        if (sum_g)
            store_part<T, V>(sum_g + j, x, m);
        store_codes<V>(q + j, y, m, scale, p.q_type, p.q_whole);
    }
}

/*
 * The staged kernel (rows.cuh): the block's part of the row - in, and the
 * residual when there is one - is copied to shared memory with cp.async,
 * s is formed there and written back over in (s is rounded to the dtype,
 * so it fits), and the statistics and the output read it from there.
 * vpt vectors of V elements a thread, at run time. GELU is a template
 * parameter, so that the plain norms do not pay its registers; so is
 * RMSNorm into FP8 (P, as norm_kernel's).
 */
template <typename T, bool GELU, typename P = norm_params<T>>
__global__ void __launch_bounds__(512)
    norm_staged_kernel(P p, size_t row0, unsigned cluster, size_t vpt)
{
    start_as_dependent(); /* launched as one (launch.cuh) */
    constexpr int V = vec16<T>();
    __shared__ reduce_scratch<float> s1;
    __shared__ reduce_scratch<sum2> s2;
    const row_place at = place_row<V>(row0, cluster, 1, (unsigned)vpt);
    if (at.row >= p.rows) /* only whole idle warps (a warp per row) */
        return;
    const size_t seg = at.tile, first = (size_t)at.rank * seg, step = (size_t)blockDim.x * V;
    const size_t mine = (size_t)threadIdx.x * V; /* this thread's first vector in the segment */
    const size_t buffers = p.residual ? 2 : 1;
    T *in_s = reinterpret_cast<T *>(staged_smem()) + threadIdx.y * seg * buffers;
    T *res_s = in_s + seg;
    const T *in_g = p.in + at.row * p.stride;
    const T *res_g = p.residual ? p.residual + at.row * p.stride : nullptr;
    const float inv_n = 1.0f / (float)p.cols;

    for (size_t l = mine; l < seg; l += step) {
        int m = part_of<V>(first + l, p.cols);
        if (m == 0)
            break;
        stage_part<T, V>(in_s + l, in_g + first + l, m);
        if (res_g)
            stage_part<T, V>(res_s + l, res_g + first + l, m);
    }
    copies_landed();

    /* s, in place of in; the mean (or, for RMSNorm, the mean square). */
    float acc = 0.0f;
    for (size_t l = mine; l < seg; l += step) {
        int m = part_of<V>(first + l, p.cols);
        if (m == 0)
            break;
        float h[V], r[V] = {}, g[V] = {};
        load_part<T, V>(h, in_s + l, m);
        if (res_g)
            load_part<T, V>(r, res_s + l, m);
        if (GELU && p.gelu_bias)
            load_part<T, V>(g, p.gelu_bias + first + l, m);
#pragma unroll
        for (int e = 0; e < V; e++) {
            if (GELU)
                h[e] = gelu<T>(p.form, p.gelu_bias ? h[e] + g[e] : h[e]);
            if (GELU || res_g)
                h[e] = round_to<T>(res_g ? h[e] + r[e] : h[e]);
            if (e < m)
                acc = accumulate(acc, h[e], p.rms);
        }
        if (res_g || GELU)
            store_part<T, V>(in_s + l, h, m);
    }
    float mean = row_reduce(acc, op_sum(), s1, cluster) * inv_n, rstd;

    if (p.rms) {
        rstd = rms_rstd(mean, p.eps);
        mean = 0.0f;
    } else {
        sum2 dev = {0.0f, 0.0f};
        for (size_t l = mine; l < seg; l += step) {
            int m = part_of<V>(first + l, p.cols);
            if (m == 0)
                break;
            float x[V];
            load_part<T, V>(x, in_s + l, m);
#pragma unroll
            for (int e = 0; e < V; e++) {
                if (e < m) {
                    float d = x[e] - mean;
                    dev.a += d;
                    dev.b += d * d;
                }
            }
        }
        dev = row_reduce(dev, op_sum(), s2, cluster);
        rstd = layer_rstd(mean, dev, inv_n, p.eps);
    }

    if constexpr (writes_fp8<P>::value) {
        staged_fp8_out<T>(p, at, in_s, first, seg, mine, step, mean, rstd, s1, cluster);
    } else {
        T *out_g = p.out + at.row * p.stride;
        T *sum_g = p.sum_out ? p.sum_out + at.row * p.stride : nullptr;
        for (size_t l = mine; l < seg; l += step) {
            size_t j = first + l;
            int m = part_of<V>(j, p.cols);
            if (m == 0)
                break;
            float x[V], w[V], b[V], y[V];
            load_part<T, V>(x, in_s + l, m);
            if (p.weight)
                load_part<T, V>(w, p.weight + j, m);
            if (p.bias)
                load_part<T, V>(b, p.bias + j, m);
#pragma unroll
            for (int e = 0; e < V; e++) {
                float v = __fmul_rn(x[e] - mean, rstd);
                if (p.weight)
                    v = __fmul_rn(v, w[e]);
                if (p.bias)
                    v = __fadd_rn(v, b[e]);
                y[e] = v;
            }
            if (sum_g)
                store_part<T, V>(sum_g + j, x, m);
            store_part<T, V>(out_g + j, y, m);
        }
    }
}

template <typename T, int V, typename P>
int launch_plan(const char *op, cudaStream_t stream, const row_plan &plan, const P &p)
{
    /* the vectors a thread that plan_rows can ask for */
    return by_vpt<vpt_max(V)>(
        plan.vpt,
        [&](auto k) {
            return launch_rows(op, stream, plan, p.rows, norm_kernel<T, V, decltype(k)::value, P>,
                               p, plan.tiles);
        },
        [&] {
            return weft__fail(WEFT_EINVAL, "%s: no kernel for %u vectors a thread", op, plan.vpt);
        });
}

} // namespace weft_ops

#endif
