/*
 * weft/ops.h - fused memory-bound operators: bias+GELU+residual, LayerNorm,
 * RMSNorm, bias+GELU+residual+LayerNorm, softmax, RoPE, SwiGLU/GeGLU, and
 * the matrix multiply with its fused epilogues (bias, ReLU/GELU, residual)
 * and its 2:4-sparse form, the building blocks of a mixture-of-experts
 * layer (router, permute, grouped matmul over the experts, combine), the
 * 2-D convolution with BatchNorm folded in and bias and ReLU fused,
 * attention (FlashAttention-style prefill with GQA, windows and RoPE fused
 * into the loads) and a paged KV cache with its decode attention.
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

/* out row r = table row ids[r], for the rows rows (cols elements each;
 * rows of the table table_stride apart, of out out_stride): an embedding
 * lookup by ids in int32 (device memory with a stream), read when the copy
 * runs. An id outside [0, table_rows) gives a row of zeros (the GPU cannot
 * refuse it before it runs), never a read outside the table. out must not
 * overlap the table. A copy: exact on every backend. */
int weft_gather_rows(void *stream, weft_dtype dtype, void *out, const void *table,
                     const int32_t *ids, size_t rows, size_t cols, size_t table_rows,
                     size_t table_stride, size_t out_stride);

/* ids[r] = the index of the largest of row r's cols elements (rows stride
 * apart): greedy decoding's choice over a row of logits. Equal values go
 * to the lower index; -0 equals +0; NaN ranks below every number, so a row
 * of NaN gives 0. ids is int32 (device memory with a stream); cols and
 * rows at most INT32_MAX. Exactly the same ids on every backend. */
int weft_argmax(void *stream, weft_dtype dtype, int32_t *ids, const void *in, size_t rows,
                size_t cols, size_t stride);

/* How one row of weft_sample draws its token. */
typedef struct weft_sampling {
    float temperature; /* > 0: a draw; 0, below or NaN: greedy (weft_argmax's id) */
    float top_p;       /* in (0, 1): keep the fewest tokens whose mass reaches it; else all */
    int32_t top_k;     /* > 0: keep the top_k likeliest first; else all */
    uint32_t reserved; /* 0 */
    uint64_t seed;     /* the draw is Philox4x32-10's at (seed, offset): the same pair, */
    uint64_t offset;   /* the same token; a generation counts offset up a token at a time */
} weft_sampling;

/* ids[r] = a token drawn from row r's cols logits (rows stride apart) by
 * params[r], as an inference server samples: logits l_i at temperature T
 * weigh w_i = exp((l_i - l_max) / T), held as integers floor(w_i * 2^32)
 * so that every sum is exact and the same in any order (a token under
 * 2^-32 of the likeliest's weight is never drawn). The tokens stand in
 * weft_argmax's order (larger logit first, equal ones lower index first,
 * NaN last: weight 0); top_k keeps the first k, then top_p the fewest
 * first ones whose weight reaches ceil(top_p * their total); the draw u
 * in [0, 1) from Philox picks the first token at which the kept weights,
 * summed in that order, pass floor(u * total). A row whose largest logit
 * is +Inf (or only NaN) is greedy. params is rows entries read when the
 * call runs (device memory, or pinned host memory, with a stream), so a
 * captured call replays with the values of each replay. Same seed and
 * offset: the same id on one backend; across backends the same but where
 * exp's last bit moves a boundary. cols at most 2^23, rows at most
 * INT32_MAX. */
int weft_sample(void *stream, weft_dtype dtype, int32_t *ids, const void *logits, size_t rows,
                size_t cols, size_t stride, const weft_sampling *params);

/* One token's adjustment of its logit in weft_penalize. */
typedef struct weft_logit_adjust {
    int32_t token;
    int32_t count; /* > 0: the output holds it count times (frequency, presence) */
    uint32_t seen; /* nonzero: the prompt or the output holds it (repetition) */
    float bias;    /* added last (OpenAI's logit_bias); 0: none */
} weft_logit_adjust;

/* One row's penalties in weft_penalize, as inference servers define them. */
typedef struct weft_penalties {
    float repetition; /* a seen token's logit: divided by it if positive, else multiplied; 0, 1:
                         none */
    float frequency;  /* a token the output holds c > 0 times loses frequency * c + presence */
    float presence;
    uint32_t first, count; /* the row's adjustments: adjust[first, first + count) */
} weft_penalties;

/* The penalties of what a generation has said, applied in place to row r
 * of the logits (cols each, rows stride apart) before its draw: for each
 * of its adjustments whose token is in [0, cols) (others are skipped: the
 * GPU cannot refuse them before it runs), the logit x becomes
 *   seen ? (x > 0 ? x / repetition : x * repetition) : x,
 * minus frequency * count + presence when count > 0, plus bias; in fp32,
 * stored in dtype. A token should have one adjustment a row (a second
 * applies again). params (rows entries) and adjust are read when the call
 * runs (device memory, or pinned host memory, with a stream), so a
 * captured call replays with the values of each replay. */
int weft_penalize(void *stream, weft_dtype dtype, void *logits, size_t rows, size_t cols,
                  size_t stride, const weft_penalties *params, const weft_logit_adjust *adjust);

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

/* Llama 3's frequency scaling (rope_scaling of type "llama3" in a Hugging
 * Face config). With f = base^(-2i / head_dim), pair i's inverse frequency,
 * and its wavelength w = 2 pi / f: pair i turns by f where w <
 * original_max_positions / high_freq_factor, by f / factor where w >
 * original_max_positions / low_freq_factor, and in between by
 * (1 - s) f / factor + s f, s = (original_max_positions / w -
 * low_freq_factor) / (high_freq_factor - low_freq_factor); in double. */
typedef struct weft_rope_llama3 {
    double factor;                 /* >= 1 */
    double low_freq_factor;        /* > 0 */
    double high_freq_factor;       /* > low_freq_factor */
    double original_max_positions; /* > 0 */
} weft_rope_llama3;

/* weft_rope with Llama 3's scaled frequencies (scaling, finite, as above;
 * NULL: weft_rope itself). Everything else - layouts, accuracy, in place,
 * NaN - is weft_rope's. */
