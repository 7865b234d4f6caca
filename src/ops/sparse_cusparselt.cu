/*
 * sparse_cusparselt.cu - the sparse weight on the GPU through cuSPARSELt:
 * its check and compression at creation, and weft_matmul_sparse's
 * product. Host code only (cuSPARSELt's header is C++).
 *
 * Layout. cuSPARSELt multiplies D' = A' B' with A' the structured (2:4)
 * matrix. weft's D = A W^T (row-major, m x n) is, transposed, D^T = W A^T:
 * A' is the weight W (n x k, row-major, its groups of four along k); B' is
 * A^T, A's rows read as a column-major k x m matrix with A's ld; D' is D^T,
 * D's rows read as a column-major n x m matrix with D's ld (C likewise).
 * Nothing moves: the descriptors' orders say it. The bias, which
 * cuSPARSELt adds per row of D', is then one per output feature, as a
 * Linear layer's.
 *
 * What is kept:
 *  - one cuSPARSELt handle per device, for the process's life;
 *  - per weight: its structured descriptor and compressed form (cuSPARSELt's
 *    own, half the values and their positions), and its plans: per (m,
 *    lda, ldc, ldd, whether C is given, the bias pointer, activation) the
 *    descriptors, cuSPARSELt's default algorithm (no search) and the
 *    workspace it needs; made on first use, under the weight's mutex (a
 *    handful per weight), freed with the weight.
 * A product's workspace is the stream's (workspace.c, shared with cuBLASLt
 * and cuDNN); inside a capture the graph allocates its own (cudaMallocAsync
 * captured as a node). cuSPARSELt takes m in multiples of 16 only: other m
 * (decode's rows) run on padded copies of A's and D's rows. NVIDIA's notes
 * give its GELU epilogue to the INT8 kernels (a bf16 product with it was
 * refused, INVALID_VALUE): a GELU (either form) runs over D after the
 * product, the bias and C already in.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <cusparseLt.h>

#include "cuda/status.h"
#include "ops/ops_internal.h"
#include "ops/sparse.h"

extern "C" {
#include "core/error.h"
#include "ops/workspace.h"
}

namespace
{

const char CREATE[] = "weft_sparse_weight_create";
const char OP[] = "weft_matmul_sparse";
/* MAX_DEVICES: the handles' table; ROWS: what cuSPARSELt asks m to be a
 * multiple of (it refused m = 1 as NOT_SUPPORTED on an H100). */
enum { MAX_DEVICES = 64, ROWS = 16 };

const char *status_name(cusparseStatus_t s)
{
    switch (s) {
    case CUSPARSE_STATUS_NOT_INITIALIZED:
        return "CUSPARSE_STATUS_NOT_INITIALIZED";
    case CUSPARSE_STATUS_ALLOC_FAILED:
        return "CUSPARSE_STATUS_ALLOC_FAILED";
    case CUSPARSE_STATUS_INVALID_VALUE:
        return "CUSPARSE_STATUS_INVALID_VALUE";
    case CUSPARSE_STATUS_ARCH_MISMATCH:
        return "CUSPARSE_STATUS_ARCH_MISMATCH";
    case CUSPARSE_STATUS_EXECUTION_FAILED:
        return "CUSPARSE_STATUS_EXECUTION_FAILED";
    case CUSPARSE_STATUS_INTERNAL_ERROR:
        return "CUSPARSE_STATUS_INTERNAL_ERROR";
    case CUSPARSE_STATUS_NOT_SUPPORTED:
        return "CUSPARSE_STATUS_NOT_SUPPORTED";
    case CUSPARSE_STATUS_INSUFFICIENT_RESOURCES:
        return "CUSPARSE_STATUS_INSUFFICIENT_RESOURCES";
    default:
        return "cuSPARSELt status";
    }
}

/* cuSPARSELt's refusal of what it was asked (what), for op: the caller's
 * shape or layout (WEFT_EINVAL), memory (WEFT_ENOMEM), or the device. */
int lt_fail(const char *op, const char *what, cusparseStatus_t s)
{
    int rc = s == CUSPARSE_STATUS_ALLOC_FAILED || s == CUSPARSE_STATUS_INSUFFICIENT_RESOURCES
                 ? WEFT_ENOMEM
             : s == CUSPARSE_STATUS_INVALID_VALUE || s == CUSPARSE_STATUS_NOT_SUPPORTED ||
                     s == CUSPARSE_STATUS_ARCH_MISMATCH
                 ? WEFT_EINVAL
                 : WEFT_EDEVICE;
    return weft__fail(rc, "%s: cuSPARSELt refused %s: %s (%d)", op, what, status_name(s), (int)s);
}

