/*
 * ops_cuda.cuh - what the operator kernels share: element types, vector
 * access, the walk over (row, chunk) of elementwise ops, Philox, and
 * launch error reporting. The row operators' reductions are reduce.cuh's.
 *
 * Every kernel is a template over its element type T (float, bf16, fp16)
 * and its vector width V: V elements make one 16-byte access when every
 * pointer and the stride allow it (the launchers ask aligned16), else
 * V = 1 and each element is its own access. Arithmetic is fp32 throughout;
 * conversions round to nearest even, as the host's weft__store does.
 *
 * Where the host reference's order of rounding matters (the softmax
 * scale before the max is subtracted), the kernels round the same way
 * with __fmul_rn/__fadd_rn, which nvcc never contracts into fused
 * multiply-adds.
 */
#ifndef WEFT_OPS_CUDA_CUH
#define WEFT_OPS_CUDA_CUH

#include <string.h>

#include <atomic>
#include <mutex>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/status.h"
#include "ops/ops_internal.h"

extern "C" {
#include "core/error.h"
}

namespace weft_ops
{

/* ---- elements ------------------------------------------------------------ */

__device__ __forceinline__ float to_f32(float x)
{
    return x;
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}
__device__ __forceinline__ float to_f32(__half x)
{
    return __half2float(x);
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float x)
{
    return __float2half_rn(x);
}

/* v rounded to T and back: what storing then loading gives. */
template <typename T> __device__ __forceinline__ float round_to(float v)
{
    return to_f32(from_f32<T>(v));
}

/* V elements as one aligned access. */
template <typename T, int V> struct alignas(sizeof(T) * V) vec {
    T e[V];
};

/* V elements as fp32 from one aligned access. Half types convert in pairs.
 * A bf16 is the top half of its fp32, so a pair's word gives the low one
 * shifted up and the high one masked, an instruction each (converting the
 * high one as a bf16 took two: a byte permute, then the shift). */
template <typename T, int V> __device__ __forceinline__ void load_vec(float (&dst)[V], const T *p)
{
    vec<T, V> v = *reinterpret_cast<const vec<T, V> *>(p);
    if constexpr (V % 2 == 0 && std::is_same_v<T, __nv_bfloat16>) {
        uint32_t pairs[V / 2];
        memcpy(pairs, &v, sizeof pairs);
#pragma unroll
        for (int k = 0; k < V; k += 2) {
            dst[k] = __uint_as_float(pairs[k / 2] << 16);
            dst[k + 1] = __uint_as_float(pairs[k / 2] & 0xffff0000u);
        }
    } else if constexpr (V % 2 == 0 && std::is_same_v<T, __half>) {
#pragma unroll
        for (int k = 0; k < V; k += 2) {
            float2 f = __half22float2(__half2(v.e[k], v.e[k + 1]));
            dst[k] = f.x;
            dst[k + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int k = 0; k < V; k++)
            dst[k] = to_f32(v.e[k]);
    }
}

/* V fp32 values rounded to T, stored as one aligned access. Half types
 * round in pairs: cvt.rn.bf16x2.f32 rounds two values in one instruction
 * where the single form takes one each plus the packing. */
template <typename T, int V> __device__ __forceinline__ void store_vec(T *p, const float (&src)[V])
{
    vec<T, V> v;
    if constexpr (V % 2 == 0 && std::is_same_v<T, __nv_bfloat16>) {
#pragma unroll
        for (int k = 0; k < V; k += 2) {
            __nv_bfloat162 h = __floats2bfloat162_rn(src[k], src[k + 1]);
            v.e[k] = h.x;
            v.e[k + 1] = h.y;
        }
    } else if constexpr (V % 2 == 0 && std::is_same_v<T, __half>) {
#pragma unroll
        for (int k = 0; k < V; k += 2) {
            __half2 h = __floats2half2_rn(src[k], src[k + 1]);
            v.e[k] = h.x;
            v.e[k + 1] = h.y;
        }
    } else {
#pragma unroll
        for (int k = 0; k < V; k++)
            v.e[k] = from_f32<T>(src[k]);
    }
    *reinterpret_cast<vec<T, V> *>(p) = v;
}

/* Raw 16-byte vectors to and from fp32 values. */
template <typename T, int V> __device__ __forceinline__ void unpack(float (&x)[V], uint4 raw)
{
    load_vec<T, V>(x, reinterpret_cast<const T *>(&raw));
}
template <typename T, int V> __device__ __forceinline__ uint4 pack(const float (&x)[V])
{
    uint4 raw;
    store_vec<T, V>(reinterpret_cast<T *>(&raw), x);
    return raw;
}

/* Elements of a 16-byte access. */
template <typename T> __host__ __device__ constexpr int vec16()
{
    return int(16 / sizeof(T));
}

/* Whether p is aligned to a 16-byte access (NULL is: it is never read). */
static inline bool aligned16(const void *p)
{
    return (uintptr_t)p % 16 == 0;
}

/* ---- activations (activation.c's forms) ------------------------------- */

/*
 * The activations are most of the arithmetic of the elementwise ops, and a
 * bf16 op at the copy rate leaves about 50 instructions an element for
 * everything, loads and index math included. So they are built from the
 * special function unit's 2^x and 1/x (one instruction each, about 2 ulp)
 * and a few fused multiply-adds, with no branch: an Inf needs none (see
 * each form), and a NaN propagates through the final multiply.
 *
 * The tests allow GELU an error of 1e-5 relative times 4 + x^2: the
 * argument of exp is itself rounded to fp32 on the host, which moves the
 * result by ~x^2 of an ulp in the tails. The forms below stay well inside
 * that: 1.5e-6 relative for |x| <= 3, 2e-7 x^2 beyond (at most 1/20 of
 * the bound), and for results in half types within 3e-5 relative (their
 * bound is a unit in the last place, 1e-3 for fp16); results whose
 * exponent falls below fp32's normal range are flushed to zero, i.e. off
 * by less than 1e-37.
 */

/* 2^x and 1/x, subnormal results flushed to zero. */
__device__ __forceinline__ float exp2_approx(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float rcp_approx(float x)
{
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* x times a factor in [0, 1] that vanishes at -Inf: the host's x / (1 +
 * Inf) and x Phi(x) give -0 there, which -Inf * 0 would make a NaN. So x
 * is clamped to the finite range first, by max.NaN, which keeps a NaN. */
__device__ __forceinline__ float times_gate(float x, float gate)
{
    float finite;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(finite) : "f"(x), "f"(-3.40282347e38f /* -FLT_MAX */));
    return finite * gate;
}

/*
 * The exact GELU, x Phi(x). PyTorch's 0.5 x (1 + erf(x / sqrt 2)) is
 * cheaper still but cancels in the negative tail (no correct digit left
 * below x = -5), where the host's erfc keeps relative accuracy; so:
 *
 *   x Phi(x) = max(x, 0) - a Phi(-a),  Phi(-a) = exp(-a^2/2) q(a),  a = |x|
 *
 * q(a) = 0.5 erfcx(a / sqrt 2) is smooth and tends to 0 slowly; it is a
 * polynomial in t = (a - k)/(a + k), which maps [0, Inf) onto [-1, 1): for
 * fp32 results of degree 7 at k = 3.75 (a minimax fit in relative error,
 * 8e-7, on [0, 16]); for fp16 results (GELU_FIT_HALF) of degree 5 at k = 4
 * (2.7e-5, under a thirtieth of fp16's unit in the last place), which
 * saves two multiply-adds an element where they are scarcest. bf16 results
 * (GELU_FIT_BF16) take a polynomial of degree 3 in r = 1/(a + k) itself at
 * k = 2.75 (7.3e-4, under half of bf16's unit in the last place), three
 * instructions fewer again: the fused GELU+LayerNorm ran up to 7% faster
 * (bench/RESULTS.md, 2026-12-01 01:24). It leaves 4% of bf16 GELU results
 * one unit off the correctly rounded value, where the degree 5 fit leaves
 * 0.15% (x in [-10, 10] by 5e-5, fp32 arithmetic simulated), and never
 * two; a sum with the GELU, as the residual add, is off by at most 7.3e-4
 * of the GELU, less than rounding the GELU to bf16 first would cost. |a|
 * is capped at 16, past which Phi(-a) is below fp32's range anyway.
 * normal_tail(a) is Phi(-a).
 */
enum gelu_fit { GELU_FIT_F32, GELU_FIT_HALF, GELU_FIT_BF16 };

/* The library's fit for results of type T. */
template <typename T> __host__ __device__ constexpr gelu_fit gelu_fit_for()
{
    return std::is_same_v<T, __nv_bfloat16> ? GELU_FIT_BF16
           : std::is_same_v<T, __half>      ? GELU_FIT_HALF
                                            : GELU_FIT_F32;
}

template <gelu_fit FIT> __device__ __forceinline__ float normal_tail(float a)
{
    float q;
    if constexpr (FIT == GELU_FIT_BF16) {
        const float r = rcp_approx(a + 2.75f);
        q = 5.507182598f;
        q = fmaf(q, r, 5.957481861e-01f);
        q = fmaf(q, r, 4.333246946e-01f);
        q = fmaf(q, r, -7.924587117e-04f);
    } else {
        const float k = FIT == GELU_FIT_HALF ? 4.0f : 3.75f;
        const float t = fmaf(-2.0f * k, rcp_approx(a + k), 1.0f);
        if constexpr (FIT == GELU_FIT_HALF) {
            q = -7.784745656e-03f;
            q = fmaf(q, t, 3.113643639e-02f);
            q = fmaf(q, t, -7.195649296e-02f);
            q = fmaf(q, t, 1.243495792e-01f);
            q = fmaf(q, t, -1.703756750e-01f);
            q = fmaf(q, t, 9.441050142e-02f);
        } else {
            q = 5.080080591e-04f;
            q = fmaf(q, t, -7.307599299e-04f);
            q = fmaf(q, t, -4.770565312e-03f);
            q = fmaf(q, t, 2.520528808e-02f);
            q = fmaf(q, t, -6.727581471e-02f);
            q = fmaf(q, t, 1.254839897e-01f);
            q = fmaf(q, t, -1.784635335e-01f);
            q = fmaf(q, t, 1.000391841e-01f);
        }
    }
    return exp2_approx(a * a * -0.72134752044448170f) * q;
}

/* The GELU from the tail, for either sign: two instructions where taking
 * Phi(x) as the tail or 1 - tail by the sign and multiplying took five
 * (bench/ops/ times that as `select`). max.NaN keeps a NaN, and the max
 * with -0 gives -0 for negative x, as the host's x Phi(x) does at -Inf;
 * past the cap on a the tail is 0. */
template <gelu_fit FIT> __device__ __forceinline__ float gelu_erf_fit(float x)
{
    const float a = fminf(fabsf(x), 16.0f);
    float relu;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(relu) : "f"(x), "f"(-0.0f));
    return fmaf(-a, normal_tail<FIT>(a), relu);
}

/* The exact GELU for results of type T. */
template <typename T, gelu_fit FIT = gelu_fit_for<T>()>
__device__ __forceinline__ float gelu_erf(float x)
{
    return gelu_erf_fit<FIT>(x);
}

/* The tanh form, x / (1 + exp(-2u)) with u = k0 (x + k1 x^3), as
 * 2^(x (c0 + c1 x^2)) with log2(e) folded into the constants. */
__device__ __forceinline__ float gelu_tanh(float x)
{
    const float k0 = 0.7978845608028654f, k1 = 0.044715f, log2e = 1.4426950408889634f;
    const float c0 = -2.0f * k0 * log2e, c1 = c0 * k1;
    const float e = exp2_approx(x * fmaf(x * x, c1, c0));
    return times_gate(x, rcp_approx(1.0f + e));
}

/* GELU in the given form, for results of type T. */
template <typename T, gelu_fit FIT = gelu_fit_for<T>()>
__device__ __forceinline__ float gelu(weft_gelu_form form, float x)
{
    return form == WEFT_GELU_ERF ? gelu_erf<T, FIT>(x) : gelu_tanh(x);
}

__device__ __forceinline__ float silu(float x)
{
    return times_gate(x, rcp_approx(1.0f + exp2_approx(x * -1.4426950408889634f)));
}

/* ---- Philox4x32-10, as common.c ----------------------------------------- */

__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k)
{
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
    const uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;

#pragma unroll
    for (int round = 0; round < 10; round++) {
        uint32_t hi0 = __umulhi(M0, c.x), lo0 = M0 * c.x;
        uint32_t hi1 = __umulhi(M1, c.z), lo1 = M1 * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
        k.x += W0;
        k.y += W1;
    }
    return c;
}