int weft_rope_scaled(void *stream, weft_dtype dtype, weft_rope_layout layout, void *q,
                     size_t q_heads, size_t q_stride, void *k, size_t k_heads, size_t k_stride,
                     size_t tokens, size_t head_dim, const int32_t *positions, float base,
                     const weft_rope_llama3 *scaling);

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
     * form runs weft_bias_gelu_residual's kernel over D after it (weft's
     * decode kernel, see weft_matmul, fuses both). */
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
    /* Nonzero: B does not change while the work enqueued before this call
     * on the same stream runs (a model's weights). The decode kernel then
     * starts reading B while the kernel before it ends (Hopper's
     * programmatic dependent launch); a B written by that kernel would be
     * read stale. Zero is always safe. */
    int b_constant;
    int reserved_int;
    uint64_t reserved[9];
} weft_matmul_desc;

/* D = act(alpha op(A) op(B) + beta C + bias), as weft_matmul_desc says.
 * C is optional (NULL = no residual) and may be D itself (in place) when it
 * has D's layout (ldc = ldd, stride_c = stride_d); no other overlap of D
 * or aux with an input is allowed.
 * Arithmetic: the operands are converted to fp32 and products summed in
 * fp32 (bf16/fp16 in blocks, as the matrix units do; TF32 only when asked),
 * the epilogue is fp32 and D and aux are rounded to type once. The host
 * reference runs on a BLAS (OpenBLAS's cblas_sgemm, each call on the
 * thread that runs it: the host device's executors are its parallelism;
 * OPENBLAS_NUM_THREADS, when set, is obeyed instead); the GPU on cuBLASLt
 * or weft's decode kernel (below), whose sums run in another order, so
 * results agree to the types' rounding and the sums' length (~1e-5
 * relative for fp32, ~1e-2 for bf16), not bit for bit.
 * GPU: operand pointers aligned to 16 bytes and leading dimensions and
 * strides that keep rows 16-byte aligned get the fastest kernels; anything
 * aligned to its element size works. Decode's shapes - m <= 32, bf16 or
 * fp16 operands, or FP8 ones into a bf16, fp16 or fp32 D with C and bias
 * of D's type, A as stored and B transposed (a Linear weight, n x k), A
 * and B 16-byte aligned with rows (where m or n > 1) and batch strides of
 * whole 16 bytes, at most 65535 batches, and k <= 32768 unless
 * ceil(n / 16) * batch >= 128 - run weft's own kernel, which reads the
 * weights once for all m rows with the whole epilogue fused (the erf GELU
 * too); its fp32 sums are the tensor cores'. Other calls, INT8 ones at any
 * m among them, go to cuBLASLt.
 * Plans (cuBLASLt's heuristic answer) are cached per shape, types,
 * layout, epilogue and alignment, and each stream gets a workspace of
 * weft's the first time it runs a matmul, so a first call costs more than
 * the next.
 * FP8: the host sums the exact products in fp32; cuBLASLt's FP8 kernels
 * sum in the matrix units' narrower accumulators and promote to fp32 at
 * intervals (fast accumulation, which skips that, is never asked for), so
 * results agree to ~2^-12 of the terms' magnitudes and the rounding of D;
 * an fp8 D to one fp8 unit where the two straddle a rounding boundary.
 * The decode kernel sums FP8 in the matrix units a warp's turn at a time
 * (256 products a row) and adds the turns in fp32: held to the same
 * agreement.
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

/* FP8 rows with a scale each, as weft_matmul's FP8 operands with
 * WEFT_MATMUL_SCALE_OUTER take them (dynamic per-token quantization of
 * activations, or per-channel of a Linear weight stored n x k): for each of
 * rows rows of cols elements (in: fp32, bf16 or fp16, rows in_stride
 * apart; out: out_type, E4M3 or E5M2, rows out_stride apart),
 *   amax_r = max_j |in[r][j]|,  scales[r] = max(amax_r / F, FLT_MIN),
 *   out[r][j] = fp8(in[r][j] / scales[r])
 * with F the type's largest finite value (448 for E4M3, 57344 for E5M2),
 * the division IEEE's and fp8() rounding to nearest even and saturating
 * (as weft_matmul's fp8 D), so the row's largest element maps to F and
 * scales[r] * out[r][j] is in[r][j] to the type's precision. A row of
 * zeros gets zeros and scale FLT_MIN. NaN: a NaN element stays NaN and
 * does not count toward amax; an Inf makes amax and the scale Inf, so the
 * row's finite elements become 0 and its infinities NaN. scales is fp32
 * (device memory with a stream); out must not overlap in. Exactly the same
 * bytes on every backend (a NaN's sign aside). */
int weft_quantize_fp8(void *stream, weft_dtype out_type, void *out, float *scales,
                      weft_dtype in_type, const void *in, size_t rows, size_t cols,
                      size_t in_stride, size_t out_stride);

/* weft_rmsnorm into dtype, then weft_quantize_fp8 of that row, in one pass
 * (an FP8 model's norm before its projections): out (out_type, E4M3 or
 * E5M2, rows out_stride apart) and scales (fp32, one a row) are byte for
 * byte what
 *   weft_rmsnorm(stream, dtype, tmp, sum_out, in, residual, weight, eps,
 *                rows, cols, stride);
 *   weft_quantize_fp8(stream, out_type, out, scales, dtype, tmp, rows, cols,
 *                     stride, out_stride);
 * write, without tmp: the normalized row is rounded to dtype (as tmp holds
 * it) before its largest magnitude is taken and before it is divided by
 * the scale. sum_out (optional) is weft_rmsnorm's, written the same.
 * On a GPU the pair it equals is the pair on the same stream, tmp 16-byte
 * aligned (as any allocation is): the row's sum of squares is then taken
 * as that weft_rmsnorm's kernel takes it, and the scales and codes follow
 * exactly; the host reference is likewise the pair's host references
 * exactly. Fastest as weft_rmsnorm says, and with out and out_stride
 * multiples of 8 bytes (16-byte rows of the input). out and scales must
 * not overlap each other or any input, nor sum_out.
 * NaN/Inf: those of the two calls it stands for: a NaN in s = in +
 * residual makes the row's out NaN and its scale FLT_MIN; an Inf in s (or
 * squares that overflow fp32) makes its own positions NaN, every finite
 * one 0 and the scale FLT_MIN; a normalized value past dtype's range (an
 * fp16 row times a large weight) rounds to Inf, which makes the scale
 * Inf, that element NaN and the row's finite ones 0. eps = 0 on a row of
 * zeros gives NaN. */
int weft_rmsnorm_fp8(void *stream, weft_dtype dtype, weft_dtype out_type, void *out, float *scales,
                     void *sum_out, const void *in, const void *residual, const void *weight,
                     float eps, size_t rows, size_t cols, size_t stride, size_t out_stride);