int cuda_fail(const char *op, const char *what, cudaError_t e)
{
    cudaGetLastError(); /* a refused call is not sticky: clear it */
    return weft__fail(weft__cuda_status(e), "%s: %s failed: %s (%s)", op, what, cudaGetErrorName(e),
                      cudaGetErrorString(e));
}

cudaDataType value_type(weft_dtype t)
{
    return t == WEFT_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

/* ---- handles, one per device ------------------------------------------ */

cusparseLtHandle_t *handles[MAX_DEVICES];
pthread_mutex_t handles_mutex = PTHREAD_MUTEX_INITIALIZER;

int get_handle(const char *op, int device, const cusparseLtHandle_t **out)
{
    if (device < 0 || device >= MAX_DEVICES)
        return weft__fail(WEFT_EINVAL, "%s: device %d is beyond the %d this build knows", op,
                          device, MAX_DEVICES);
    int rc = WEFT_OK;
    pthread_mutex_lock(&handles_mutex);
    if (!handles[device]) {
        cusparseLtHandle_t *h = (cusparseLtHandle_t *)calloc(1, sizeof *h);
        cusparseStatus_t s = CUSPARSE_STATUS_ALLOC_FAILED;
        if (h) {
            /* it allocates: relaxed, should a first call be captured */
            cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
            cudaThreadExchangeStreamCaptureMode(&mode);
            s = cusparseLtInit(h);
            cudaThreadExchangeStreamCaptureMode(&mode);
        }
        if (s == CUSPARSE_STATUS_SUCCESS) {
            handles[device] = h;
        } else {
            free(h);
            rc = lt_fail(op, "its handle (cusparseLtInit)", s);
        }
    }
    *out = handles[device];
    pthread_mutex_unlock(&handles_mutex);
    return rc;
}

/* ---- the weight --------------------------------------------------------- */

/* What a plan depends on beyond the weight; compared bytewise. */
struct plan_key {
    uint64_t m, lda, ldc, ldd;
    const void *bias;
    int has_c, act;
};

struct sparse_plan {
    plan_key key;
    cusparseLtMatDescriptor_t b, c, d;
    cusparseLtMatmulDescriptor_t mm;
    cusparseLtMatmulAlgSelection_t alg;
    cusparseLtMatmulPlan_t plan;
    size_t workspace;
    sparse_plan *next;
};

struct sparse_gpu {
    int device;
    weft_dtype type;
    size_t n, k;
    const cusparseLtHandle_t *h;
    cusparseLtMatDescriptor_t w; /* structured, n x k, row-major */
    void *compressed;
    size_t compressed_bytes;
    pthread_mutex_t mutex; /* guards plans */
    sparse_plan *plans;
};

void plan_free(sparse_plan *p)
{
    cusparseLtMatmulPlanDestroy(&p->plan);
    cusparseLtMatDescriptorDestroy(&p->b);
    cusparseLtMatDescriptorDestroy(&p->c);
    cusparseLtMatDescriptorDestroy(&p->d);
    free(p);
}

/* A new plan for a's call on weight g. */
int make_plan(sparse_gpu *g, const weft__matmul_args *a, const plan_key *k, sparse_plan **out)
{
    sparse_plan *p = (sparse_plan *)calloc(1, sizeof *p);
    if (!p)
        return weft__fail(WEFT_ENOMEM, "%s: out of memory for a plan", OP);
    p->key = *k;
    const cusparseLtHandle_t *h = g->h;
    cudaDataType t = value_type(g->type);
    int64_t m = (int64_t)a->m, n = (int64_t)g->n, kk = (int64_t)g->k;
    int made = 0; /* descriptors made: b, then c, then d */
    cusparseStatus_t s =
        cusparseLtDenseDescriptorInit(h, &p->b, kk, m, (int64_t)a->lda, 16, t, CUSPARSE_ORDER_COL);
    if (s == CUSPARSE_STATUS_SUCCESS && ++made)
        s = cusparseLtDenseDescriptorInit(h, &p->c, n, m, (int64_t)a->ldc, 16, t,
                                          CUSPARSE_ORDER_COL);
    if (s == CUSPARSE_STATUS_SUCCESS && ++made)
        s = cusparseLtDenseDescriptorInit(h, &p->d, n, m, (int64_t)a->ldd, 16, t,
                                          CUSPARSE_ORDER_COL);
    if (s == CUSPARSE_STATUS_SUCCESS && ++made)
        s = cusparseLtMatmulDescriptorInit(h, &p->mm, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                           CUSPARSE_OPERATION_NON_TRANSPOSE, &g->w, &p->b, &p->c,
                                           &p->d, CUSPARSE_COMPUTE_32F);
    int on = 1;
    if (s == CUSPARSE_STATUS_SUCCESS && a->act == WEFT_MATMUL_ACT_RELU)
        s = cusparseLtMatmulDescSetAttribute(h, &p->mm, CUSPARSELT_MATMUL_ACTIVATION_RELU, &on,
                                             sizeof on);
    if (s == CUSPARSE_STATUS_SUCCESS && a->bias) {
        void *bias = (void *)a->bias;
        s = cusparseLtMatmulDescSetAttribute(h, &p->mm, CUSPARSELT_MATMUL_BIAS_POINTER, &bias,
                                             sizeof bias);
    }
    if (s == CUSPARSE_STATUS_SUCCESS)
        s = cusparseLtMatmulAlgSelectionInit(h, &p->alg, &p->mm, CUSPARSELT_MATMUL_ALG_DEFAULT);
    int planned = 0;
    if (s == CUSPARSE_STATUS_SUCCESS)
        planned =
            (s = cusparseLtMatmulPlanInit(h, &p->plan, &p->mm, &p->alg)) == CUSPARSE_STATUS_SUCCESS;
    if (s == CUSPARSE_STATUS_SUCCESS)
        s = cusparseLtMatmulGetWorkspace(h, &p->plan, &p->workspace);
    if (s == CUSPARSE_STATUS_SUCCESS) {
        *out = p;
        return WEFT_OK;
    }
    char what[160];
    snprintf(what, sizeof what, "the product %zu x %zu x %zu (m n k; lda %zu, ldd %zu)", a->m, g->n,
             g->k, a->lda, a->ldd);
    int rc = lt_fail(OP, what, s);
    if (planned)
        cusparseLtMatmulPlanDestroy(&p->plan);
    if (made > 0)
        cusparseLtMatDescriptorDestroy(&p->b);
    if (made > 1)
        cusparseLtMatDescriptorDestroy(&p->c);
    if (made > 2)
        cusparseLtMatDescriptorDestroy(&p->d);
    free(p);
    return rc;
}

int get_plan(sparse_gpu *g, const weft__matmul_args *a, sparse_plan **out)
{
    plan_key k;
    memset(&k, 0, sizeof k);
    k.m = a->m, k.lda = a->lda, k.ldc = a->ldc, k.ldd = a->ldd;
    k.bias = a->bias, k.has_c = a->c != NULL, k.act = (int)a->act;
    int rc = WEFT_OK;
    pthread_mutex_lock(&g->mutex);
    sparse_plan *p = g->plans;
    while (p && memcmp(&p->key, &k, sizeof k) != 0)
        p = p->next;
    if (!p) {
        /* making a plan enqueues nothing; cuSPARSELt may allocate */
        cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        cudaThreadExchangeStreamCaptureMode(&mode);
        rc = make_plan(g, a, &k, &p);
        cudaThreadExchangeStreamCaptureMode(&mode);
        if (rc == WEFT_OK) {
            p->next = g->plans;
            g->plans = p;
        }
    }
    pthread_mutex_unlock(&g->mutex);
    *out = p;
    return rc;
}

void gpu_free(sparse_gpu *g)
{
    for (sparse_plan *p = g->plans, *next; p; p = next) {
        next = p->next;
        plan_free(p);
    }
    if (g->compressed)
        cudaFree(g->compressed);
    cusparseLtMatDescriptorDestroy(&g->w);
    pthread_mutex_destroy(&g->mutex);
    free(g);
}

} // namespace

