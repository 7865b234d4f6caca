/*
 * matmul_host.c - weft_matmul's host reference, on OpenBLAS's cblas_sgemm.
 *
 * D is computed in tiles of TILE_M x TILE_N. For each tile the product
 * goes into an fp32 tile (acc) and the epilogue reads acc once, adding
 * beta C and the bias, keeping the pre-activation in aux, and writing
 * act() of it to D: the tile is the host's registers. fp32 operands go to
 * sgemm as they lie (sgemm does the transposes); bf16 and fp16 operands
 * are converted to fp32 in panels of TILE_K, op() applied while converting,
 * and the panels' products summed into acc, so the products are summed in
 * fp32 in blocks of TILE_K like the matrix units' sums and no fp32 copy of
 * a whole operand is ever made.
 *
 * FP8 operands decode exactly to fp32, so they take the 16-bit path's
 * fp32 panels and sgemm; the scales, the epilogue and D's quantization
 * follow in fp32. INT8 operands are converted to double panels and
 * multiplied by cblas_dgemm into a double tile: every product and partial
 * sum is an integer of magnitude at most k 128^2 < 2^53, which double
 * holds exactly whatever the BLAS's order of summation, so the int32
 * result is exact (and k <= 131071 keeps it within int32).
 *
 * In place (C = D): each element of C is read just before the same element
 * of D is written, and tiles do not overlap, so the residual is read
 * before it is overwritten.
 *
 * OpenBLAS is opened (dlopen) at the first host matmul rather than linked:
 * it starts its worker threads when loaded, and a program that never
 * multiplies on the host should not get threads it did not ask for (they
 * would start before its main() could block signals for them). Opened
 * from a weft thread, its workers inherit that thread's signal mask.
 *
 * Each call then runs on the one thread that calls it, unless
 * OPENBLAS_NUM_THREADS (or OMP_NUM_THREADS) says otherwise: the host
 * device's executors, a stream each, are its parallelism, as a GPU's SMs
 * are, and BLAS threads on top of them oversubscribe the cores and
 * busy-wait between calls (sched_yield). weft-llm's server on the host,
 * 1000 requests in flight on 2 cores, gave 36% more tokens a second for
 * half the CPU time with calls on one thread.
 */
#include <cblas.h>
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "ops/matmul.h"
#include "ops/ops_internal.h"

enum { TILE_M = 256, TILE_N = 256, TILE_K = 512 };

/* The panels: acc (TILE_M x TILE_N), and for operands other than fp32
 * op(A)'s TILE_M x TILE_K and op(B)'s TILE_K x TILE_N; in double for INT8,
 * in fp32 otherwise. */
static size_t ws_bytes(const weft__matmul_args *x)
{
    size_t n = (size_t)TILE_M * TILE_N;
    if (x->in_type != WEFT_DTYPE_F32)
        n += (size_t)TILE_M * TILE_K + (size_t)TILE_K * TILE_N;
    return n * (x->kind == WEFT__MM_INT8 ? sizeof(double) : sizeof(float));
}

/* ---- the BLAS, opened once ------------------------------------------- */

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static __typeof__(&cblas_sgemm) sgemm; /* set once, under blas_once */
static __typeof__(&cblas_dgemm) dgemm;
static char blas_error[384];

static void open_blas(void)
{
    /* The run-time package's name first, then the library the build found. */
    static const char *const names[] = {"libopenblas.so.0", WEFT_OPENBLAS_PATH};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            snprintf(blas_error, sizeof blas_error, "%s", dlerror());
            continue;
        }
        void *f = dlsym(h, "cblas_sgemm"), *g = dlsym(h, "cblas_dgemm");
        void *threads = dlsym(h, "openblas_set_num_threads");
        if (threads && !getenv("OPENBLAS_NUM_THREADS") && !getenv("OMP_NUM_THREADS")) {
            void (*set_threads)(int);
            memcpy(&set_threads, &threads, sizeof set_threads);
            set_threads(1);
        }
        if (f && g) {
            memcpy(&dgemm, &g, sizeof dgemm); /* a data pointer to a function's */
            memcpy(&sgemm, &f, sizeof sgemm); /* sgemm last: it says both are set */
            return;
        }
        snprintf(blas_error, sizeof blas_error, "%s has no cblas_sgemm or cblas_dgemm", names[i]);
        dlclose(h);
    }
}

