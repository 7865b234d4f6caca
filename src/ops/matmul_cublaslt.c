/*
 * matmul_cublaslt.c - weft_matmul on the GPU, through cuBLASLt; calls that
 * weft__matmul_skinny_fits (matmul.c) go to the skinny kernel instead
 * (matmul_skinny.cu), before any of what follows is asked for. INT8
 * calls never fit it, FP8 ones only at decode's rows into a 16/32-bit D.
 *
 * Layout: cuBLASLt is column-major, weft row-major. A row-major m x n
 * matrix with leading dimension ld is the column-major n x m matrix with
 * the same ld, so D^T = op(B)^T op(A)^T is computed: cuBLASLt's A is our B
 * (with our trans_b), its B our A, its m our n. The bias, which cuBLASLt
 * adds per row of its D, is then per column of ours: one per output
 * feature, as a Linear layer wants.
 *
 * Epilogues: cuBLASLt's DEFAULT, BIAS, RELU(_BIAS), GELU(_BIAS) and
 * GELU_AUX(_BIAS); its GELU is the tanh form (so the host reference uses
 * that form for WEFT_MATMUL_ACT_GELU_TANH). The erf form has no epilogue:
 * the product is computed with the bias (into D), copied to aux when asked,
 * and weft_bias_gelu_residual's kernel turns D into GELU(D) in place.
 *
 * FP8: cuBLASLt's scales are per matrix of its own, so our scale_a (m
 * floats in the outer mode: its n) goes to its B and our scale_b to its A,
 * both in CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F mode or both scalars;
 * D's scale and amax pointers are passed as given. Its TN rule (its A
 * transposed, its B not) is our trans_b = 1, trans_a = 0, which matmul.c
 * asks. Without a C, an fp8 D's call passes C as NULL with beta 0 (its
 * C has a type of its own, bf16 or fp16, cuBLASLt's table, and cuBLASLt
 * refuses a C that is D under another layout). Its outer-vector scales
 * have no batched kernel on Hopper: a batched call in that mode runs as
 * one call a batch, the scales shared as the API says.
 *
 * INT8: cuBLASLt's int8 GEMM (CUBLAS_COMPUTE_32I, int32 alpha and beta)
 * writes the exact int32 product, into D for an int32 D; a bf16, fp16 or
 * fp32 D takes matmul_cublaslt_quant.c's path, a product into a buffer of
 * its own and then the dequantizing epilogue, on this file's two steps
 * (weft__matmul_lt_prepare, weft__matmul_lt_launch; matmul_cublaslt.h).
 *
 * What is kept, all of it for the process's life (a handful per shape and
 * per stream; nothing here is freed or changed once published, so lookups
 * take no lock and only inserts do):
 *  - one cuBLASLt handle per device;
 *  - plans: per (device, shape, types, transposes, leading dimensions,
 *    batch strides, epilogue, which of C/bias/aux are given, operand
 *    alignments, workspace), the matrix layouts and the algorithm the
 *    heuristic chose - the heuristic query is the cost of a first call
 *    (bench/matmul measures it). The matmul descriptor itself is built on
 *    the stack each call (cublasLtMatmulDescInit, a few stores): it holds
 *    the call's bias and aux pointers, and sharing one across threads
 *    would need a lock around the launch;
 *  - workspaces: one per stream, shared with weft's cuDNN calls
 *    (workspace.c); a call captured into a graph (graph mode's regions,
 *    explicit graphs) takes none, since a graph runs on whatever stream it
 *    is launched on, perhaps beside another captured on the same stream.
 * Creating a handle switches the thread to relaxed stream capture, so a
 * first call inside a captured region works.
 */
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/lock.h"
#include "cuda/status.h"
#include "ops/matmul.h"
#include "ops/matmul_cublaslt.h"
#include "ops/ops_internal.h"
#include "ops/workspace.h"

static const char OP[] = "weft_matmul";

enum { MAX_DEVICES = 64, BUCKETS = 512 };