/* ---- 2:4 structured sparsity ------------------------------------------ */

/* Prunes each row of w (rows x cols, row-major, ld elements apart; cols a
 * multiple of 4) to the 2:4 pattern in place: of every four consecutive
 * elements of a row, the two of largest magnitude stay and the other two
 * become +0 (of equal magnitudes the earlier stays; NaN counts as larger
 * than any number). dtype bf16, fp16 or fp32; host and GPU prune alike,
 * bit for bit. A row keeps half its elements, in the pattern the GPU's
 * sparse tensor cores multiply at twice the dense rate. */
int weft_prune_2_4(void *stream, weft_dtype dtype, void *w, size_t rows, size_t cols, size_t ld);

/* A Linear layer's weight W, n x k (row-major, ldw elements apart: the
 * layout weft_matmul's B takes with trans_b), in the 2:4 pattern (at most
 * two nonzeros in each four consecutive elements of a row; weft_prune_2_4
 * makes it so), kept in the form weft_matmul_sparse multiplies: on a GPU
 * compressed by cuSPARSELt (half the values and their 2-bit positions),
 * on the host a copy of the pruned rows. */
typedef struct weft_sparse_weight weft_sparse_weight;

/* Makes *out from w (type bf16 or fp16; k a multiple of 4; ldw >= k, 0
 * meaning k) for the backend stream names: NULL for the host (w host
 * memory), a cudaStream_t for the GPU that is current (w device memory;
 * a build without cuSPARSELt refuses it, saying so), WEFT_TASK_STREAM for
 * the calling task's (after its earlier work, which the call awaits). The
 * call is synchronous, a once-per-weight step at load: it reads w, refuses
 * a w that is not 2:4 (WEFT_EINVAL naming the first row and group that is
 * not), and on a GPU compresses it on the stream and waits. w is not kept;
 * the weight owns its memory until weft_sparse_weight_destroy. GPU: the
 * cuSPARSELt rules below apply to w too (16-byte aligned, ldw a multiple of
 * 16 bytes); on both backends, so that a weight valid on one is valid on
 * the other. */
int weft_sparse_weight_create(void *stream, weft_dtype type, const void *w, size_t n, size_t k,
                              size_t ldw, weft_sparse_weight **out);

/* Frees w, once every call that uses it has completed. NULL is a no-op. */
void weft_sparse_weight_destroy(weft_sparse_weight *w);

/* The bytes of w that a product reads: on a GPU cuSPARSELt's compressed
 * form (about 9/16 of the dense weight's: half the values and their
 * positions), on the host the pruned copy (n k elements). */
size_t weft_sparse_weight_bytes(const weft_sparse_weight *w);

/* weft_matmul with B = W, the sparse weight: D = act(alpha A W^T + beta C
 * + bias), A m x k, D and C m x n. desc as weft_matmul takes it, with: type
 * and in_type the weight's (in_type 0 or type; D, C and bias of type),
 * trans_a 0 and trans_b 1 (W's layout), n and k the weight's, ldb 0, batch
 * 0 or 1, any act (on the GPU a GELU runs as a pass over D after the
 * product: cuSPARSELt's GELU epilogue is for its INT8 kernels), no aux and
 * no quantized fields. Arithmetic as weft_matmul's: the host runs
 * weft_matmul on the pruned copy (so its result is weft_matmul's on the
 * pruned W, bit for bit), the GPU cuSPARSELt's sparse kernels with fp32
 * sums. Layout rules, on both backends: A, C, D and bias 16-byte aligned,
 * lda, ldc and ldd multiples of 16 bytes. A weight made for the host with
 * a GPU stream, or for another GPU, is refused; so are shapes cuSPARSELt
 * refuses (the message names its status). On the GPU a plan is made per
 * (m, leading dimensions, C, bias pointer, activation) on first use and
 * kept with the weight. cuSPARSELt multiplies m in multiples of 16: other
 * m (decode's rows) run on padded copies of A's and D's rows, through
 * stream-ordered allocations (inside a capture, the graph's own, as is a
 * captured product's workspace). */
int weft_matmul_sparse(void *stream, const weft_matmul_desc *desc, void *d, const void *a,
                       const weft_sparse_weight *w, const void *c);

/* ---- mixture of experts ------------------------------------------------ */

/* The router's score of a logit x. */
typedef enum weft_moe_score {
    WEFT_MOE_SOFTMAX = 0, /* exp(x - max) / sum over the token's experts */
    WEFT_MOE_SIGMOID = 1  /* 1 / (1 + exp(-x)), each expert on its own */
} weft_moe_score;

/* What weft_moe_gate writes; every array is required, 4-byte aligned and
 * memory of the call's backend. With tokens T, experts E and k slots:
 *   weights [T][k] fp32, ids [T][k] int32: token t's slot j holds its j-th
 *     largest expert (see weft_moe_gate) and that expert's weight;
 *   offsets [E + 1] int32: offsets[e] = rows routed to experts < e, so
 *     expert e's rows are [offsets[e], offsets[e+1]) and offsets[E] = T k;
 *   perm [T k] int32: the routed rows in expert order: row p (in
 *     [offsets[e], offsets[e+1])) is the pair perm[p] = t k + j with
 *     ids[t][j] = e; within an expert the pairs are in token order (a
 *     token picks an expert at most once, so the order is total);
 *   inverse [T k] int32: inverse[t k + j] = the row p with perm[p] = t k + j.
 * These are the tables weft_moe_permute, weft_grouped_matmul and
 * weft_moe_unpermute read. */
typedef struct weft_moe_routing {
    float *weights;
    int32_t *ids;
    int32_t *offsets;
    int32_t *perm;
    int32_t *inverse;
} weft_moe_routing;