/* The keep decisions of consecutive logical elements, one Philox block (4
 * elements) at a time: next(e) for increasing e calls Philox once per
 * block it enters. */
struct dropout_mask {
    uint2 key;
    uint32_t off_lo, off_hi;
    float p;
    unsigned long long block;
    uint4 words;

    __device__ dropout_mask(unsigned long long seed, unsigned long long offset, float p_)
        : key(make_uint2((uint32_t)seed, (uint32_t)(seed >> 32))), off_lo((uint32_t)offset),
          off_hi((uint32_t)(offset >> 32)), p(p_), block(~0ull), words()
    {
    }

    __device__ __forceinline__ bool keep(unsigned long long e)
    {
        unsigned long long b = e / 4;
        if (b != block) {
            block = b;
            words =
                philox4x32_10(make_uint4((uint32_t)b, (uint32_t)(b >> 32), off_lo, off_hi), key);
        }
        uint32_t lane = (uint32_t)(e % 4);
        uint32_t w = lane == 0 ? words.x : lane == 1 ? words.y : lane == 2 ? words.z : words.w;
        return (float)(w >> 8) * 0x1p-24f >= p;
    }
};

/* ---- elementwise walk ---------------------------------------------------- */

/* A grid-stride walk over the chunks of rows x chunks_per_row: each
 * thread starts at its global index and moves by the grid's size, which is
 * added as whole rows plus a remainder, so no division happens in the
 * loop. */