static int lt_fail(const char *what, cublasStatus_t s)
{
    int rc = s == CUBLAS_STATUS_ALLOC_FAILED                                        ? WEFT_ENOMEM
             : s == CUBLAS_STATUS_INVALID_VALUE || s == CUBLAS_STATUS_NOT_SUPPORTED ? WEFT_EINVAL
                                                                                    : WEFT_EDEVICE;
    return weft__fail(rc, "%s: %s failed: %s (%s)", OP, what, cublasLtGetStatusName(s),
                      cublasLtGetStatusString(s));
}

int weft__matmul_lt_cuda_fail(const char *what, cudaError_t e)
{
    cudaGetLastError(); /* a refused call is not sticky: clear it */
    return weft__fail(weft__cuda_status(e), "%s: %s failed: %s (%s)", OP, what, cudaGetErrorName(e),
                      cudaGetErrorString(e));
}

/* ---- handles, one per device ------------------------------------------- */

static _Atomic(cublasLtHandle_t) handles[MAX_DEVICES];
static weft__lock handle_lock = WEFT__LOCK_INIT;

static int get_handle(int device, cublasLtHandle_t *out)
{
    cublasLtHandle_t h = atomic_load_explicit(&handles[device], memory_order_acquire);
    if (h) {
        *out = h;
        return WEFT_OK;
    }
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cublasStatus_t s = cublasLtCreate(&h);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (s != CUBLAS_STATUS_SUCCESS)
        return lt_fail("cublasLtCreate", s);
    weft__lock_acquire(&handle_lock);
    cublasLtHandle_t had = atomic_load_explicit(&handles[device], memory_order_relaxed);
    if (!had)
        atomic_store_explicit(&handles[device], h, memory_order_release);
    weft__lock_release(&handle_lock);
    if (had) { /* another thread made one first: keep that one */
        cublasLtDestroy(h);
        h = had;
    }
    *out = h;
    return WEFT_OK;
}

/* ---- plans ---------------------------------------------------------------- */

/* Everything the heuristic's answer depends on; compared bytewise, so it
 * is zeroed before it is filled. */
typedef struct plan_key {
    int device;
    int in_type, type, trans_a, trans_b, tf32, epilogue, has_c, has_bias, has_aux;
    int in_type_b, c_type, bias_type, scale_mode, has_scale_d, has_amax;
    uint64_t m, n, k, batch, lda, ldb, ldc, ldd, ldaux;
    uint64_t stride_a, stride_b, stride_c, stride_d, stride_aux;
    uint32_t align_a, align_b, align_c, align_d, align_bias, align_aux;
    uint64_t workspace;
} plan_key;

typedef struct weft__lt_plan {
    plan_key key;
    cublasLtMatrixLayoutOpaque_t la, lb, lc, ld; /* cuBLASLt's A (our B), B (our A), C, D */
    cublasLtMatmulAlgo_t algo;
    struct weft__lt_plan *next;
} plan;

static _Atomic(plan *) plan_buckets[BUCKETS];
static weft__lock plan_lock = WEFT__LOCK_INIT;
static atomic_ullong plan_hits, plan_misses;

void weft__matmul_cuda_plan_stats(unsigned long long *hits, unsigned long long *misses)
{
    *hits = atomic_load(&plan_hits);
    *misses = atomic_load(&plan_misses);
}

/* FNV-1a's steps over the key's 64-bit words rather than its bytes: a
 * byte at a time the 208-byte key cost ~0.2 us of every cached call. */
_Static_assert(sizeof(plan_key) % sizeof(uint64_t) == 0, "the key is whole words");

static unsigned key_hash(const plan_key *k)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i += sizeof h) {
        uint64_t w;
        memcpy(&w, (const char *)k + i, sizeof w);
        h = (h ^ w) * 1099511628211ull;
        h ^= h >> 29; /* the high bits back down, where the next word mixes */
    }
    return (unsigned)(h % BUCKETS);
}