/* The router of a mixture-of-experts layer: logits [tokens][experts] (rows
 * stride elements apart, of dtype) to each token's k experts, their
 * weights and the routing tables of weft_moe_routing, on the device with
 * no host round trip (so it can be captured into a CUDA graph).
 * Selection: a token's k experts are those of its k largest logits (the
 * scores are increasing in the logit, so these are its k largest scores,
 * decided without rounding), ties broken by the lower expert index, in
 * slot order largest first; -0 ties with +0. ids and the tables are
 * therefore the same on every backend, bit for bit.
 * Weights: score (above) of each chosen expert in fp32; with renormalize,
 * each divided by the sum of the token's k scores (Mixtral: softmax and
 * renormalize; Qwen-MoE: softmax, renormalize as its config says;
 * DeepSeek-style: sigmoid and renormalize). The host computes exp as the
 * other ops do (correctly rounded); the kernels' weights agree within
 * 1e-5 relative (their softmax sums in another order).
 * Sizes: 1 <= k <= 8, k <= experts <= 256, tokens >= 1, tokens * k <
 * 2^31, stride >= experts.
 * NaN: a NaN logit ranks below every number (-Inf too; among NaNs the
 * lower index first), so it is chosen only when fewer than k experts have
 * numbers; ids stay valid expert indices and the tables complete whatever
 * the logits. A NaN in a token's logits makes all its softmax weights NaN
 * (the sum is NaN); with sigmoid only a chosen NaN's weight is NaN, and
 * with renormalize all of that token's. +Inf: softmax weights NaN (Inf -
 * Inf), as are those of a token whose logits are all -Inf; sigmoid gives
 * 1 for +Inf and 0 for -Inf. A renormalized token whose k sigmoid scores
 * are all 0 (logits below ~-88.7, where exp(-x) overflows) gets 0 / 0 =
 * NaN. */
int weft_moe_gate(void *stream, weft_dtype dtype, weft_moe_score score, int renormalize,
                  const void *logits, size_t tokens, size_t experts, size_t stride, size_t k,
                  const weft_moe_routing *out);

/* The experts' input in expert order: out row p = in row perm[p] / k, for
 * the tokens * k rows p (cols elements; rows of in stride in_stride, of
 * out out_stride, both >= cols). perm is weft_moe_gate's table (device
 * memory with a stream); values outside [0, tokens k) are undefined
 * behaviour (the GPU cannot check them before it runs). out must not
 * overlap in. A copy: exact on every backend. */
int weft_moe_permute(void *stream, weft_dtype dtype, void *out, const void *in, const int32_t *perm,
                     size_t tokens, size_t k, size_t cols, size_t in_stride, size_t out_stride);

/* The experts' outputs combined per token:
 *   out[t] = sum over j < k of weights[t][j] * y[inverse[t k + j]]  (+ residual[t])
 * summed in fp32 in slot order, the residual (optional, NULL = none; rows
 * out_stride apart, like out) added last, rounded to dtype once. y has
 * tokens * k rows of cols elements, y_stride apart. weights and inverse are
 * weft_moe_gate's (fp32 and int32). out may be residual; it must not
 * overlap y. Bit for bit the same on every backend (the kernels round each
 * product and sum as the host does, no fused multiply-adds).
 * NaN/Inf: IEEE arithmetic; a NaN weight or y row spreads to the row. */
int weft_moe_unpermute(void *stream, weft_dtype dtype, void *out, const void *y,
                       const float *weights, const int32_t *inverse, const void *residual,
                       size_t tokens, size_t k, size_t cols, size_t y_stride, size_t out_stride);

/* One call of weft_grouped_matmul: groups problems sharing n and k. */
typedef struct weft_grouped_matmul_desc {
    size_t groups;   /* G >= 1 (the experts) */
    size_t rows;     /* X's and Y's rows, >= 1: the capacity, tokens * k */
    size_t n, k;     /* each >= 1 */
    weft_dtype type; /* of X, W, bias and Y: WEFT_DTYPE_BF16 or WEFT_DTYPE_F16 */
    size_t ldx, ldy; /* leading dimensions in elements; 0 means k and n */
    weft_matmul_act act;
    const void *bias;     /* [G][n] of type, group g's row added to its rows; NULL = none */
    uint64_t reserved[8]; /* must be zero */
} weft_grouped_matmul_desc;

/* For each group g, the rows r in [offsets[g], offsets[g+1]) of X:
 *   Y[r] = act(X[r] W_g^T + bias_g)
 * with W [G][n][k] row-major (W_g is group g's n x k matrix, the layout of
 * a Linear layer's weight), X rows x k (ldx) and Y rows x n (ldy). offsets
 * (G + 1 int32: weft_moe_gate's table) is read where the work runs - on
 * the GPU by the kernel itself, so the sizes of the groups never reach the
 * host and the call can be captured into a graph. It must be nondecreasing
 * with 0 <= offsets[0] and offsets[G] <= rows. A host call on the NULL
 * stream refuses other tables with WEFT_EINVAL; where the table is read
 * only when the work runs (the kernel, or the host reference in a task's
 * stream order) each offset is clamped into [0, rows] and a group whose
 * end is not past its start is skipped, so no table makes the call read or
 * write outside X, W and Y (the rows a bad table names get unspecified
 * values). Rows outside [offsets[0], offsets[G]) are not written. A group
 * of no rows is skipped.
 * Arithmetic: products summed in fp32 (blocks of 16 on the GPU's tensor
 * cores, the host's BLAS in blocks of its own), the epilogue in fp32, Y
 * rounded once: results agree to the type's rounding and the sums' length
 * (~1e-2 relative for bf16), as weft_matmul's do.
 * GPU: X and W 16-byte aligned with k and ldx multiples of 8 get the
 * asynchronous-copy pipeline; anything aligned to its element works.
 * Bad arguments (sizes, a type other than bf16/fp16, leading dimensions
 * below the row, NULL or misaligned pointers, Y the same buffer as X or W,
 * nonzero reserved) return WEFT_EINVAL before anything is enqueued, as
 * does a GPU call of more tiles than its grid holds (n or rows near 2^31);
 * a host call in a build without a BLAS returns WEFT_EINVAL ("built
 * without a host BLAS"). Y must not overlap X, W or the bias.
 * NaN/Inf: IEEE arithmetic, as weft_matmul. */
int weft_grouped_matmul(void *stream, const weft_grouped_matmul_desc *desc, void *y, const void *x,
                        const void *w, const int32_t *offsets);
/* ---- 2-D convolution -------------------------------------------------- */

/* The activation after a convolution's bias. */
typedef enum weft_conv_act {
    WEFT_CONV_ACT_NONE = 0,
    WEFT_CONV_ACT_RELU = 1 /* max(x, 0); ReLU(NaN) = NaN */
} weft_conv_act;