struct chunk_walk {
    size_t row, chunk, rows, per_row, step_rows, step_chunks;

    __device__ chunk_walk(size_t rows_, size_t per_row_) : rows(rows_), per_row(per_row_)
    {
        size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        size_t step = (size_t)gridDim.x * blockDim.x;
        row = g / per_row;
        chunk = g % per_row;
        step_rows = step / per_row;
        step_chunks = step % per_row;
    }

    __device__ __forceinline__ bool more() const
    {
        return row < rows;
    }

    __device__ __forceinline__ void next()
    {
        row += step_rows;
        chunk += step_chunks;
        if (chunk >= per_row) {
            chunk -= per_row;
            row++;
        }
    }
};

/*
 * chunk_walk over the V-element chunks of a rows x cols tensor (cols a
 * multiple of V) with tensor_walk's face: the chunk's column, and its
 * element offset in two tensors whose rows lie `stride` and `stride2`
 * elements apart, formed from the row and the chunk at each step - a
 * multiply where tensor_walk adds. Yet bias + GELU + residual runs 3-7%
 * faster in bf16 on it (bench/RESULTS.md, 2026-11-30 22:55 to 2026-12-01
 * 00:02: the variant `offsets` is the kernel on tensor_walk). In the SASS
 * its bf16 loop is the longer, 204 instructions a step against 186, and
 * only tensor_walk's reloads pointers from constant memory at the top of
 * each step. SwiGLU's two loops differ in length alike (113 against 96),
 * both reload a pointer, and run at the same speed (the variant `rows`):
 * the reloads may be what costs, the length is not. Rows shorter than V
 * have no chunks to walk.
 */