static plan *plan_find(plan *p, const plan_key *k)
{
    for (; p; p = p->next)
        if (memcmp(&p->key, k, sizeof *k) == 0)
            return p;
    return NULL;
}

/* The largest power of two (up to 256, cuBLASLt's default assumption)
 * dividing the address of every batch's matrix. */
static uint32_t alignment(const void *p, size_t stride, size_t elem)
{
    uintptr_t v = (uintptr_t)p | (uintptr_t)(stride * elem) | 256u;
    return (uint32_t)(v & -v);
}

static cudaDataType_t cuda_type(weft_dtype t)
{
    switch (t) {
    case WEFT_DTYPE_BF16:
        return CUDA_R_16BF;
    case WEFT_DTYPE_F16:
        return CUDA_R_16F;
    case WEFT_DTYPE_F8_E4M3:
        return CUDA_R_8F_E4M3;
    case WEFT_DTYPE_F8_E5M2:
        return CUDA_R_8F_E5M2;
    case WEFT_DTYPE_I8:
        return CUDA_R_8I;
    case WEFT_DTYPE_I32:
        return CUDA_R_32I;
    default:
        return CUDA_R_32F;
    }
}

static cublasLtEpilogue_t epilogue_of(const weft__matmul_args *a)
{
    int bias = a->bias != NULL;
    switch (a->act) {
    case WEFT_MATMUL_ACT_RELU:
        return bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    case WEFT_MATMUL_ACT_GELU_TANH:
        if (a->aux)
            return bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        return bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    default: /* none, or the erf GELU, applied after */
        return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    }
}

static void fill_key(plan_key *k, const weft__matmul_args *a, int device, size_t ws)
{
    size_t ei = weft__dtype_size(a->in_type), eo = weft__dtype_size(a->type);
    size_t eb = weft__dtype_size(a->in_type_b), ec = weft__dtype_size(a->c_type);
    memset(k, 0, sizeof *k);
    k->device = device;
    k->in_type = a->in_type, k->type = a->type;
    k->in_type_b = a->in_type_b, k->c_type = a->c_type, k->bias_type = a->bias_type;
    k->scale_mode = a->kind == WEFT__MM_FP8 ? (int)a->scale_a_mode : 0;
    k->has_scale_d = a->scale_d != NULL, k->has_amax = a->amax_d != NULL;
    k->trans_a = a->trans_a, k->trans_b = a->trans_b, k->tf32 = a->allow_tf32;
    k->epilogue = (int)epilogue_of(a);
    k->has_c = a->c != NULL, k->has_bias = a->bias != NULL;
    /* The erf GELU's aux is a copy made after the product. */
    k->has_aux = a->aux != NULL && a->act == WEFT_MATMUL_ACT_GELU_TANH;
    k->m = a->m, k->n = a->n, k->k = a->k, k->batch = a->batch;
    k->lda = a->lda, k->ldb = a->ldb, k->ldc = a->c ? a->ldc : a->ldd, k->ldd = a->ldd;
    k->ldaux = k->has_aux ? a->ldaux : 0;
    k->stride_a = a->stride_a, k->stride_b = a->stride_b;
    k->stride_c = a->c ? a->stride_c : a->stride_d, k->stride_d = a->stride_d;
    k->stride_aux = k->has_aux ? a->stride_aux : 0;
    k->align_a = alignment(a->a, a->stride_a, ei);
    k->align_b = alignment(a->b, a->stride_b, eb);
    k->align_c = a->c ? alignment(a->c, a->stride_c, ec) : 0;
    k->align_d = alignment(a->d, a->stride_d, eo);
    k->align_bias = a->bias ? alignment(a->bias, 0, weft__dtype_size(a->bias_type)) : 0;
    k->align_aux = k->has_aux ? alignment(a->aux, a->stride_aux, eo) : 0;
    k->workspace = ws;
}