/* A 2-D convolution (cross-correlation, as deep-learning frameworks mean
 * it), all tensors packed, channels last:
 *   in   n x h x w x c             (NHWC)
 *   w    k x r x s x (c / groups)  (KRSC, also called OHWI: PyTorch's
 *                                   weight [k][c/groups][r][s] in
 *                                   channels_last memory order)
 *   bias k
 *   out  n x oh x ow x k           (NHWC)
 * with oh = (h + 2 pad_h - dilation_h (r - 1) - 1) / stride_h + 1 (floor)
 * and ow likewise, and, for output channel o of group g = o / (k / groups):
 *   out[b][y][x][o] = act(bias[o] + sum over i < r, j < s, ci < c / groups
 *       of in[b][y stride_h + i dilation_h - pad_h]
 *              [x stride_w + j dilation_w - pad_w][g c / groups + ci]
 *          * w[o][i][j][ci])
 * where input positions outside h x w read zero (the padding).
 * groups == c == k is the depthwise convolution.
 *
 * Zero means the default in stride, dilation and groups (1). reserved must
 * stay zero (room for later fields, zero meaning "off"). */
typedef struct weft_conv2d_desc {
    size_t n, h, w, c; /* the input, each >= 1 */
    size_t k;          /* output channels, >= 1 */
    size_t r, s;       /* the filter's height and width, each >= 1 */
    size_t stride_h, stride_w;
    size_t pad_h, pad_w; /* zeros on each side */
    size_t dilation_h, dilation_w;
    size_t groups;    /* divides c and k */
    weft_dtype dtype; /* of every tensor of weft_conv2d */
    weft_conv_act act;
    /* Let fp32 convolutions use the matrix units' TF32 mode (10-bit
     * mantissas, ~3e-4 relative) on the GPU; the host computes fp32. */
    int allow_tf32;
    uint64_t reserved[8];
} weft_conv2d_desc;

/* The output's height and width (oh, ow above) of a valid descriptor;
 * WEFT_EINVAL as weft_conv2d would refuse it otherwise. */
int weft_conv2d_output_size(const weft_conv2d_desc *desc, size_t *oh, size_t *ow);

/* BatchNorm folded into the convolution before it, once, at plan time:
 * conv followed by y = (x - mean) / sqrt(var + eps) * gamma + beta is the
 * convolution with
 *   scale[o]    = gamma[o] / sqrt(var[o] + eps)
 *   w_out[o][.] = w[o][.] * scale[o]
 *   bias_out[o] = beta[o] + (conv_bias[o] - mean[o]) * scale[o]
 * each operation in fp32 and rounded to fp32 in that order, w_out and
 * bias_out rounded once to desc->dtype; the host and the GPU agree bit for
 * bit (NaNs aside, whose bits the GPU's arithmetic makes its own).
 * desc is the convolution's, checked as weft_conv2d checks it; its k, r,
 * s, c, groups and dtype give the tensors: w and w_out are KRSC of
 * desc->dtype, conv_bias (optional: NULL = zero) and bias_out k elements
 * of desc->dtype; gamma, beta, mean and var are k elements of bn_dtype
 * (often fp32 beside 16-bit weights). eps > 0 and finite. w_out may be w
 * and bias_out conv_bias (in place); no other overlap.
 * A negative variance is not checked (on a stream it is read when the
 * kernel runs): where var + eps is not > 0 (or is NaN) the channel's scale
 * is NaN, and so are its folded weights and bias, on both backends - a
 * broken statistic shows instead of being hidden.
 * On a stream this is one small kernel. */
int weft_conv2d_fold_bn(void *stream, const weft_conv2d_desc *desc, weft_dtype bn_dtype,
                        void *w_out, void *bias_out, const void *w, const void *conv_bias,
                        const void *gamma, const void *beta, const void *mean, const void *var,
                        float eps);

/* out = act(conv(in, w) + bias), as weft_conv2d_desc says; bias (k
 * elements) is required (a folded BatchNorm gives one; pass zeros for
 * none). out must not overlap in, w or bias.
 * Arithmetic: the host reference is the direct loop of the definition,
 * products of the stored values summed in fp32 (in blocks, as
 * ops.h's sums) over i, j, ci in that order, the bias added, the
 * activation applied and out rounded once. The GPU runs the convolution,
 * bias and activation as one kernel (fp32 accumulation, TF32 only when
 * asked): a 1x1 convolution of stride 1 without padding or groups is a
 * matrix product over the NHWC rows, run as weft_matmul with its bias and
 * ReLU epilogue; any other shape is one cuDNN operation graph (convolution,
 * bias add, ReLU), or, where no engine of cuDNN's graph takes it, cuDNN's
 * legacy fused convolution-bias-activation. Its sums run in another order
 * (and its 16-bit kernels may round intermediate tiles), so results agree
 * to the type's rounding and the sum's length (~1e-5 relative for fp32,
 * ~1e-2 for bf16), not bit for bit.
 * GPU: channel counts c / groups and k / groups that are multiples of 8
 * and 16-byte aligned tensors get cuDNN's tensor-core kernels. Where
 * cuDNN's legacy fused call refuses a shape too, weft runs cuDNN's
 * convolution and then the bias add and the ReLU as separate passes: the
 * same result, slower; only a shape cuDNN cannot convolve at all is
 * refused (below). cuDNN's plans are made per device, shape, type,
 * activation and alignment on a shape's first call (its heuristic, and
 * for the graph the engines' finalization, which may compile a kernel:
 * ~100 us to 100s of ms) and kept (the graph's per thread); each stream gets a workspace
 * of weft's the first time it runs a convolution, and each thread a cuDNN
 * handle per device. A task that calls it on its stream needs a stack of
 * 1 MiB (weft_task_opts.stack_size or the runtime's): cuDNN's calls use
 * some 200 KiB of stack (on a smaller one, its guard reports the overflow).
 * Calls captured into a CUDA
 * graph run with no workspace (a graph may run beside another on the same
 * stream), on the algorithms that need none (the one the shape's other
 * calls take, when it needs none); make a shape's first call outside the
 * capture, as cuDNN may build its kernels then.
 * Bad arguments (a zero size, an output size <= 0, groups that do not
 * divide c and k, NULL or misaligned pointers, an unknown dtype or
 * activation, TF32 asked of a 16-bit type, sizes that overflow, overlap of
 * out with an input) return WEFT_EINVAL before anything is enqueued; so
 * do shapes cuDNN does not support (the message names the shape, types
 * and cuDNN's status), and, in a library built with CUDA but without
 * cuDNN, every call on a stream ("built without cuDNN"). A split call
 * whose bias add or ReLU fails after its convolution was enqueued returns
 * WEFT_EDEVICE.
 * NaN/Inf: IEEE arithmetic; a NaN in the input reaches every output
 * element whose window holds it, and ReLU keeps it (cuDNN is asked to
 * propagate NaNs). */
int weft_conv2d(void *stream, const weft_conv2d_desc *desc, void *out, const void *in,
                const void *w, const void *bias);

