/*
 * weft/ops.h - fused memory-bound operators: bias+GELU+residual, LayerNorm,
 * RMSNorm, bias+GELU+residual+LayerNorm, softmax, RoPE, SwiGLU/GeGLU, and
 * the matrix multiply with its fused epilogues (bias, ReLU/GELU, residual).
 *
 * Each call does in one pass what a framework does in several, so that the
 * intermediates (the biased input, the residual sum, the scores) never make
 * an extra round trip through memory.
 *
 * Conventions shared by every call:
 *  - The first argument is a stream: a cudaStream_t passed as void *. NULL
 *    means "run now, on the calling thread, with the host reference"; the
 *    call has finished when it returns. A non-NULL stream enqueues the
 *    op's kernel on it and returns at once (for CUDA's default stream pass
 *    cudaStreamLegacy or cudaStreamPerThread, not NULL); a launch that
 *    CUDA refuses returns WEFT_EINVAL or WEFT_EDEVICE with CUDA's error
 *    name in the message. In a library built without CUDA a non-NULL
 *    stream returns WEFT_EINVAL ("<op>: built without CUDA") after the
 *    other arguments are checked. With a stream every pointer (RoPE's
 *    positions too) is memory the GPU can read or write; with NULL,
 *    memory the host can. WEFT_TASK_STREAM (below) is the calling task's
 *    own stream, on either backend.
 *  - The kernels compute what the host reference computes, in the same
 *    order where the order matters (the scale before the exponent); they
 *    differ only in the order of long sums (tree reductions) and in fp32
 *    transcendentals: within ~5e-7 relative of the host's correctly rounded
 *    ones, the activations (GELU, SiLU) within 1.5e-6 for |x| <= 3 and
 *    2e-7 x^2 beyond (their exp's argument is rounded to fp32 on both
 *    sides, which moves them by that much in the tails). For fp16 results
 *    the erf GELU is a shorter fit, within 3e-5, a thirtieth of fp16's
 *    unit in the last place; for bf16 results shorter still, within
 *    7.3e-4, under half of bf16's unit, so a sum with it (the residual
 *    add) may be off by 7.3e-4 of the GELU. So fp32 results agree to ~1e-6
 *    relative, and bf16/fp16 results to their rounding (one unit in the
 *    last place where the fp32 values straddle a rounding boundary).
 *    Dropout masks agree bit for bit.
 *  - Tensors are batches of rows. Row r of a tensor starts stride elements
 *    (not bytes) after row r-1; stride >= the row length. Any row length
 *    >= 1 and any number of rows >= 1 is accepted.
 *  - Every tensor of a call has the call's dtype (weights and biases too).
 *    Elements are converted to fp32, all arithmetic and accumulation is fp32
 *    (transcendentals are correctly rounded to fp32), and results are rounded
 *    to the dtype to nearest, ties to even.
 *  - Pointers must be aligned to their element size. Elementwise calls allow
 *    out to be exactly one of their inputs (in place); any other overlap is
 *    undefined.
 *  - Bad arguments (a NULL pointer that is required, a zero size, an unknown
 *    dtype, a stride smaller than the row, sizes whose product overflows, a
 *    misaligned pointer, an out-of-range scalar) return WEFT_EINVAL with a
 *    message in weft_last_error() before anything is read or written.
 *  - NaN and Inf: what each call does with them is written beside it; the
 *    host reference defines it and the GPU kernels must match.
 */
