/*
 * sparse.c - the guide's 2:4-sparse Linear layer (docs/guide.md, "Fused
 * operators"): a weight pruned to the 2:4 pattern (weft_prune_2_4: the
 * two largest of every four), made once into a sparse weight, and
 * y = ReLU(x W^T + b) through weft_matmul_sparse, all from a task on its
 * own stream. On a GPU built with cuSPARSELt that is its sparse tensor
 * cores; on the host backend weft_matmul on the pruned rows. The result is
 * checked against weft_matmul of the pruned weight on the host (stream
 * NULL).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <weft.h>
#include <weft/ops.h>

enum { M = 16, N = 256, K = 512 };

/* bf16 as its bits: the top half of the fp32 (truncated; the inputs are
 * made to fit) */
static uint16_t bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* 16-byte aligned, as the sparse product asks of its operands */
static _Alignas(16) uint16_t x[M][K], w[N][K], pruned[N][K], b[N], y[M][N], expect[M][N];

static void *layer(void *arg)
{
    (void)arg;
    uint16_t *dx = NULL, *dw = NULL, *db = NULL, *dy = NULL;
    weft_sparse_weight *sw = NULL;
    weft_matmul_desc d = {
        .m = M, .n = N, .k = K, .type = WEFT_DTYPE_BF16, .trans_b = 1, .act = WEFT_MATMUL_ACT_RELU};
    int rc = weft_malloc_async((void **)&dx, sizeof x) ||
             weft_malloc_async((void **)&dw, sizeof w) ||
             weft_malloc_async((void **)&db, sizeof b) ||
             weft_malloc_async((void **)&dy, sizeof y) || weft_memcpy_async(dx, x, sizeof x) ||
             weft_memcpy_async(dw, w, sizeof w) || weft_memcpy_async(db, b, sizeof b) ||
             weft_prune_2_4(WEFT_TASK_STREAM, WEFT_DTYPE_BF16, dw, N, K, K) ||
             /* made after the prune: the call awaits the task's earlier work */
             weft_sparse_weight_create(WEFT_TASK_STREAM, WEFT_DTYPE_BF16, dw, N, K, 0, &sw);
    d.bias = db;
    rc = rc || weft_matmul_sparse(WEFT_TASK_STREAM, &d, dy, dx, sw, NULL) ||
         weft_memcpy_async(y, dy, sizeof y);
    if (rc)
        fprintf(stderr, "sparse: %s\n", weft_last_error());
    rc |= weft_await() != WEFT_OK; /* the product, before the weight goes */
    weft_sparse_weight_destroy(sw);
    weft_free_async(dx), weft_free_async(dw), weft_free_async(db), weft_free_async(dy);
    return (void *)(intptr_t)(rc || weft_await());
}

int main(void)
{
    srand(1);
    for (int k = 0; k < K; k++)
        for (int r = 0; r < N || r < M; r++) {
            float v = (float)(rand() % 17 - 8) / 8.0f; /* exact in bf16 */
            if (r < N)
                w[r][k] = bf16(v);
            if (r < M)
                x[r][k] = bf16((float)(rand() % 9 - 4) / 4.0f);
        }
    for (int n = 0; n < N; n++)
        b[n] = bf16((float)(n % 7 - 3) / 2.0f);
    /* the host reference: the same prune, then the dense product */
    memcpy(pruned, w, sizeof w);
    weft_matmul_desc d = {.m = M,
                          .n = N,
                          .k = K,
                          .type = WEFT_DTYPE_BF16,
                          .trans_b = 1,
                          .act = WEFT_MATMUL_ACT_RELU,
                          .bias = b};
    if (weft_prune_2_4(NULL, WEFT_DTYPE_BF16, pruned, N, K, K) ||
        weft_matmul(NULL, &d, expect, x, pruned, NULL)) {
        fprintf(stderr, "sparse: %s\n", weft_last_error());
        return 1;
    }

    weft_runtime *rt;
    weft_task *t;
    void *r = (void *)1;
    if (weft_runtime_create(&rt, NULL) || weft_spawn(rt, &t, layer, NULL, NULL) ||
        weft_join(t, &r)) {
        fprintf(stderr, "sparse: %s\n", weft_last_error());
        return 1;
    }
    int failed = r != NULL;
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double e = fabs((double)from_bf16(y[i][j]) - from_bf16(expect[i][j])) /
                       (1.0 + fabs((double)from_bf16(expect[i][j])));
            worst = e > worst || e != e ? e : worst;
        }
    failed |= !(worst <= 1e-2); /* bf16's rounding; the host is exact here */
    printf("sparse: ReLU(x W^T + b), %dx%d by a 2:4-pruned %dx%d bf16 weight, from a task on the "
           "%s backend, off the host's dense product by at most %.1e%s\n",
           M, K, N, K, weft_backend_name(rt), worst, failed ? ": WRONG" : "");
    return weft_runtime_destroy(rt) || failed;
}