/* ---- attention ---------------------------------------------------------- */

/* What weft_attention computes. For every sequence b < batch, query head h
 * < heads and query i < Lq of the sequence (Lq queries and Lk keys, below):
 *   s_j = scale * dot(q_i, k_j)            for the keys j < Lk it sees
 *   o_i = sum_j softmax(s)_j v_j,   lse_i = log(sum_j exp(s_j))
 * with k and v those of kv head h / (heads / kv_heads): grouped-query
 * attention (kv_heads = 1 is multi-query). Query i sees key j unless
 *   causal:  j > i + (Lk - Lq)   (the queries are the LAST Lq of the Lk
 *            positions: aligned at the bottom right, as FlashAttention 2
 *            aligns them, so queries that continue a cached prefix of Lk -
 *            Lq keys see the prefix and themselves; with Lq > Lk the first
 *            Lq - Lk queries see nothing)
 *   window:  j <= i + (Lk - Lq) - window   (a sliding window as Mistral's:
 *            each query sees at most `window` keys, itself included; it is
 *            FlashAttention's window_size (window - 1, 0))
 * A query that sees no key gets o = 0 and lse = -Inf.
 *
 * Layouts. Tokens are rows: Q's rows hold heads * head_dim elements (head
 * h at h * head_dim), K's and V's kv_heads * head_dim, O's like Q's; row r
 * of each starts stride elements after row r-1 (q_stride, ...: 0 means
 * packed), so Q, K and V may be views into one fused projection's output.
 *  - dense (cu_seqlens_q and cu_seqlens_k NULL): [batch][seq][heads][dim];
 *    sequence b's queries are rows b * seq_q .. b * seq_q + seq_q - 1 and
 *    its keys rows b * seq_k ...; Lq = seq_q, Lk = seq_k.
 *  - packed, variable lengths (both tables given): cu_seqlens_q and
 *    cu_seqlens_k are batch + 1 int32 prefix sums (FlashAttention's
 *    varlen tables), memory of the call's backend (on the GPU read by the
 *    kernel, so they never come back to the host): sequence b's queries
 *    are rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1, its keys likewise;
 *    seq_q and seq_k are the longest sequence's lengths (the grid's size),
 *    and each sequence's Lq and Lk are its table's difference clamped into
 *    [0, seq_q] and [0, seq_k]. A host call on the NULL stream refuses a
 *    table that is not nondecreasing from cu[0] >= 0 or whose lengths
 *    exceed seq_q / seq_k; where a table is read only when the work runs
 *    (the kernel, or the host reference in a task's stream order), the
 *    clamp is all the checking there is: a table whose rows run past the
 *    end of Q, K, V or O (or the LSE's stride) is undefined behaviour. A
 *    sequence of 0 queries or keys is allowed anywhere (0 keys: its
 *    queries see nothing).
 *
 * Zero means the default in every field, so a zeroed struct with dtype,
 * batch, heads, head_dim and the lengths set is plain dense attention.
 * reserved must stay zero. */
typedef struct weft_attention_desc {
    weft_dtype dtype;    /* of Q, K, V and O: WEFT_DTYPE_BF16 or WEFT_DTYPE_F16 */
    size_t batch;        /* sequences, >= 1 (at most 65535) */
    size_t heads;        /* query heads, >= 1 (at most 65535) */
    size_t kv_heads;     /* key and value heads, dividing heads; 0 means heads */
    size_t head_dim;     /* 64, 128 or 256 */
    size_t seq_q, seq_k; /* dense lengths, or varlen's longest: 1 .. 2^31 - 257 */
    const int32_t *cu_seqlens_q, *cu_seqlens_k;    /* varlen: both, or neither */
    size_t q_stride, k_stride, v_stride, o_stride; /* elements; multiples of 8 */
    float scale;   /* multiplies the scores; 0 means 1 / sqrt(head_dim) */
    int causal;    /* nonzero: the bottom-right causal mask above */
    size_t window; /* >= 1: the sliding window above (needs causal); 0: none */
    /* The log-sum-exp of each query's scaled scores (natural log), fp32:
     * lse[h * lse_stride + r] for query head h and Q row r. Optional (NULL:
     * not written); 4-byte aligned. lse_stride 0 means batch * seq_q
     * (dense); varlen calls with lse must give it (>= the rows of Q). */
    float *lse;
    size_t lse_stride;
    /* Rotary position embedding applied to Q and K as they are read, as
     * weft_rope defines it (layout, base: 0 means 10000; angles in double,
     * sine and cosine rounded to fp32, the rotation in fp32) and rounded to
     * the dtype as weft_rope would store them: the result is weft_rope on Q
     * and K followed by attention, without Q and K's round trip. Positions
     * are int32 per row, q_positions[r] for Q's row r, k_positions[r] for
     * K's row r (memory of the call's backend); both, or neither (no
     * rotation). */
    const int32_t *q_positions, *k_positions;
    weft_rope_layout rope_layout;
    float rope_base;
    uint64_t reserved[8];
} weft_attention_desc;

/* Attention forward, O = softmax(scale Q K^T + mask) V, as
 * weft_attention_desc says, in one pass: the scores and probabilities
 * never reach memory (FlashAttention's online softmax: a running maximum
 * and sum per query over the keys in blocks).
 * Arithmetic: Q, K and V are read as stored (after the rotation, when
 * asked), scores and sums are fp32, O is rounded once to the dtype.
 * The host reference sums each dot product in fp32 (in four interleaved
 * partial sums) and the softmax as weft_softmax does (maximum first,
 * exp correctly rounded); the GPU kernel (weft's own, FlashAttention-2
 * style on the tensor cores) sums in its own order, uses exp2 with the
 * scale folded in, and rounds the probabilities to the dtype before they
 * multiply V, so results agree to the dtype's rounding and the length of
 * the sums (~1e-2 relative for bf16, ~3e-3 for fp16), the LSE to ~1e-5.
 * With RoPE the GPU forms each angle in double and reduces it modulo 2 pi
 * in double, then takes the fp32 sine and cosine of the reduced angle:
 * within ~2.5e-7 of the host's correctly rounded ones, so a rotated
 * element may round to the neighbouring value of the dtype.
 * Requirements: Q, K, V and O 16-byte aligned with strides that are
 * multiples of 8 elements (the GPU copies 16-byte chunks; the host asks
 * the same, so a call valid on one backend is valid on the other); O must
 * not overlap Q, K, V, the tables or the LSE. head_dim 256 on the GPU
 * takes 193 KiB of shared memory a block (Hopper's SMs have 227; where an
 * SM has less, the launch's refusal is returned with CUDA's error name).
 * Bad arguments (a zero size, a dtype other than bf16/fp16, a head_dim
 * other than 64, 128 or 256, kv_heads not dividing heads, a window without
 * causal, only one of the two tables or two position arrays, a NULL or
 * misaligned tensor, strides below the row or not multiples of 8, more
 * than 65535 sequences or heads, lengths or sizes past their limits,
 * nonzero reserved, a bad table on the NULL stream) return
 * WEFT_EINVAL before anything is read or enqueued.
 * NaN/Inf: IEEE arithmetic; a NaN in a score a query sees makes its row and
 * its LSE NaN, a NaN or Inf in a value row it sees reaches its row (NaN
 * or Inf). On the GPU a non-finite value row may also reach the rows of
 * its sequence and kv head that are masked from it (they multiply it by 0
 * within a block of keys). */
