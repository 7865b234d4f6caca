/*
 * test_ops_task.c - the operators on a task's own stream (WEFT_TASK_STREAM)
 * with the host backend: each call joins the task's other work in stream
 * order, reads its arguments as they were at the call, and computes what the
 * host reference computes at once.
 *
 * Order is tested without timing: a host function ahead of the op in the
 * stream holds it until the task has seen the op's output still untouched,
 * then writes the op's input; the op must run after it and before the await
 * returns.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <string.h>

#include "weft.h"
#include "weft/ops.h"
#include "weft_test.h"

enum { ROWS = 3, COLS = 40, N = ROWS * COLS, HEAD = 20 };

/* Each case: the op from in to out (ROWS x COLS floats; GLU's output is
 * half as wide, RoPE turns out in place after copying in to it). */
typedef struct op_case {
    const char *name;
    int (*call)(void *stream, float *in, float *out);
} op_case;

static int gelu_call(void *stream, float *in, float *out)
{
    return weft_bias_gelu_residual(stream, WEFT_DTYPE_F32, WEFT_GELU_ERF, out, in, in + COLS, NULL,
                                   ROWS - 1, COLS, COLS);
}

static int layernorm_call(void *stream, float *in, float *out)
{
    return weft_layernorm(stream, WEFT_DTYPE_F32, out, NULL, in, NULL, in + COLS, NULL, 1e-5f, 2,
                          COLS, COLS);
}

static int rmsnorm_call(void *stream, float *in, float *out)
{
    return weft_rmsnorm(stream, WEFT_DTYPE_F32, out, NULL, in, NULL, NULL, 1e-5f, ROWS, COLS, COLS);
}

/* The options live on this frame only: the op must have taken them by the
 * time it returns. */
static int softmax_call(void *stream, float *in, float *out)
{
    weft_softmax_opts opts = {.scale = 0.5f, .causal_q = 2, .dropout_p = 0.25f, .seed = 9};
    return weft_softmax(stream, WEFT_DTYPE_F32, out, in, ROWS, COLS, COLS, &opts);
}

static int glu_call(void *stream, float *in, float *out)
{
    return weft_glu(stream, WEFT_DTYPE_F32, WEFT_GLU_SWIGLU, out, in, ROWS, COLS / 2, COLS,
                    COLS / 2);
}

static const int32_t POSITIONS[ROWS] = {0, 7, 100000};

static int rope_call(void *stream, float *in, float *out)
{
    int rc;
    if (stream == NULL)
        memcpy(out, in, N * sizeof *out);
    else if ((rc = weft_memcpy_async(out, in, N * sizeof *out)) != WEFT_OK)
        return rc;
    return weft_rope(stream, WEFT_DTYPE_F32, WEFT_ROPE_HALVES, out, 1, COLS, out + HEAD, 1, COLS,
                     ROWS, HEAD, POSITIONS, 10000.0f);
}

#ifdef WEFT_HAVE_HOST_BLAS /* (a build without one refuses host matmuls) */
/* D (3 x 4, rows COLS apart) = GELU(A B + bias): A 3 x 20 (rows COLS
 * apart), B 20 x 4 and the bias read from in; the descriptor lives on this
 * frame only. */
static int matmul_call(void *stream, float *in, float *out)
{
    weft_matmul_desc desc = {.m = ROWS,
                             .n = 4,
                             .k = HEAD,
                             .type = WEFT_DTYPE_F32,
                             .lda = COLS,
                             .ldd = COLS,
                             .act = WEFT_MATMUL_ACT_GELU_TANH,
                             .bias = in + N - 4};
    return weft_matmul(stream, &desc, out, in, in + HEAD, NULL);
}

/* INT8 dequantized: D (3 x 4, rows COLS apart) = ReLU(float(A B^T) sa sb_j)
 * with A 3 x 20 and B 4 x 20 int8 (the bytes of in's first 35 floats) and
 * the scales in's floats 40 (per tensor) and 41..44 (per column), so that
 * the scales too must be read when the op runs, not at the call. */
static int matmul_int8_call(void *stream, float *in, float *out)
{
    weft_matmul_desc desc = {.m = ROWS,
                             .n = 4,
                             .k = HEAD,
                             .type = WEFT_DTYPE_F32,
                             .in_type = WEFT_DTYPE_I8,
                             .trans_b = 1,
                             .ldd = COLS,
                             .act = WEFT_MATMUL_ACT_RELU,
                             .scale_a_mode = WEFT_MATMUL_SCALE_TENSOR,
                             .scale_b_mode = WEFT_MATMUL_SCALE_OUTER,
                             .scale_a = in + 40,
                             .scale_b = in + 41};
    return weft_matmul(stream, &desc, out, in, (const char *)in + ROWS * HEAD, NULL);
}

#endif

/* A depthwise 3x3 convolution with ReLU: the input 1 x 3 x 5 x 4, the
 * weights (36) and the bias (4) read from in; the descriptor lives on this
 * frame only. */
static const weft_conv2d_desc CONV = {
    .n = 1, .h = 3, .w = 5, .c = 4, .k = 4, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1, .groups = 4};