struct row_walk {
    chunk_walk w;
    size_t stride, stride2, at, at2, col;
    unsigned v;

    __device__ row_walk(size_t rows, size_t cols, size_t stride_, size_t stride2_, unsigned v_)
        : w(cols / v_ ? rows : 0, cols / v_ ? cols / v_ : 1), stride(stride_), stride2(stride2_),
          v(v_)
    {
        place();
    }
    __device__ __forceinline__ void place()
    {
        col = w.chunk * v;
        at = w.row * stride + col;
        at2 = w.row * stride2 + col;
    }
    __device__ __forceinline__ bool more() const
    {
        return w.more();
    }
    __device__ __forceinline__ void next()
    {
        w.next();
        place();
    }
};

/*
 * A grid-stride walk over the V-element chunks of a rows x cols tensor
 * (cols a multiple of V). It keeps the chunk's column and its element
 * offset in two tensors whose rows lie `stride` and `stride2` elements
 * apart (an op's output and input, say; the same stride twice costs
 * nothing, the compiler merges them), and moves them by constants worked
 * out once, so a step is a few adds and an address needs no multiply
 * (chunk_walk forms row * stride + chunk for each). I is the offset type:
 * uint32_t where fits32() allows, which makes each address one
 * instruction, else size_t.
 */