int weft_attention(void *stream, const weft_attention_desc *desc, void *o, const void *q,
                   const void *k, const void *v);

/* ---- paged KV cache and decode attention ------------------------------- */

/* How the pools hold their elements. */
typedef enum weft_kv_format {
    WEFT_KV_DTYPE = 0, /* elements of the cache's dtype */
    /* one byte an element: OCP FP8 E4M3 (bias 7, largest 448, no
     * infinities), stored raw, meaning byte's value times the kv head's
     * fp32 scale (k_scale or v_scale). This is the cache's own flag: it
     * is not a weft_dtype. */
    WEFT_KV_FP8_E4M3 = 1
} weft_kv_format;

/* An LLM's key/value cache in fixed-size pages. Two pools, k and v, each
 *   [pages][page_size][kv_heads][head_dim]
 * of dtype (WEFT_DTYPE_BF16 or WEFT_DTYPE_F16) or, with format
 * WEFT_KV_FP8_E4M3, of FP8 bytes; both 16-byte aligned. A sequence's
 * tokens live in the pages its row of the block table names: token t of
 * sequence s is slot t % page_size of page
 * block_table[s * max_pages + t / page_size] (int32, 4-byte aligned). Pages
 * need not be contiguous nor in order; sequences may share a page for
 * reading (a common prefix), and an append writes the slot its table
 * names whoever else reads it.
 * page_size is a power of two from 16 to 256; head_dim is 64 or 128;
 * kv_heads, pages, seqs and max_pages are >= 1, and max_pages * page_size
 * (a sequence's capacity in tokens) and the pools' element counts fit in
 * int32 and size_t. dtype is also the type of everything the calls take
 * besides the pools (the new keys and values, q, out). With FP8, k_scale
 * and v_scale are fp32 [kv_heads] (4-byte aligned; read where the work
 * runs, positive and finite, else the results are unspecified); without,
 * they must be NULL. With a stream every pointer is device memory; with
 * NULL, host memory. */
typedef struct weft_kv_cache {
    weft_dtype dtype;
    void *k, *v;
    size_t pages, page_size, kv_heads, head_dim;
    const int32_t *block_table;
    size_t seqs, max_pages;
    weft_kv_format format;
    const float *k_scale, *v_scale;
    uint64_t reserved[4]; /* must be zero */
} weft_kv_cache;

/* RoPE fused into weft_kv_append (on K) and weft_attention_decode (on
 * Q): the rotation weft_rope_scaled gives (same layouts, same angle
 * position * inverse frequency formed in double, same fp32 rotation and
 * rounding), so the results equal weft_rope_scaled's bit for bit on the
 * host. base > 0 and finite; scaling as weft_rope_scaled takes it (NULL:
 * none). */
typedef struct weft_kv_rope {
    weft_rope_layout layout;
    float base;
    const weft_rope_llama3 *scaling;
} weft_kv_rope;

/* Writes tokens new keys and values into their pages: token t (row t of k,
 * k_stride elements apart, holding kv_heads * head_dim elements; likewise
 * v) belongs to sequence seq_ids[t] at position positions[t] (int32 arrays
 * of tokens entries), and is written to slot positions[t] % page_size of
 * page block_table[seq_ids[t]][positions[t] / page_size] of both pools.
 * With rope (NULL = none) K is rotated on the way by the angle of
 * positions[t], as weft_kv_rope says; V is copied. FP8 pools get each
 * element (K after its fp32 rotation, before any rounding to dtype)
 * divided by its head's scale in fp32 and rounded once to E4M3, to
 * nearest even, values beyond 448 in magnitude saturating to +-448 (NaN
 * stays NaN). Tokens of several sequences and several tokens of one
 * sequence may come in one call; two tokens naming the same slot leave
 * either's values. k_stride and v_stride >= kv_heads * head_dim (0 means
 * that); k and v aligned to their element. On the GPU the append is one
 * small kernel (each work item a rotation pair of K and the same two
 * elements of V).
 * The table, seq_ids and positions are read where the work runs. A host
 * call on the NULL stream refuses a seq_id outside [0, seqs), a position
 * outside [0, max_pages * page_size) and a table entry outside [0, pages)
 * with WEFT_EINVAL before writing anything; the GPU (and the host in a
 * task's stream order) skips such a token - it writes nothing for it and
 * never writes outside the pools.
 * Bad arguments (as above, and a cache weft_kv_cache does not allow)
 * return WEFT_EINVAL before anything is enqueued. */
int weft_kv_append(void *stream, const weft_kv_cache *cache, const void *k, size_t k_stride,
                   const void *v, size_t v_stride, size_t tokens, const int32_t *seq_ids,
                   const int32_t *positions, const weft_kv_rope *rope);