extern "C" int weft__sparse_gpu_create(void *stream_arg, weft_dtype type, const void *w, size_t n,
                                       size_t k, size_t ldw, void **out)
{
    cudaStream_t stream = (cudaStream_t)stream_arg;
    *out = NULL;
    int device, rc;
    cudaError_t e;
    if ((e = cudaGetDevice(&device)) != cudaSuccess)
        return cuda_fail(CREATE, "cudaGetDevice", e);

    /* Read back and checked on the host: the message names the first group
     * that is not 2:4 (a weight is made once, at load). */
    size_t row = k * 2;
    void *host = malloc(n * row);
    if (!host)
        return weft__fail(WEFT_ENOMEM, "%s: out of memory for %zu x %zu", CREATE, n, k);
    e = cudaMemcpy2DAsync(host, row, w, ldw * 2, row, n, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
        free(host);
        return cuda_fail(CREATE, "reading w back", e);
    }
    rc = weft__sparse_not_2_4(CREATE, type, host, n, k, k);
    free(host);
    if (rc != WEFT_OK)
        return rc;

    sparse_gpu *g = (sparse_gpu *)calloc(1, sizeof *g);
    if (!g)
        return weft__fail(WEFT_ENOMEM, "%s: out of memory", CREATE);
    g->device = device, g->type = type, g->n = n, g->k = k;
    pthread_mutex_init(&g->mutex, NULL);
    if ((rc = get_handle(CREATE, device, &g->h)) != WEFT_OK) {
        pthread_mutex_destroy(&g->mutex);
        free(g);
        return rc;
    }
    cusparseStatus_t s = cusparseLtStructuredDescriptorInit(
        g->h, &g->w, (int64_t)n, (int64_t)k, (int64_t)ldw, 16, value_type(type), CUSPARSE_ORDER_ROW,
        CUSPARSELT_SPARSITY_50_PERCENT);
    if (s != CUSPARSE_STATUS_SUCCESS) {
        pthread_mutex_destroy(&g->mutex);
        free(g);
        char what[96];
        snprintf(what, sizeof what, "a %zu x %zu weight (ldw %zu)", n, k, ldw);
        return lt_fail(CREATE, what, s);
    }
    size_t size = 0, buffer_size = 0;
    void *buffer = NULL;
    s = cusparseLtSpMMACompressedSize2(g->h, &g->w, &size, &buffer_size);
    if (s != CUSPARSE_STATUS_SUCCESS) {
        gpu_free(g);
        return lt_fail(CREATE, "the compressed size (cusparseLtSpMMACompressedSize2)", s);
    }
    g->compressed_bytes = size;
    if ((e = cudaMalloc(&g->compressed, size)) != cudaSuccess ||
        (buffer_size && (e = cudaMalloc(&buffer, buffer_size)) != cudaSuccess)) {
        g->compressed = e == cudaSuccess ? g->compressed : NULL;
        gpu_free(g);
        return cuda_fail(CREATE, "cudaMalloc (the compressed weight)", e);
    }
    s = cusparseLtSpMMACompress2(g->h, &g->w, 1, CUSPARSE_OPERATION_NON_TRANSPOSE, w, g->compressed,
                                 buffer, stream);
    e = s == CUSPARSE_STATUS_SUCCESS ? cudaStreamSynchronize(stream) : cudaSuccess;
    cudaFree(buffer);
    if (s != CUSPARSE_STATUS_SUCCESS || e != cudaSuccess) {
        gpu_free(g);
        return s != CUSPARSE_STATUS_SUCCESS ? lt_fail(CREATE, "the compression", s)
                                            : cuda_fail(CREATE, "the compression", e);
    }
    *out = g;
    return WEFT_OK;
}