template <typename I> struct tensor_walk {
    I at, at2, end, col, cols, step_at, step_at2, step_col, wrap, wrap2;

    __device__ tensor_walk(size_t rows, size_t cols_, size_t stride, size_t stride2, unsigned v)
    {
        size_t per_row = cols_ / v;
        size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        size_t step = (size_t)gridDim.x * blockDim.x;
        end = (I)(rows * stride);
        cols = (I)cols_;
        wrap = (I)(stride - cols_);
        wrap2 = (I)(stride2 - cols_);
        if (per_row == 0) { /* nothing to walk */
            at = end, at2 = 0, col = 0, step_at = step_at2 = step_col = 0;
            return;
        }
        col = (I)(g % per_row * v);
        at = (I)(g / per_row * stride) + col;
        at2 = (I)(g / per_row * stride2) + col;
        step_col = (I)(step % per_row * v);
        step_at = (I)(step / per_row * stride) + step_col;
        step_at2 = (I)(step / per_row * stride2) + step_col;
    }

    __device__ __forceinline__ bool more() const
    {
        return at < end;
    }

    __device__ __forceinline__ void next()
    {
        at += step_at;
        at2 += step_at2;
        col += step_col;
        if (col >= cols) {
            col -= cols;
            at += wrap;
            at2 += wrap2;
        }
    }

    /* Whether every offset the walk forms with `threads` threads in all
     * fits 32 bits: at most (rows + threads / chunks per row + 2) rows of
     * `stride`, the larger of the two. */
    static bool fits32(size_t rows, size_t cols, size_t stride, unsigned v, size_t threads)
    {
        const size_t lim = (size_t)1 << 32;
        size_t per_row = cols / v ? cols / v : 1;
        return rows < lim && stride < lim && threads < lim &&
               (rows + threads / per_row + 3) * stride < lim;
    }
};

/*
 * A thread a chunk: the walk of a grid that covers the tensor, one thread
 * for each V-element chunk, with tensor_walk's face. Its row and column
 * come from one 32-bit division, and the loop over it runs once. It is
 * torch.compile's shape of grid, and on it SwiGLU and bias + GELU +
 * residual run 3-9% faster than one wave of resident blocks walking the
 * tensor. The division matters: bf16's bias + GELU + residual, whose GELU
 * issues most of its instructions, ran 6% slower on row_walk run once a
 * thread, whose start takes four 64-bit divisions (bench/RESULTS.md,
 * 2026-12-02 07:38 and 08:10). Offsets are 32-bit: fits() says where the
 * walk applies.
 */
struct chunk_once {
    uint32_t at, at2, col;
    bool left;

    __device__ chunk_once(size_t rows, size_t cols, size_t stride, size_t stride2, unsigned v)
    {
        const uint32_t per_row = (uint32_t)(cols / v);
        const uint32_t g = blockIdx.x * blockDim.x + threadIdx.x;
        left = per_row != 0 && g < (uint32_t)rows * per_row;
        const uint32_t row = left ? g / per_row : 0;
        col = (g - row * per_row) * v;
        at = row * (uint32_t)stride + col;
        at2 = row * (uint32_t)stride2 + col;
    }

    __device__ __forceinline__ bool more() const
    {
        return left;
    }

    __device__ __forceinline__ void next()
    {
        left = false;
    }

    /* Whether the chunks, the grid of `threads` a block and every offset
     * fit: rows of `stride` elements, the larger of the two. */
    static bool fits(size_t rows, size_t cols, size_t stride, unsigned v, unsigned threads)
    {
        const size_t lim = (size_t)1 << 32, chunks = rows * (cols / v);
        return rows < lim && stride < lim && rows * stride < lim &&
               (chunks + threads - 1) / threads < ((size_t)1 << 31);
    }

    /* Blocks of `threads` for rows x cols. */
    static unsigned grid(size_t rows, size_t cols, unsigned v, unsigned threads)
    {
        const size_t blocks = (rows * (cols / v) + threads - 1) / threads;
        return blocks ? (unsigned)blocks : 1u;
    }
};

/* ---- launching ------------------------------------------------------------ */

/* The multiprocessors of the calling thread's current device, asked of
 * CUDA once per device (launches inside graph capture ask nothing). */
static inline int sm_count()
{
    static std::atomic<int> known[64];
    int dev = 0, n = 0;

    if (cudaGetDevice(&dev) != cudaSuccess)
        return 1;
    if (dev >= 0 && dev < 64 && (n = known[dev].load(std::memory_order_relaxed)) > 0)
        return n;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1)
        return 1;
    if (dev >= 0 && dev < 64)
        known[dev].store(n, std::memory_order_relaxed);
    return n;
}