#define SET(desc, attr, value)                                                                     \
    do {                                                                                           \
        __typeof__(value) v_ = (value);                                                            \
        cublasStatus_t s_ = cublasLtMatmulDescSetAttribute(desc, attr, &v_, sizeof v_);            \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return lt_fail("cublasLtMatmulDescSetAttribute(" #attr ")", s_);                       \
    } while (0)

/* The call's matmul descriptor (on the caller's stack). */
static int fill_desc(cublasLtMatmulDescOpaque_t *md, const weft__matmul_args *a, const plan_key *k)
{
    int i8 = a->kind == WEFT__MM_INT8;
    cublasComputeType_t compute = i8 ? CUBLAS_COMPUTE_32I
                                  : a->in_type == WEFT_DTYPE_F32 && a->allow_tf32
                                      ? CUBLAS_COMPUTE_32F_FAST_TF32
                                      : CUBLAS_COMPUTE_32F;
    cublasStatus_t s = cublasLtMatmulDescInit(md, compute, i8 ? CUDA_R_32I : CUDA_R_32F);
    if (s != CUBLAS_STATUS_SUCCESS)
        return lt_fail("cublasLtMatmulDescInit", s);
    SET(md, CUBLASLT_MATMUL_DESC_TRANSA, (int32_t)(a->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
    SET(md, CUBLASLT_MATMUL_DESC_TRANSB, (int32_t)(a->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
    SET(md, CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)k->epilogue);
    if (a->bias) {
        SET(md, CUBLASLT_MATMUL_DESC_BIAS_POINTER, a->bias);
        SET(md, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, (int32_t)cuda_type(a->bias_type));
    }
    if (a->kind == WEFT__MM_FP8) { /* cuBLASLt's A is our B: the scales swap too */
        SET(md, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, (const void *)a->scale_b);
        SET(md, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, (const void *)a->scale_a);
        if (a->scale_a_mode == WEFT_MATMUL_SCALE_OUTER) {
            SET(md, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                (int32_t)CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F);
            SET(md, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                (int32_t)CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F);
        }
        if (a->scale_d)
            SET(md, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, (const void *)a->scale_d);
        if (a->amax_d)
            SET(md, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, (void *)a->amax_d);
    }
    if (k->has_aux) {
        SET(md, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, a->aux);
        SET(md, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, (int64_t)a->ldaux);
        if (a->batch > 1)
            SET(md, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, (int64_t)a->stride_aux);
    }
    return WEFT_OK;
}

static int layout(cublasLtMatrixLayoutOpaque_t *l, weft_dtype t, size_t rows, size_t cols,
                  size_t ld, size_t batch, size_t stride)
{
    cublasStatus_t s = cublasLtMatrixLayoutInit(l, cuda_type(t), rows, cols, (int64_t)ld);
    if (s != CUBLAS_STATUS_SUCCESS)
        return lt_fail("cublasLtMatrixLayoutInit", s);
    if (batch > 1) {
        int32_t count = (int32_t)batch;
        int64_t offset = (int64_t)stride;
        if ((s = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                  sizeof count)) != CUBLAS_STATUS_SUCCESS ||
            (s = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &offset, sizeof offset)) != CUBLAS_STATUS_SUCCESS)
            return lt_fail("cublasLtMatrixLayoutSetAttribute", s);
    }
    return WEFT_OK;
}

static const char *type_name(weft_dtype t)
{
    static const char *const names[] = {"fp32", "bf16", "fp16", "e4m3", "e5m2", "int8", "int32"};
    return (unsigned)t < sizeof names / sizeof *names ? names[t] : "?";
}

/* A new plan: layouts and the heuristic's first choice. */
static int make_plan(cublasLtHandle_t h, const weft__matmul_args *a, const plan_key *k,
                     const cublasLtMatmulDescOpaque_t *md, plan **out)
{
    plan *p = calloc(1, sizeof *p);
    int rc;
    if (!p)
        return weft__fail(WEFT_ENOMEM, "%s: out of memory for a plan", OP);
    p->key = *k;
    size_t bt = a->batch;
    if ((rc = layout(&p->la, a->in_type_b, a->trans_b ? a->k : a->n, a->trans_b ? a->n : a->k,
                     a->ldb, bt, a->stride_b)) != WEFT_OK ||
        (rc = layout(&p->lb, a->in_type, a->trans_a ? a->m : a->k, a->trans_a ? a->k : a->m, a->lda,
                     bt, a->stride_a)) != WEFT_OK ||
        (rc = layout(&p->lc, a->c_type, a->n, a->m, k->ldc, bt, k->stride_c)) != WEFT_OK ||
        (rc = layout(&p->ld, a->type, a->n, a->m, a->ldd, bt, a->stride_d)) != WEFT_OK)
        goto fail;

    cublasLtMatmulPreferenceOpaque_t pref;
    cublasStatus_t s = cublasLtMatmulPreferenceInit(&pref);
    uint64_t ws = k->workspace;
    /* cuBLASLt's A is our B and so on. */
    uint32_t al[4] = {k->align_b, k->align_a, k->has_c ? k->align_c : k->align_d, k->align_d};
    static const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof ws);
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
        s = cublasLtMatmulPreferenceSetAttribute(&pref, which[i], &al[i], sizeof al[i]);
    if (s != CUBLAS_STATUS_SUCCESS) {
        rc = lt_fail("cublasLtMatmulPreferenceSetAttribute", s);
        goto fail;
    }
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    s = cublasLtMatmulAlgoGetHeuristic(h, (cublasLtMatmulDesc_t)md, &p->la, &p->lb, &p->lc, &p->ld,
                                       &pref, 1, &result, &found);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
        rc = weft__fail(WEFT_EINVAL,
                        "%s: cuBLASLt has no algorithm for %zu x %zu x %zu (batch %zu), %s x %s "
                        "-> %s (C %s, bias %s), trans_a %d trans_b %d, epilogue %d, scale mode "
                        "%d: %s",
                        OP, a->m, a->n, a->k, a->batch, type_name(a->in_type),
                        type_name(a->in_type_b), type_name(a->type), type_name(a->c_type),
                        type_name(a->bias_type), a->trans_a, a->trans_b, k->epilogue, k->scale_mode,
                        s != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusName(s) : "none found");
        goto fail;
    }
    p->algo = result.algo;
    *out = p;
    return WEFT_OK;
fail:
    free(p);
    return rc;
}