extern "C" void weft__sparse_gpu_destroy(void *gpu)
{
    if (gpu)
        gpu_free((sparse_gpu *)gpu);
}

extern "C" int weft__sparse_gpu_device(const void *gpu)
{
    return ((const sparse_gpu *)gpu)->device;
}

extern "C" size_t weft__sparse_gpu_bytes(const void *gpu)
{
    return ((const sparse_gpu *)gpu)->compressed_bytes;
}

namespace
{

/* The product of a's rows as given: m a multiple of ROWS. */
int product(cudaStream_t stream, sparse_gpu *g, const weft__matmul_args *a, int device,
            bool captured)
{
    sparse_plan *p;
    int rc;
    if ((rc = get_plan(g, a, &p)) != WEFT_OK)
        return rc;
    /* The workspace: the stream's, or inside a capture one of the graph's
     * own (an allocation node: each launch of the graph has it alone). */
    void *ws = NULL;
    size_t ws_size = 0;
    if (!captured && (rc = weft__stream_workspace(OP, stream, device, &ws, &ws_size)) != WEFT_OK)
        return rc;
    bool own = captured && p->workspace > 0;
    cudaError_t e;
    if (own && (e = cudaMallocAsync(&ws, p->workspace, stream)) != cudaSuccess)
        return cuda_fail(OP, "cudaMallocAsync (the captured product's workspace)", e);
    if (!own && p->workspace > ws_size)
        return weft__fail(WEFT_EINVAL,
                          "%s: cuSPARSELt's plan for %zu x %zu x %zu needs %zu bytes of "
                          "workspace, and the stream has %zu",
                          OP, a->m, g->n, g->k, p->workspace, ws_size);
    /* C absent: D stands for it, at beta 0 */
    const void *c = a->c ? a->c : a->d;
    cusparseStatus_t s = cusparseLtMatmul(g->h, &p->plan, &a->alpha, g->compressed, a->a, &a->beta,
                                          c, a->d, ws, &stream, 1);
    if (own)
        cudaFreeAsync(ws, stream);
    if (s != CUSPARSE_STATUS_SUCCESS)
        return lt_fail(OP, "the product (cusparseLtMatmul)", s);
    return WEFT_OK;
}

/* A product whose m cuSPARSELt does not take (it asks a multiple of ROWS:
 * decode's few rows): A's rows copied into a block of mp rows, the
 * product into another (C's rows copied there first), D's rows copied
 * back; the blocks from the stream's pool, given back in stream order. */
int padded_product(cudaStream_t stream, sparse_gpu *g, const weft__matmul_args *a, int device,
                   bool captured, size_t mp)
{
    const size_t es = 2, n = g->n, k = g->k;
    void *ap = NULL, *dp = NULL;
    cudaError_t e = cudaMallocAsync(&ap, mp * k * es, stream);
    if (e == cudaSuccess)
        e = cudaMallocAsync(&dp, mp * n * es, stream);
    if (e != cudaSuccess) {
        if (ap)
            cudaFreeAsync(ap, stream);
        return cuda_fail(OP, "cudaMallocAsync (the padded rows)", e);
    }
    weft__matmul_args p = *a;
    p.m = mp, p.a = ap, p.d = dp, p.c = a->c ? dp : NULL;
    p.lda = k, p.ldc = n, p.ldd = n;
    e = cudaMemcpy2DAsync(ap, k * es, a->a, a->lda * es, k * es, a->m, cudaMemcpyDeviceToDevice,
                          stream);
    if (e == cudaSuccess && a->c)
        e = cudaMemcpy2DAsync(dp, n * es, a->c, a->ldc * es, n * es, a->m, cudaMemcpyDeviceToDevice,
                              stream);
    int rc = e == cudaSuccess ? product(stream, g, &p, device, captured)
                              : cuda_fail(OP, "copying the rows in", e);
    if (rc == WEFT_OK && (e = cudaMemcpy2DAsync(a->d, a->ldd * es, dp, n * es, n * es, a->m,
                                                cudaMemcpyDeviceToDevice, stream)) != cudaSuccess)
        rc = cuda_fail(OP, "copying the rows out", e);
    cudaFreeAsync(ap, stream);
    cudaFreeAsync(dp, stream);
    return rc;
}

} // namespace