/* Whether a call's rows are few enough that a row's latency is the whole
 * call: no more than twice the SMs, which the row kernels then hold in one
 * wave while spreading each row over more threads than they would for
 * throughput (two blocks of 512 an SM). On 133 to 264 rows of 4096 on the
 * H200 that took LayerNorm, RMSNorm and the fused op in bf16 12-17% less
 * time a call than their throughput plans; on twice as many rows it took
 * most of them 5-17% more (bench/RESULTS.md, 2026-12-03 13:18). */
static inline bool few_rows(size_t rows)
{
    return rows <= (size_t)2 * sm_count();
}

/* WEFT_OK, or the launch's error as a weft status with CUDA's name for it. */
static inline int launch_status(const char *op, cudaError_t e)
{
    if (e == cudaSuccess)
        return WEFT_OK;
    cudaGetLastError(); /* a refused launch is not sticky: clear it */
    return weft__fail(weft__cuda_status(e), "%s: kernel launch failed: %s (%s)", op,
                      cudaGetErrorName(e), cudaGetErrorString(e));
}

/* After a <<<>>> launch. */
static inline int launched(const char *op)
{
    return launch_status(op, cudaGetLastError());
}

/*
 * Answers CUDA gives the same every time - occupancy, what a kernel was
 * given - kept per key (a struct of plain fields, compared bytewise: zero
 * it before filling), so that a launch asks once per kernel and device.
 * Published entries never change, so finding one takes no lock; a full
 * table just stops keeping.
 */
template <typename Key, typename Value, unsigned N> struct kept_answers {
    struct entry {
        Key key;
        Value value;
    };
    entry entries[N];
    std::atomic<unsigned> published{0};
    std::mutex writer;

    bool find(const Key &key, Value *value)
    {
        const unsigned n = published.load(std::memory_order_acquire);
        for (unsigned i = 0; i < n; i++)
            if (memcmp(&entries[i].key, &key, sizeof key) == 0) {
                *value = entries[i].value;
                return true;
            }
        return false;
    }

    void keep(const Key &key, const Value &value)
    {
        std::lock_guard<std::mutex> hold(writer);
        const unsigned n = published.load(std::memory_order_relaxed);
        if (n < N) {
            entries[n] = {key, value};
            published.store(n + 1, std::memory_order_release);
        }
    }
};

/* Blocks of `threads` threads (no dynamic shared memory) that the current
 * device keeps resident for kernel at once, one wave: its SMs times what
 * an SM holds (1 an SM if CUDA cannot say). Kept per kernel, device and
 * block size: one lookup a launch. */
static inline unsigned wave_blocks(const void *kernel, unsigned threads)
{
    struct key {
        const void *kernel;
        int dev;
        unsigned threads;
    };
    static kept_answers<key, unsigned, 64> kept;
    key k;
    memset(&k, 0, sizeof k);
    k.kernel = kernel;
    k.threads = threads;
    unsigned blocks = 0;
    int n = 0;

    if (cudaGetDevice(&k.dev) != cudaSuccess) {
        cudaGetLastError();
        return 1;
    }
    if (kept.find(k, &blocks))
        return blocks;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, (int)threads, 0) != cudaSuccess ||
        n < 1) {
        cudaGetLastError();
        return (unsigned)sm_count();
    }
    blocks = (unsigned)n * (unsigned)sm_count();
    kept.keep(k, blocks);
    return blocks;
}

/* Blocks for `work` items of `threads` threads each of a grid-stride
 * kernel: at most the blocks the GPU keeps resident, one wave (the
 * kernels walk the rest). A fixed number of blocks an SM left kernels of
 * many registers a second, partial wave, whose SMs end the op with a
 * fraction of the loads in flight. */
template <typename K> static unsigned grid_for(K kernel, size_t work, unsigned threads)
{
    size_t want = (work + threads - 1) / threads;
    size_t cap = wave_blocks((const void *)kernel, threads);
    if (want > cap)
        want = cap;
    return want ? (unsigned)want : 1u;
}

/* launch_as(T{}) with T the element type of dtype: each operator's entry
 * point picks its kernels' instantiation this way. */
template <typename F> static inline int by_dtype(weft_dtype dtype, F launch_as)
{
    switch (dtype) {
    case WEFT_DTYPE_BF16:
        return launch_as(__nv_bfloat16{});
    case WEFT_DTYPE_F16:
        return launch_as(__half{});
    default:
        return launch_as(float{});
    }
}

} // namespace weft_ops

#endif