static int get_plan(cublasLtHandle_t h, const weft__matmul_args *a, const plan_key *k,
                    const cublasLtMatmulDescOpaque_t *md, plan **out)
{
    _Atomic(plan *) *bucket = &plan_buckets[key_hash(k)];
    plan *p = plan_find(atomic_load_explicit(bucket, memory_order_acquire), k);
    if (p) {
        atomic_fetch_add_explicit(&plan_hits, 1, memory_order_relaxed);
        *out = p;
        return WEFT_OK;
    }
    /* The heuristic runs outside the lock; two threads asking for the same
     * new plan both ask, and the first to publish wins. */
    plan *np = NULL;
    int rc = make_plan(h, a, k, md, &np);
    if (rc != WEFT_OK)
        return rc;
    atomic_fetch_add_explicit(&plan_misses, 1, memory_order_relaxed);
    weft__lock_acquire(&plan_lock);
    p = plan_find(atomic_load_explicit(bucket, memory_order_relaxed), k);
    if (!p) {
        np->next = atomic_load_explicit(bucket, memory_order_relaxed);
        atomic_store_explicit(bucket, np, memory_order_release);
        p = np, np = NULL;
    }
    weft__lock_release(&plan_lock);
    free(np);
    *out = p;
    return WEFT_OK;
}

/* ---- the erf GELU, after the product ----------------------------------- */