extern "C" int weft__sparse_gpu_matmul(void *stream_arg, void *gpu, const weft__matmul_args *a)
{
    cudaStream_t stream = (cudaStream_t)stream_arg;
    sparse_gpu *g = (sparse_gpu *)gpu;
    int device;
    cudaError_t e;
    if ((e = cudaGetDevice(&device)) != cudaSuccess)
        return cuda_fail(OP, "cudaGetDevice", e);
    if (device != g->device)
        return weft__fail(WEFT_EINVAL, "%s: w was made for GPU %d, the call is on GPU %d", OP,
                          g->device, device);
    cudaStreamCaptureStatus capture;
    if ((e = cudaStreamIsCapturing(stream, &capture)) != cudaSuccess)
        return cuda_fail(OP, "cudaStreamIsCapturing", e);
    bool captured = capture != cudaStreamCaptureStatusNone;
    /* a GELU runs after the product, over D in place
     * (weft_bias_gelu_residual's kernel): see the top of the file */
    bool gelu = a->act == WEFT_MATMUL_ACT_GELU_TANH || a->act == WEFT_MATMUL_ACT_GELU_ERF;
    weft__matmul_args p = *a;
    if (gelu)
        p.act = WEFT_MATMUL_ACT_NONE;
    size_t mp = (a->m + ROWS - 1) / ROWS * ROWS;
    int rc = mp == a->m ? product(stream, g, &p, device, captured)
                        : padded_product(stream, g, &p, device, captured, mp);
    if (rc != WEFT_OK || !gelu)
        return rc;
    weft__gelu_args ga = {
        a->type, a->act == WEFT_MATMUL_ACT_GELU_TANH ? WEFT_GELU_TANH : WEFT_GELU_ERF,
        a->d,    a->d,
        NULL,    NULL,
        a->m,    a->n,
        a->ldd};
    return weft__gelu_cuda(stream, &ga);
}