/* Attention over a paged cache: weft_attention whose keys and values are
 * those weft_kv_append wrote into cache's pages, for prefill that
 * continues a cached prefix (chunked prefill, shared prompt prefixes) and
 * for steps that mix several sequences' chunks. Sequence b < desc->batch
 * (at most cache->seqs) is row b of the cache's block table: its keys are
 * positions 0 .. Lk - 1, Lk = seq_lens[b] (int32, read where the work
 * runs) clamped into [0, seq_k]; its queries are desc's, dense (seq_q a
 * sequence) or packed by cu_seqlens_q, and under causal they are the last
 * Lq of the Lk positions (the chunk's own keys appended before the call).
 * desc as weft_attention takes it, except: dtype is the cache's, kv_heads
 * and head_dim 0 or the cache's; seq_k the longest length (0: the table's
 * capacity, max_pages * page_size, its limit); cu_seqlens_k, k_positions,
 * k_stride and v_stride zero. q_positions (optional) rotates Q as it is
 * read; the cache's keys are stored rotated (weft_kv_append's rope).
 * Pages of the cache's dtype only (an FP8 cache is refused: FP8 pages are
 * weft_attention_decode's). The arithmetic, the masks, an unseen query's
 * zeros and -Inf LSE, and the requirements on Q and O are weft_attention's,
 * and so are the results: on either backend the same as weft_attention
 * over the same keys and values laid out densely, bit for bit (the keys
 * are read in the same order). On the NULL stream a length outside [0,
 * seq_k] or a table entry outside [0, pages) among the pages a length
 * uses is refused with WEFT_EINVAL before anything is written; where the
 * tables are read too late to refuse they are clamped (lengths into [0,
 * seq_k], entries into [0, pages - 1]): nothing outside the pools is read. */
int weft_attention_paged(void *stream, const weft_kv_cache *cache, const weft_attention_desc *desc,
                         const int32_t *seq_lens, void *o, const void *q);

/* The shape and options of one weft_attention_decode. reserved must stay
 * zero. */
typedef struct weft_attention_decode_desc {
    size_t q_len;  /* queries per sequence, 1 to 8 (speculative decoding's k + 1) */
    size_t heads;  /* query heads, a multiple of the cache's kv_heads (GQA; MQA at kv_heads 1) */
    float scale;   /* of the scores; 0 means 1 / sqrt(head_dim) */
    size_t window; /* sliding window: a query sees its own position and the
                    * window - 1 before it; 0 = no window */
    /* the longest seq_lens entry the caller will pass, <= the capacity
     * max_pages * page_size; 0 means the capacity. It sizes the split
     * (and the workspace), and lengths above it are refused or clamped
     * (see weft_attention_decode). */
    size_t max_seq_len;
    /* how many parts each sequence's keys are split into across thread
     * blocks (flash-decoding): 0 = the call chooses (more parts where
     * seqs x kv_heads cannot fill the GPU), 1 = never split, n > 1 = n
     * parts (at most one a page). The host reference never splits. */
    size_t splits;
    /* elements from one query row (a token's heads) of q to the next: 0
     * means heads * head_dim (packed); a multiple of 8, >= that, so q may
     * be a view into a fused projection's rows. out is always packed. */
    size_t q_stride;
    /* RoPE on the queries as they are read (NULL: q is taken as it is):
     * query i of sequence b is turned by the angle of its position
     * seq_lens[b] - q_len + i and rounded to the dtype, as
     * weft_rope_scaled would leave it in q, which stays unchanged; with
     * the keys appended under the same rope, a decode step needs no RoPE
     * call of its own. */
    const weft_kv_rope *q_rope;
    uint64_t reserved[2];
} weft_attention_decode_desc;

/* Bytes of workspace weft_attention_decode needs for this cache and desc
 * (the same on every backend and device; 0 when the call never splits),
 * in *bytes. WEFT_EINVAL for what weft_attention_decode would refuse. */
int weft_attention_decode_workspace(const weft_kv_cache *cache,
                                    const weft_attention_decode_desc *desc, size_t *bytes);

/* Decode attention over the paged cache. For sequence b (of cache->seqs),
 * with L = seq_lens[b] keys in its pages, query i (< q_len) of head h sits
 * at position p = L - q_len + i and sees keys j in [lo, p], lo = 0 or,
 * with a window, max(0, p - window + 1) (causal among the queries: query i
 * sees the i earlier queries' keys, which weft_kv_append has written):
 *   s_j = scale * dot(q[b][i][h], K[j]),  K and V of kv head h / (heads / kv_heads)
 *                                         (FP8: each element times its head's scale)
 *   out[b][i][h] = sum_j exp(s_j - m) V[j] / sum_j exp(s_j - m),  m = max s_j
 *   lse[b][i][h] = m + log(sum_j exp(s_j - m))   (natural log)
 * q and out are [seqs][q_len][heads][head_dim] of the cache's dtype
 * (q's rows q_stride apart), 16-byte aligned; lse (optional, NULL = none) is fp32
 * [seqs][q_len][heads]. A query that sees no key (L = 0, or p < 0 when L < q_len) gets zeros and
 * lse = -Inf. seq_lens is int32 [seqs], read where the work runs.
 * Arithmetic: dot products and sums in fp32; exp and log correctly
 * rounded to fp32 on the host, exp2f-based in the kernels (within a few
 * units of fp32); out rounded once. The kernels sum in another order
 * (and, split, merge the parts by their log-sum-exps), so results agree
 * with the host to the dtype's rounding, not bit for bit.
 * workspace: workspace_bytes >= weft_attention_decode_workspace's answer
 * (NULL with 0 when that is 0), 16-byte aligned, device memory with a
 * stream; it holds the split parts and may be reused by the next call on
 * the stream. The call allocates nothing and asks the host nothing once
 * launched, so it can be captured into a CUDA graph.
 * Lengths and pages: a host call on the NULL stream refuses a seq_lens
 * entry outside [0, max_seq_len] and a table entry outside [0, pages)
 * among those a sequence's keys use with WEFT_EINVAL before anything is
 * written. Where the lengths are read too late to refuse (the GPU, or the
 * host in a task's stream order) a length is clamped into [0,
 * max_seq_len] and a table entry into [0, pages - 1]: nothing outside the
 * pools is read, and the results of such a call are unspecified.
 * Bad arguments (a cache weft_kv_cache does not allow, heads not a multiple
 * of kv_heads, q_len outside 1..8, an unsupported head_dim, max_seq_len
 * over the capacity, a scale that is negative or not finite, a q_rope
 * weft_kv_rope does not allow, NULL or misaligned pointers, a short
 * workspace, out overlapping q, nonzero reserved) return WEFT_EINVAL
 * before anything is enqueued.
 * NaN/Inf: IEEE arithmetic; a NaN in a visible key, value or the query
 * makes the query's output NaN. On the GPU one pass serves a kv head's
 * whole group of queries, so a NaN value of a key that another query of
 * the group sees (q_len > 1, or a window) may reach this query's output
 * as well (a zero weight times NaN). */
int weft_attention_decode(void *stream, const weft_kv_cache *cache,
                          const weft_attention_decode_desc *desc, void *out, float *lse,
                          const void *q, const int32_t *seq_lens, void *workspace,
                          size_t workspace_bytes);

#ifdef __cplusplus
}
#endif

#endif