int weft__matmul_host_prepare(const char *op, weft__matmul_args *x)
{
    pthread_once(&blas_once, open_blas);
    if (!sgemm)
        return weft__fail(WEFT_EINVAL, "%s: the host BLAS (OpenBLAS) cannot be opened: %s", op,
                          blas_error);
    /* The BLAS counts in int. */
    if (x->k > INT_MAX || x->lda > INT_MAX || x->ldb > INT_MAX)
        return weft__fail(WEFT_EINVAL, "%s: k, lda and ldb must be at most %d for the host BLAS",
                          op, INT_MAX);
    x->host_ws = malloc(ws_bytes(x));
    if (!x->host_ws)
        return weft__fail(WEFT_ENOMEM, "%s: out of memory for the host's panels", op);
    return WEFT_OK;
}

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* Rows [i0, i0+mb) x columns [p0, p0+kb) of op(A), as packed fp32 rows. */
static void pack_a(const weft__matmul_args *x, const void *a, size_t i0, size_t mb, size_t p0,
                   size_t kb, float *out)
{
    for (size_t i = 0; i < mb; i++)
        for (size_t p = 0; p < kb; p++) {
            size_t at = x->trans_a ? (p0 + p) * x->lda + i0 + i : (i0 + i) * x->lda + p0 + p;
            out[i * kb + p] = weft__load(x->in_type, a, at);
        }
}

/* Rows [p0, p0+kb) x columns [j0, j0+nb) of op(B), as packed fp32 rows. */
static void pack_b(const weft__matmul_args *x, const void *b, size_t p0, size_t kb, size_t j0,
                   size_t nb, float *out)
{
    for (size_t p = 0; p < kb; p++)
        for (size_t j = 0; j < nb; j++) {
            size_t at = x->trans_b ? (j0 + j) * x->ldb + p0 + p : (p0 + p) * x->ldb + j0 + j;
            out[p * nb + j] = weft__load(x->in_type_b, b, at);
        }
}

/* INT8's panels, in double: op(A)'s rows (A is m x k, checked) and op(B)
 * as k x nb (B is n x k, checked), both read along their rows. */
static void pack_i8(const weft__matmul_args *x, const int8_t *a, const int8_t *b, size_t i0,
                    size_t mb, size_t j0, size_t nb, size_t p0, size_t kb, double *pa, double *pb)
{
    for (size_t i = 0; i < mb; i++)
        for (size_t p = 0; p < kb; p++)
            pa[i * kb + p] = a[(i0 + i) * x->lda + p0 + p];
    for (size_t j = 0; j < nb; j++)
        for (size_t p = 0; p < kb; p++)
            pb[p * nb + j] = b[(j0 + j) * x->ldb + p0 + p];
}

/* acc (mb x nb doubles, packed) := op(A) op(B), exactly (see the top). */
static void product_i8(const weft__matmul_args *x, const void *a, const void *b, size_t i0,
                       size_t mb, size_t j0, size_t nb, double *acc, double *pa, double *pb)
{
    int m = (int)mb, n = (int)nb;
    for (size_t p0 = 0; p0 < x->k; p0 += TILE_K) {
        size_t kb = min_size(TILE_K, x->k - p0);
        pack_i8(x, a, b, i0, mb, j0, nb, p0, kb, pa, pb);
        dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, (int)kb, 1.0, pa, (int)kb, pb, n,
              p0 ? 1.0 : 0.0, acc, n);
    }
}

/* acc (mb x nb, packed) := op(A) op(B) over rows i0.., columns j0... */
static void product(const weft__matmul_args *x, const void *a, const void *b, size_t i0, size_t mb,
                    size_t j0, size_t nb, float *acc, float *pa, float *pb)
{
    int m = (int)mb, n = (int)nb;

    if (x->in_type == WEFT_DTYPE_F32) {
        const float *fa = (const float *)a + (x->trans_a ? i0 : i0 * x->lda);
        const float *fb = (const float *)b + (x->trans_b ? j0 * x->ldb : j0);
        sgemm(CblasRowMajor, x->trans_a ? CblasTrans : CblasNoTrans,
              x->trans_b ? CblasTrans : CblasNoTrans, m, n, (int)x->k, 1.0f, fa, (int)x->lda, fb,
              (int)x->ldb, 0.0f, acc, n);
        return;
    }
    for (size_t p0 = 0; p0 < x->k; p0 += TILE_K) {
        size_t kb = min_size(TILE_K, x->k - p0);
        pack_a(x, a, i0, mb, p0, kb, pa);
        pack_b(x, b, p0, kb, j0, nb, pb);
        sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, (int)kb, 1.0f, pa, (int)kb, pb, n,
              p0 ? 1.0f : 0.0f, acc, n);
    }
}