#ifndef WEFT_OPS_H
#define WEFT_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "weft.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The stream argument that means the calling task's own stream: the op
 * joins the task's other work in order (weft_memcpy_async, weft_launch, ...)
 * and weft_await covers it. On a GPU its kernel goes on the stream the task
 * leases (as weft_stream gives it); on the host backend the host reference
 * runs as a host function in stream order (as weft_host_async). Either way
 * the arguments (softmax's options too) are taken at the call and the
 * tensors read when the op runs, as with any stream work. So one task's
 * code runs on either backend. Task only: WEFT_ENOTASK elsewhere. */
#define WEFT_TASK_STREAM ((void *)(intptr_t)-1)

typedef enum weft_dtype {
    WEFT_DTYPE_F32 = 0,  /* IEEE binary32 */
    WEFT_DTYPE_BF16 = 1, /* bfloat16: binary32's top 16 bits */
    WEFT_DTYPE_F16 = 2,  /* IEEE binary16, subnormals kept */
    /* The quantized types below are weft_matmul's alone (its operands, and
     * its D where it says so); every other call refuses them. */
    WEFT_DTYPE_F8_E4M3 = 3, /* OCP FP8 E4M3: bias 7, no Inf, 0x7f/0xff NaN, max 448 */
    WEFT_DTYPE_F8_E5M2 = 4, /* OCP FP8 E5M2: bias 15, IEEE-like, max 57344 */
    WEFT_DTYPE_I8 = 5,      /* int8_t, two's complement */
    WEFT_DTYPE_I32 = 6      /* int32_t: weft_matmul's exact INT8 product */
} weft_dtype;

/* ---- bias + GELU + residual ------------------------------------------- */

typedef enum weft_gelu_form {
    /* 0.5 x (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3), evaluated as
     * x / (1 + exp(-2u)) so the negative tail does not cancel */
    WEFT_GELU_TANH = 0,
    WEFT_GELU_ERF = 1 /* x Phi(x) = 0.5 x erfc(-x / sqrt(2)), the exact form */
} weft_gelu_form;

/* out[r][j] = GELU(in[r][j] + bias[j]) + residual[r][j] for rows x cols.
 * bias (cols elements) and residual (rows x cols, same stride) are optional:
 * NULL means zero. out may be in or residual.
 * NaN/Inf: IEEE arithmetic elementwise, with GELU(+Inf) = +Inf,
 * GELU(-Inf) = -0 and GELU(NaN) = NaN. */
int weft_bias_gelu_residual(void *stream, weft_dtype dtype, weft_gelu_form form, void *out,
                            const void *in, const void *bias, const void *residual, size_t rows,
                            size_t cols, size_t stride);

/* ---- LayerNorm and RMSNorm ------------------------------------------- */

/* For each row: s = in + residual (residual optional, NULL = none), rounded
 * to the dtype; when sum_out is not NULL, s is written there. Then
 *   out = (s - mean(s)) / sqrt(var(s) + eps) * weight + bias
 * with the population variance computed in two passes (mean first), so
 * rows far from zero lose nothing to cancellation. weight and bias (cols
 * elements) are optional: NULL means 1 and 0. eps >= 0 and finite. All row
 * tensors share stride. sum_out may be in or residual; out may be in.
 * Fastest (kernels fixed for the call, whichever of weight, bias and
 * residual are given): 16-byte aligned tensors with cols and stride
 * multiples of 16 bytes, sum_out only with residual; other calls test
 * their inputs at run time, up to 2.6x slower on long rows.
 * NaN/Inf: a NaN or Inf anywhere in s makes the whole output row NaN (s
 * itself is written as computed); weight and bias are applied IEEE-wise. */
int weft_layernorm(void *stream, weft_dtype dtype, void *out, void *sum_out, const void *in,
                   const void *residual, const void *weight, const void *bias, float eps,
                   size_t rows, size_t cols, size_t stride);

/* As weft_layernorm without centring: out = s / sqrt(mean(s^2) + eps) * weight
 * (fastest as weft_layernorm says).
 * NaN/Inf: a NaN in s makes the whole output row NaN; an Inf (with no NaN)
 * makes mean(s^2) Inf, so its own position becomes NaN and every finite
 * position 0 (times weight); so does a finite row whose squares overflow
 * fp32 (|s| above ~1.8e19). */
int weft_rmsnorm(void *stream, weft_dtype dtype, void *out, void *sum_out, const void *in,
                 const void *residual, const void *weight, float eps, size_t rows, size_t cols,
                 size_t stride);

/* The feed-forward tail of a post-norm block in one pass:
 *   x = residual + GELU(in + gelu_bias)      (as weft_bias_gelu_residual)
 *   out = LayerNorm(x) * weight + bias      (as weft_layernorm of x)
 * x is rounded to the dtype, written to x_out when x_out is not NULL, and
 * normalized as rounded, so the result equals weft_bias_gelu_residual into
 * a buffer followed by weft_layernorm of that buffer - without the buffer's
 * round trip through memory. gelu_bias, residual, weight and bias are
 * optional (NULL = 0, 0, 1, 0). x_out may be in or residual; out may be in.
 * Fastest (kernels fixed for the call), on tensors as weft_layernorm says:
 * weight and bias given, with or without x_out, and the residual given
 * (gelu_bias or not) or gelu_bias given without the residual; other calls
 * test their inputs at run time.
 * NaN/Inf: those of the two calls it stands for. */
int weft_bias_gelu_residual_layernorm(void *stream, weft_dtype dtype, weft_gelu_form form,
                                      void *out, void *x_out, const void *in, const void *gelu_bias,
                                      const void *residual, const void *weight, const void *bias,
                                      float eps, size_t rows, size_t cols, size_t stride);

/* ---- softmax ----------------------------------------------------------- */

/* Options for weft_softmax; NULL or a zeroed struct with scale = 1 gives a
 * plain softmax. (A zeroed scale means 1, not 0.) */
typedef struct weft_softmax_opts {
    float scale; /* multiplies the input before the softmax; 0 means 1 */

    /* Causal mask when causal_q > 0: the rows are groups of causal_q
     * queries (row r is query i = r % causal_q) against cols keys, aligned
     * at the end, so query i sees keys j <= i + cols - causal_q. Masked
     * outputs are 0 and masked inputs are never read. causal_q <= cols, so
     * every query sees at least key 0. */
    size_t causal_q;

    /* Dropout with probability dropout_p in [0, 1): each output is kept
     * and divided by (1 - p), or set to 0. Element j of row r (logical index
     * e = r * cols + j, independent of stride) is kept when
     *   (word >> 8) * 2^-24 >= p,
     * where word is lane e % 4 of Philox4x32-10 with key (seed low, seed
     * high) and counter (e/4 low, e/4 high, offset low, offset high). The
     * same seed and offset always give the same mask; advance offset (by any
     * amount) for a fresh mask under the same seed. */
    float dropout_p;
    uint64_t seed;
    uint64_t offset;
} weft_softmax_opts;

/* out[r] = softmax(scale * in[r]) over the cols elements of each row, with
 * the row maximum subtracted first, then the mask and dropout of opts.
 * out may be in.
 * NaN/Inf: a NaN or +Inf in a row's unmasked elements makes that row NaN;
 * -Inf elements get 0 unless all unmasked elements are -Inf, which makes the
 * row NaN. */
int weft_softmax(void *stream, weft_dtype dtype, void *out, const void *in, size_t rows,
                 size_t cols, size_t stride, const weft_softmax_opts *opts);

/* ---- rotary position embedding -------------------------------------- */

typedef enum weft_rope_layout {
    WEFT_ROPE_INTERLEAVED = 0, /* pairs (x[2i], x[2i+1]), as in GPT-J */
    WEFT_ROPE_HALVES = 1       /* pairs (x[i], x[i + head_dim/2]), as in GPT-NeoX */
} weft_rope_layout;

/* Rotates Q and K in place, in one pass. Token t (of tokens) has q_heads
 * heads of head_dim elements starting at q + t * q_stride, likewise k; pair
 * i of each head turns by angle positions[t] * base^(-2i / head_dim):
 *   (x, y) -> (x cos - y sin, x sin + y cos).
 * head_dim is even; base > 0 and finite (10000 is usual); q_stride >=
 * q_heads * head_dim. k may be NULL with k_heads 0 to rotate Q alone.
 * The angle and its sine and cosine are computed in double and rounded to
 * fp32, since an fp32 angle at position 10^5 would be off by 10^-2 radians;
 * the rotation itself is fp32. The kernels must keep that accuracy (e.g. a
 * table built on the host).
 * NaN/Inf: IEEE arithmetic per pair; a non-finite element affects only its
 * own pair. */
int weft_rope(void *stream, weft_dtype dtype, weft_rope_layout layout, void *q, size_t q_heads,
              size_t q_stride, void *k, size_t k_heads, size_t k_stride, size_t tokens,
              size_t head_dim, const int32_t *positions, float base);

/* ---- gated linear units ---------------------------------------------- */

typedef enum weft_glu_kind {
    WEFT_GLU_SWIGLU = 0,    /* SiLU(a) * b, SiLU(a) = a / (1 + exp(-a)) */
    WEFT_GLU_GEGLU = 1,     /* GELU(a) * b, exact erf form */
    WEFT_GLU_GEGLU_TANH = 2 /* GELU(a) * b, tanh form */
} weft_glu_kind;

/* Each input row holds 2 * cols elements: a = in[r][0..cols), b =
 * in[r][cols..2 cols). out[r][j] = act(a[j]) * b[j]. in_stride >= 2 * cols,
 * out_stride >= cols; out must not overlap in.
 * NaN/Inf: IEEE arithmetic, with act(+Inf) = +Inf, act(-Inf) = -0 and
 * act(NaN) = NaN (so act(-Inf) * Inf is NaN). */
int weft_glu(void *stream, weft_dtype dtype, weft_glu_kind kind, void *out, const void *in,
             size_t rows, size_t cols, size_t in_stride, size_t out_stride);

/* ---- matrix multiply -------------------------------------------------- */

/* The activation at the end of a matmul's epilogue. */
typedef enum weft_matmul_act {
    WEFT_MATMUL_ACT_NONE = 0,
    WEFT_MATMUL_ACT_RELU = 1, /* max(x, 0); ReLU(NaN) = NaN */
    /* GELU in the forms of weft_gelu_form. cuBLASLt's GELU epilogue is the
     * tanh form, so that one is fused into the matmul on the GPU; the erf
     * form runs weft_bias_gelu_residual's kernel over D after it. */
    WEFT_MATMUL_ACT_GELU_TANH = 2,
    WEFT_MATMUL_ACT_GELU_ERF = 3
} weft_matmul_act;

/* What weft_matmul computes, for each batch index b < batch:
 *   P = alpha op(A_b) op(B_b) + beta C_b + bias      (m x n, fp32)
 *   aux_b = P                          (when aux is given: the pre-activation)
 *   D_b = act(P)
 * op(A) is m x k: A itself (m x k) or, with trans_a, A transposed (A is
 * k x m); op(B) is k x n: B (k x n) or, with trans_b, B transposed (B is
 * n x k, the layout of a Linear layer's weight [out][in]). Every matrix is
 * row-major: element (i, j) of X is at X + i * ldx + j (in elements), and
 * batch b's matrix at X + b * stride_x.
 *
 * The one call whose operands may have another type than its output
 * (in_type), and whose kernels (cuBLASLt's) sum in another order than the
 * host: see weft_matmul for what agrees.
 *
 * Zero means the default in every field, so a zeroed struct with m, n, k
 * and type set is a plain D = A B. The quantized operands' fields (FP8 and
 * INT8, below) were taken from what used to be reserved, each with zero
 * meaning "off", so a struct built before them keeps its meaning and its
 * size; reserved must stay zero, for fields still to come.
 *
 * FP8 operands (in_type WEFT_DTYPE_F8_E4M3 or _E5M2; B may be the other
 * one through in_type_b, but not both E5M2, which cuBLASLt lacks):
 *   P = alpha sa_i sb_j (op(A) op(B))_ij + beta C + bias
 *   D = act(P), or with an fp8 D: D = fp8(scale_d act(P)), amax_d = max |act(P)|
 * with sa, sb the scales (below); the host sums the exact products in
 * fp32 (weft_matmul says how the GPU's sums differ). D is bf16, fp16 or fp32, or fp8 (E4M3, or E5M2
 * when an operand is E5M2) with scale_d required; rounding to fp8 is to nearest even, saturating to
 * the largest finite value (NaN stays NaN). The epilogue's types are cuBLASLt's: C and bias of D's
 * type, except that an fp32 D takes a bf16 bias and an fp8 D a C and bias of c_type. aux and the
 * erf GELU with an fp8 D are refused (cuBLASLt's FP8 kernels keep no such
 * aux, and the erf GELU would run after D is quantized).
 * Layout: cuBLASLt multiplies FP8 only in its "TN" form, which in weft's
 * row-major terms is A stored m x k (trans_a 0) and B stored n x k
 * (trans_b 1, a Linear weight's layout), and only with 16-byte aligned
 * dimensions: k, lda, ldb and their batch strides multiples of 16; D's
 * and C's rows (n elements), leading dimensions and batch strides
 * multiples of 16 bytes; A, B, C and D 16-byte aligned. m is free.
 * Anything else is refused on both backends.
 *
 * INT8 operands (in_type WEFT_DTYPE_I8), the same layout with multiples of
 * 4 (n and k too, cuBLASLt's rule for its int8 kernels, and A and B 4-byte
 * aligned), and k <= 131071 so that no int32 sum can overflow
 * (|sum| <= k 128^2 < 2^31):
 *  - type WEFT_DTYPE_I32: D = op(A) op(B) exactly; no alpha, C, bias, act,
 *    aux or scales; ldd and stride_d multiples of 4.
 *  - type bf16/fp16/fp32: with scales sa and sb required,
 *      P = alpha * float(acc_ij) * sa_i * sb_j + beta C + bias,  D = act(P)
 *    in fp32 in that order, acc the exact int32 product; C, bias and aux as
 *    for 16/32-bit operands. On the GPU the int32 product goes through a
 *    buffer taken from CUDA's stream-ordered pool (cudaMallocAsync) and
 *    given back after the epilogue's kernel, so the caller passes nothing,
 *    streams never share one and repeated calls reuse the pool's memory.
 *
 * Scales are fp32 arrays read when the product runs (device memory on a
 * GPU stream, host memory with NULL), shared by every batch. */
typedef enum weft_matmul_scale {
    WEFT_MATMUL_SCALE_NONE = 0,   /* off: only where no scale is needed */
    WEFT_MATMUL_SCALE_TENSOR = 1, /* one float for the whole operand */
    /* per row of op(A) (m floats) for A, per column of op(B) (n floats) for
     * B: cuBLASLt's outer-vector mode. With FP8 both operands take it or
     * neither, and D is not fp8. */
    WEFT_MATMUL_SCALE_OUTER = 2
} weft_matmul_scale;

typedef struct weft_matmul_desc {
    size_t m, n, k;  /* each >= 1 */
    weft_dtype type; /* of C, D, bias and aux (FP8 operands: see above) */
    /* of A and B; WEFT_DTYPE_F32 (zero) means type. fp32 operands need an
     * fp32 D, bf16 or fp16 ones a D of their type or fp32 (FP8 and INT8:
     * see above). */
    weft_dtype in_type;
    int trans_a, trans_b; /* nonzero: op() transposes */
    /* Leading dimensions, each >= the row of its matrix as stored (0 means
     * exactly that: packed rows). ldc is C's, ldaux aux's. */
    size_t lda, ldb, ldc, ldd, ldaux;
    /* Strided batches: batch matrices (0 means 1). stride_* is in elements;
     * for A, B and C 0 reuses one matrix for every batch (shared weights);
     * D and aux need a stride that keeps batches apart. bias is shared. */
    size_t batch;
    size_t stride_a, stride_b, stride_c, stride_d, stride_aux;
    float alpha; /* 0 means 1 */
    float beta;  /* with C given: 0 means 1 (pass C = NULL for none) */
    weft_matmul_act act;
    const void *bias; /* n elements of type, added to every row; NULL = none */
    /* The pre-activation P, m x n of type: with a GELU act only (ReLU's
     * gradient reads from D itself). On the GPU ldaux and stride_aux must
     * be multiples of 8, which cuBLASLt requires; the host asks the same so
     * a call valid on one backend is valid on the other. */
    void *aux;
    /* Let fp32 operands go through the matrix units' TF32 mode (10-bit
     * mantissas, ~3e-4 relative) on the GPU; the host computes fp32. */
    int allow_tf32;
    /* ---- quantized operands (see above); zero is off ---- */
    weft_dtype in_type_b; /* FP8 B's type when not in_type's; 0 means in_type */
    weft_dtype c_type;    /* with an fp8 D: C's and bias's, bf16 (0 means bf16) or fp16 */
    weft_matmul_scale scale_a_mode, scale_b_mode; /* required with FP8 and scaled INT8 */
    const float *scale_a, *scale_b;               /* as the modes say */
    const float *scale_d; /* one float, with an fp8 D only (required there) */
    float *amax_d; /* with an fp8 D: one float := max |act(P)| over every batch; NULL = none */
    uint64_t reserved[10];
} weft_matmul_desc;

/* D = act(alpha op(A) op(B) + beta C + bias), as weft_matmul_desc says.
 * C is optional (NULL = no residual) and may be D itself (in place) when it
 * has D's layout (ldc = ldd, stride_c = stride_d); no other overlap of D
 * or aux with an input is allowed.
 * Arithmetic: the operands are converted to fp32 and products summed in
 * fp32 (bf16/fp16 in blocks, as the matrix units do; TF32 only when asked),
 * the epilogue is fp32 and D and aux are rounded to type once. The host
 * reference runs on a BLAS (OpenBLAS's cblas_sgemm); the GPU on cuBLASLt,
 * whose sums run in another order, so results agree to the types'
 * rounding and the sums' length (~1e-5 relative for fp32, ~1e-2 for
 * bf16), not bit for bit.
 * GPU: operand pointers aligned to 16 bytes and leading dimensions and
 * strides that keep rows 16-byte aligned get the fastest kernels; anything
 * aligned to its element size works. Plans (cuBLASLt's heuristic answer)
 * are cached per shape, types, layout, epilogue and alignment, and each
 * stream gets a workspace of weft's the first time it runs a matmul, so a
 * first call costs more than the next.
 * FP8: the host sums the exact products in fp32; cuBLASLt's FP8 kernels
 * sum in the matrix units' narrower accumulators and promote to fp32 at
 * intervals (fast accumulation, which skips that, is never asked for), so
 * results agree to ~2^-12 of the terms' magnitudes and the rounding of D;
 * an fp8 D to one fp8 unit where the two straddle a rounding boundary.
 * INT8: int32 results agree exactly; the dequantized ones to the rounding
 * of D.
 * Bad arguments (sizes, leading dimensions below the row, NULL operands,
 * misaligned pointers, aux without GELU, type combinations cuBLASLt lacks,
 * FP8/INT8 layouts other than TN, missing or unneeded scales) return
 * WEFT_EINVAL before anything is enqueued. A host reference in a
 * library built without a BLAS returns WEFT_EINVAL ("built without a host
 * BLAS").
 * NaN/Inf: IEEE arithmetic; a NaN in a row of op(A) or a column of op(B)
 * may reach every element it meets. */
int weft_matmul(void *stream, const weft_matmul_desc *desc, void *d, const void *a, const void *b,
                const void *c);

#ifdef __cplusplus
}
#endif

#endif