static int conv_call(void *stream, float *in, float *out)
{
    weft_conv2d_desc desc = CONV;
    desc.act = WEFT_CONV_ACT_RELU;
    return weft_conv2d(stream, &desc, out, in, in + 60, in + 96);
}

/* A BatchNorm folded into its weights: every tensor read from in (a
 * negative variance gives NaNs, the same on both sides). */
static int fold_call(void *stream, float *in, float *out)
{
    weft_conv2d_desc desc = CONV;
    return weft_conv2d_fold_bn(stream, &desc, WEFT_DTYPE_F32, out, out + 36, in, in + 36, in + 40,
                               in + 44, in + 48, in + 52, 0.5f);
}

static const op_case CASES[] = {
    {"conv2d", conv_call},
    {"conv2d_fold_bn", fold_call},
#ifdef WEFT_HAVE_HOST_BLAS
    {"matmul", matmul_call},
    {"matmul int8", matmul_int8_call},
#endif
    {"bias_gelu_residual", gelu_call},
    {"layernorm", layernorm_call},
    {"rmsnorm", rmsnorm_call},
    {"softmax", softmax_call},
    {"glu", glu_call},
    {"rope", rope_call},
};

/* Holds the stream until released, then writes the op's input. */
typedef struct gate {
    atomic_int open;
    const float *src;
    float *in;
} gate;

static void hold_then_fill(void *arg)
{
    gate *g = arg;
    for (int ms = 0; ms < 10000 && !atomic_load(&g->open); ms++)
        sleep_ms(1);
    memcpy(g->in, g->src, N * sizeof *g->in);
}

static void fill(float *x, unsigned seed)
{
    for (int i = 0; i < N; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (float)((int)(seed >> 16 & 0x7fff) - 16384) / 4096.0f;
    }
}

/* Runs one case on the task's stream; NULL, or what went wrong. */
static void *run_case(void *arg)
{
    const op_case *c = arg;
    float src[N], in[N], out[N], want[N], poison[N];
    gate g = {.src = src, .in = in};

    fill(src, 12345u);
    memset(poison, 0xff, sizeof poison); /* all-ones NaNs: no op writes them here */
    memcpy(want, poison, sizeof want);   /* what an op leaves alone stays so */
    if (c->call(NULL, src, want) != WEFT_OK)
        return "the host call failed";
    memset(in, 0, sizeof in); /* an op that ran too early reads zeros */
    memcpy(out, poison, sizeof out);

    if (weft_host_async(hold_then_fill, &g) != WEFT_OK)
        return "weft_host_async failed";
    int rc = c->call(WEFT_TASK_STREAM, in, out);
    bool untouched = memcmp(out, poison, sizeof out) == 0;
    atomic_store(&g.open, 1);
    if (weft_await() != WEFT_OK || rc != WEFT_OK)
        return "the call or the await failed";
    if (!untouched)
        return "the op ran before the work ahead of it in the stream";
    if (memcmp(out, want, sizeof out) != 0)
        return "the result differs from the host call's";
    return NULL;
}

static void test_ops_run_in_the_tasks_stream_order(void **state)
{
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        void *failure = (void *)"not joined";
        assert_int_equal(weft_join(spawn(*state, run_case, (void *)&CASES[i]), &failure), WEFT_OK);
        if (failure)
            fail_msg("%s: %s", CASES[i].name, (const char *)failure);
    }
}

/* Bad arguments are refused at the call, and nothing is enqueued. */
static void *bad_arguments(void *arg)
{
    (void)arg;
    float x[N] = {0};
    if (weft_layernorm(WEFT_TASK_STREAM, WEFT_DTYPE_F32, x, NULL, x, NULL, NULL, NULL, -1.0f, ROWS,
                       COLS, COLS) != WEFT_EINVAL ||
        strstr(weft_last_error(), "eps") == NULL)
        return "a negative eps was not refused";
    if (weft_softmax(WEFT_TASK_STREAM, WEFT_DTYPE_F32, x, NULL, ROWS, COLS, COLS, NULL) !=
        WEFT_EINVAL)
        return "a NULL input was not refused";
    if (weft_await() != WEFT_OK)
        return "the await failed";
    for (int i = 0; i < N; i++)
        if (x[i] != 0.0f)
            return "a refused call wrote its output";
    return NULL;
}

static void test_bad_arguments_are_refused_before_anything_is_enqueued(void **state)
{
    void *failure = (void *)"not joined";
    assert_int_equal(weft_join(spawn(*state, bad_arguments, NULL), &failure), WEFT_OK);
    if (failure)
        fail_msg("%s", (const char *)failure);
}

static void test_the_task_stream_outside_a_task_is_refused(void **state)
{
    (void)state;
    float x[N] = {0};
    assert_int_equal(rmsnorm_call(WEFT_TASK_STREAM, x, x), WEFT_ENOTASK);
    assert_non_null(strstr(weft_last_error(), "weft_rmsnorm: WEFT_TASK_STREAM outside a task"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_run_in_the_tasks_stream_order),
        cmocka_unit_test(test_bad_arguments_are_refused_before_anything_is_enqueued),
        cmocka_unit_test(test_the_task_stream_outside_a_task_is_refused),
    };
    return cmocka_run_group_tests(tests, setup_host_rt, teardown_rt);
}