static float scale_of(weft_matmul_scale mode, const float *s, size_t i)
{
    return mode == WEFT_MATMUL_SCALE_OUTER ? s[i] : mode == WEFT_MATMUL_SCALE_TENSOR ? s[0] : 1.0f;
}

/* The product's element (i, j), scaled: alpha acc for 16/32-bit operands;
 * alpha (sa sb acc) for FP8; alpha float(acc) sa sb, left to right, for
 * INT8 (the order weft's GPU epilogue kernel uses). */
static float scaled(const weft__matmul_args *x, const void *acc, size_t at, size_t i, size_t j)
{
    float sa = scale_of(x->scale_a_mode, x->scale_a, i);
    float sb = scale_of(x->scale_b_mode, x->scale_b, j);
    if (x->kind == WEFT__MM_INT8)
        return x->alpha * (float)((const double *)acc)[at] * sa * sb;
    float v = ((const float *)acc)[at];
    return x->kind == WEFT__MM_FP8 ? x->alpha * (sa * sb * v) : x->alpha * v;
}

/* D, aux := the epilogue of acc over the tile at (i0, j0); *amax grows
 * by the tile's largest |act(P)| when D is fp8. */
static void epilogue(const weft__matmul_args *x, void *d, const void *c, void *aux, size_t i0,
                     size_t mb, size_t j0, size_t nb, const void *acc, float *amax)
{
    int d8 = weft__is_f8(x->type);
    float scale_d = d8 ? *x->scale_d : 1.0f;
    for (size_t i = 0; i < mb; i++)
        for (size_t j = 0; j < nb; j++) {
            size_t id = (i0 + i) * x->ldd + j0 + j;
            if (x->type == WEFT_DTYPE_I32) { /* exact, within int32 (k is bounded) */
                ((int32_t *)d)[id] = (int32_t)((const double *)acc)[i * nb + j];
                continue;
            }
            float v = scaled(x, acc, i * nb + j, i0 + i, j0 + j);
            if (c)
                v += x->beta * weft__load(x->c_type, c, (i0 + i) * x->ldc + j0 + j);
            if (x->bias)
                v += weft__load(x->bias_type, x->bias, j0 + j);
            if (aux)
                weft__store(x->type, aux, (i0 + i) * x->ldaux + j0 + j, v);
            float y = weft__matmul_act(x->act, v);
            if (d8) {
                *amax = fmaxf(*amax, fabsf(y));
                y *= scale_d;
            }
            weft__store(x->type, d, id, y);
        }
}

static const void *at(const void *p, size_t b, size_t stride, weft_dtype t)
{
    return p ? (const char *)p + b * stride * weft__dtype_size(t) : NULL;
}

void weft__matmul_host_run(weft__matmul_args *x)
{
    weft__matmul_host_compute(x);
    free(x->host_ws);
    x->host_ws = NULL;
}

void weft__matmul_host_compute(const weft__matmul_args *x)
{
    size_t tile = (size_t)TILE_M * TILE_N, panel = (size_t)TILE_M * TILE_K;
    float *acc = x->host_ws;
    float *pa = acc + tile, *pb = pa + panel;
    double *acc64 = x->host_ws;
    double *pa64 = acc64 + tile, *pb64 = pa64 + panel;
    float amax = 0.0f;

    for (size_t bt = 0; bt < x->batch; bt++) {
        const void *a = at(x->a, bt, x->stride_a, x->in_type);
        const void *b = at(x->b, bt, x->stride_b, x->in_type_b);
        const void *c = at(x->c, bt, x->stride_c, x->c_type);
        void *d = (void *)at(x->d, bt, x->stride_d, x->type);
        void *aux = (void *)at(x->aux, bt, x->stride_aux, x->type);
        for (size_t j0 = 0; j0 < x->n; j0 += TILE_N) {
            size_t nb = min_size(TILE_N, x->n - j0);
            for (size_t i0 = 0; i0 < x->m; i0 += TILE_M) {
                size_t mb = min_size(TILE_M, x->m - i0);
                if (x->kind == WEFT__MM_INT8) {
                    product_i8(x, a, b, i0, mb, j0, nb, acc64, pa64, pb64);
                    epilogue(x, d, c, aux, i0, mb, j0, nb, acc64, &amax);
                } else {
                    product(x, a, b, i0, mb, j0, nb, acc, pa, pb);
                    epilogue(x, d, c, aux, i0, mb, j0, nb, acc, &amax);
                }
            }
        }
    }
    if (x->amax_d)
        *x->amax_d = amax;
}