/* D holds P (rounded): copy it to aux when asked, then D := GELU_erf(D). */
static int erf_after(cudaStream_t stream, const weft__matmul_args *a)
{
    size_t es = weft__dtype_size(a->type);
    int rc;
    for (size_t bt = 0; bt < a->batch; bt++) {
        char *d = (char *)a->d + bt * a->stride_d * es;
        if (a->aux) {
            char *aux = (char *)a->aux + bt * a->stride_aux * es;
            cudaError_t e = cudaMemcpy2DAsync(aux, a->ldaux * es, d, a->ldd * es, a->n * es, a->m,
                                              cudaMemcpyDeviceToDevice, stream);
            if (e != cudaSuccess)
                return weft__matmul_lt_cuda_fail("cudaMemcpy2DAsync (aux)", e);
        }
        /* Batches packed back to back are one call of batch * m rows. */
        size_t rows = a->m;
        if (a->batch > 1 && a->stride_d == a->m * a->ldd && !a->aux) {
            rows *= a->batch;
            bt = a->batch;
        }
        weft__gelu_args g = {a->type, WEFT_GELU_ERF, d, d, NULL, NULL, rows, a->n, a->ldd};
        if ((rc = weft__gelu_cuda(stream, &g)) != WEFT_OK)
            return rc;
    }
    return WEFT_OK;
}

/* ---- the call ------------------------------------------------------------ */

static atomic_ullong skinny_calls;

unsigned long long weft__matmul_cuda_skinny_calls(void)
{
    return atomic_load(&skinny_calls);
}

/* The skinny kernel when it fits. A benchmark build (WEFT_MEASURE_MODES)
 * also reads WEFT_MATMUL_SKINNY once: 0 sends every call to cuBLASLt, so
 * bench/matmul times both paths with one library; the shipped library has
 * no such switch, and says so once where the variable is set (so that a
 * benchmark run on it does not take the kernel's times for cuBLASLt's). */
static int use_skinny(const weft__matmul_args *a)
{
    static atomic_int allowed = -1;
    int on = atomic_load_explicit(&allowed, memory_order_relaxed);
    if (on < 0) {
        const char *v = getenv("WEFT_MATMUL_SKINNY");
#ifdef WEFT_MEASURE_MODES
        on = !(v && strcmp(v, "0") == 0);
#else
        on = 1;
        if (v)
            fprintf(stderr, "weft: WEFT_MATMUL_SKINNY is read by benchmark builds only "
                            "(WEFT_MEASURE_MODES): ignored\n");
#endif
        atomic_store_explicit(&allowed, on, memory_order_relaxed);
    }
    return on && weft__matmul_skinny_fits(a);
}

/* The two steps of a product (matmul_cublaslt.h): what can refuse it, then
 * the launch. */
int weft__matmul_lt_prepare(cudaStream_t stream, const weft__matmul_args *a, weft__lt_ready *r)
{
    int device, rc;
    cudaError_t e;

    memset(r, 0, sizeof *r);
    if ((e = cudaGetDevice(&device)) != cudaSuccess)
        return weft__matmul_lt_cuda_fail("cudaGetDevice", e);
    if (a->batch > INT32_MAX)
        return weft__fail(WEFT_EINVAL, "%s: cuBLASLt counts batches in int32: %zu is too many", OP,
                          a->batch);
    if (device < 0 || device >= MAX_DEVICES)
        return weft__fail(WEFT_EINVAL, "%s: device %d is beyond the %d this build knows", OP,
                          device, MAX_DEVICES);
    if ((rc = get_handle(device, &r->h)) != WEFT_OK)
        return rc;
    /* A captured matmul runs when its graph is launched, on whatever stream
     * that is, perhaps beside another graph captured on the same stream:
     * no workspace is safe to share then, so captured calls take none. */
    enum cudaStreamCaptureStatus capture;
    if ((e = cudaStreamIsCapturing(stream, &capture)) != cudaSuccess)
        return weft__matmul_lt_cuda_fail("cudaStreamIsCapturing", e);
    if (capture == cudaStreamCaptureStatusNone &&
        (rc = weft__stream_workspace(OP, stream, device, &r->ws, &r->ws_size)) != WEFT_OK)
        return rc;

    plan_key k;
    fill_key(&k, a, device, r->ws_size);
    if ((rc = fill_desc(&r->md, a, &k)) != WEFT_OK ||
        (rc = get_plan(r->h, a, &k, &r->md, &r->p)) != WEFT_OK)
        return rc;
    return WEFT_OK;
}

