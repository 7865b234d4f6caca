/*
 * operators.c - the guide's fused operator (docs/guide.md, "Fused
 * operators"): the tail of a transformer block, bias + GELU + residual +
 * LayerNorm, called from a task on the task's own stream
 * (WEFT_TASK_STREAM) between its copies, and awaited with them. On a GPU
 * that is the op's kernel; on the host backend the host reference, run in
 * stream order: the same code for both. The result is checked against the
 * host reference called directly (stream NULL).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <weft.h>
#include <weft/ops.h>

enum { ROWS = 64, COLS = 1024 };

typedef struct layer {
    float *x, *y, *b1, *res, *gamma, *beta; /* device memory */
    float *host_x, *host_y;
    size_t rows, cols, bytes;
} layer;

/* The host's copies of the weights, and the input. */
static float in[ROWS][COLS], bias1[COLS], residual[ROWS][COLS], weight[COLS], bias2[COLS];
static float out[ROWS][COLS], expect[ROWS][COLS];

static void *upload(void *arg) /* device memory and the weights, once */
{
    layer *l = arg;
    size_t row = COLS * sizeof(float);
    int rc;
    if ((rc = weft_malloc_async((void **)&l->x, l->bytes)) ||
        (rc = weft_malloc_async((void **)&l->y, l->bytes)) ||
        (rc = weft_malloc_async((void **)&l->res, l->bytes)) ||
        (rc = weft_malloc_async((void **)&l->b1, row)) ||
        (rc = weft_malloc_async((void **)&l->gamma, row)) ||
        (rc = weft_malloc_async((void **)&l->beta, row)) ||
        (rc = weft_memcpy_async(l->res, residual, l->bytes)) ||
        (rc = weft_memcpy_async(l->b1, bias1, row)) ||
        (rc = weft_memcpy_async(l->gamma, weight, row)) ||
        (rc = weft_memcpy_async(l->beta, bias2, row)) || (rc = weft_await()))
        fprintf(stderr, "%s\n", weft_last_error());
    return (void *)(intptr_t)rc;
}

static void *block_tail(void *arg)
{
    layer *l = arg;
    int rc;
    if ((rc = weft_memcpy_async(l->x, l->host_x, l->bytes)) ||
        (rc = weft_bias_gelu_residual_layernorm(WEFT_TASK_STREAM, WEFT_DTYPE_F32, WEFT_GELU_ERF,
                                                l->y, NULL, l->x, l->b1, l->res, l->gamma, l->beta,
                                                1e-5f, l->rows, l->cols, l->cols)) ||
        (rc = weft_memcpy_async(l->host_y, l->y, l->bytes)) || (rc = weft_await()))
        fprintf(stderr, "%s\n", weft_last_error());
    return (void *)(intptr_t)rc;
}

static void *release(void *arg)
{
    layer *l = arg;
    float *bufs[] = {l->x, l->y, l->res, l->b1, l->gamma, l->beta};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        weft_free_async(bufs[i]);
    return (void *)(intptr_t)weft_await();
}

static int run_task(weft_runtime *rt, void *(*fn)(void *), layer *l)
{
    weft_task *t;
    void *r = (void *)1;
    if (weft_spawn(rt, &t, fn, l, NULL) || weft_join(t, &r))
        fprintf(stderr, "operators: %s\n", weft_last_error());
    return r != NULL;
}

/* A value in [0, 1], from rand(): the same on every run. */
static float uniform(void)
{
    return (float)rand() / (float)RAND_MAX;
}

int main(void)
{
    srand(1);
    for (int c = 0; c < COLS; c++) {
        bias1[c] = uniform() - 0.5f;
        weight[c] = 0.5f + uniform();
        bias2[c] = uniform() - 0.5f;
        for (int r = 0; r < ROWS; r++) {
            in[r][c] = 4.0f * uniform() - 2.0f;
            residual[r][c] = uniform() - 0.5f;
        }
    }
    /* the host reference, called directly */
    if (weft_bias_gelu_residual_layernorm(NULL, WEFT_DTYPE_F32, WEFT_GELU_ERF, expect, NULL, in,
                                          bias1, residual, weight, bias2, 1e-5f, ROWS, COLS,
                                          COLS)) {
        fprintf(stderr, "operators: %s\n", weft_last_error());
        return 1;
    }

    weft_runtime *rt;
    layer l = {
        .host_x = &in[0][0], .host_y = &out[0][0], .rows = ROWS, .cols = COLS, .bytes = sizeof in};
    if (weft_runtime_create(&rt, NULL)) {
        fprintf(stderr, "operators: %s\n", weft_last_error());
        return 1;
    }
    int failed = run_task(rt, upload, &l) || run_task(rt, block_tail, &l);
    failed |= run_task(rt, release, &l);

    double worst = 0;
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++) {
            double d = fabs((double)out[r][c] - expect[r][c]);
            worst = d > worst || d != d ? d : worst;
        }
    failed |= !(worst <= 1e-4);
    printf("operators: bias + GELU + residual + LayerNorm on %dx%d fp32 from a task on the %s "
           "backend, off the host reference by at most %.1e%s\n",
           ROWS, COLS, weft_backend_name(rt), worst, failed ? ": WRONG" : "");
    return weft_runtime_destroy(rt) || failed;
}