int weft__matmul_lt_launch(cudaStream_t stream, const weft__matmul_args *a, weft__lt_ready *r,
                           void *d)
{
    /* Without a C, D stands in for it with D's layout (in place cuBLASLt
     * wants one layout for both); an fp8 D's C, of another type, is NULL
     * (see the top). */
    const void *c = a->c ? a->c : a->c_type == a->type ? d : NULL;
    cublasLtMatrixLayout_t lc = c == d ? &r->p->ld : &r->p->lc;
    /* INT8's scale type is int32: its alpha and beta are 1 and 0. */
    static const int32_t one = 1, zero = 0;
    const void *alpha = a->kind == WEFT__MM_INT8 ? (const void *)&one : (const void *)&a->alpha;
    const void *beta = a->kind == WEFT__MM_INT8 ? (const void *)&zero : (const void *)&a->beta;
    cublasStatus_t s = cublasLtMatmul(r->h, &r->md, alpha, a->b, &r->p->la, a->a, &r->p->lb, beta,
                                      c, lc, d, &r->p->ld, &r->p->algo, r->ws, r->ws_size, stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        return lt_fail("cublasLtMatmul", s);
    return WEFT_OK;
}

/* A batched FP8 call with outer-vector scales, as one call a batch. */
static int outer_scaled_batches(cudaStream_t stream, const weft__matmul_args *a)
{
    size_t ea = weft__dtype_size(a->in_type), eb = weft__dtype_size(a->in_type_b);
    size_t ec = weft__dtype_size(a->c_type), ed = weft__dtype_size(a->type);
    weft__matmul_args one = *a;
    one.batch = 1;
    for (size_t bt = 0; bt < a->batch; bt++) {
        one.a = (const char *)a->a + bt * a->stride_a * ea;
        one.b = (const char *)a->b + bt * a->stride_b * eb;
        one.c = a->c ? (const char *)a->c + bt * a->stride_c * ec : NULL;
        one.d = (char *)a->d + bt * a->stride_d * ed;
        one.aux = a->aux ? (char *)a->aux + bt * a->stride_aux * ed : NULL;
        int rc = weft__matmul_cuda(stream, &one);
        if (rc != WEFT_OK)
            return rc;
    }
    return WEFT_OK;
}

int weft__matmul_cuda(void *stream_arg, const weft__matmul_args *a)
{
    cudaStream_t stream = stream_arg;
    weft__lt_ready r;
    int rc;

    if (use_skinny(a)) { /* decode's rows: see weft__matmul_skinny_fits */
        atomic_fetch_add_explicit(&skinny_calls, 1, memory_order_relaxed);
        return weft__matmul_skinny_cuda(stream, a);
    }
    if (a->kind == WEFT__MM_INT8 && a->type != WEFT_DTYPE_I32)
        return weft__matmul_lt_dequantized(stream, a);
    if (a->kind == WEFT__MM_FP8 && a->scale_a_mode == WEFT_MATMUL_SCALE_OUTER && a->batch > 1)
        return outer_scaled_batches(stream, a);
    if ((rc = weft__matmul_lt_prepare(stream, a, &r)) != WEFT_OK ||
        (rc = weft__matmul_lt_launch(stream, a, &r, a->d)) != WEFT_OK)
        return rc;
    if (a->act == WEFT_MATMUL_ACT_GELU_ERF)
        return erf_after(stream, a);
    return WEFT_OK;
}
