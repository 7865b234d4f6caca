/*
 * test_sparse.c - 2:4 structured sparsity on the host: weft_prune_2_4's
 * rule (the two largest magnitudes of each four stay, the earlier of equal
 * ones, NaN above all; padding untouched) on chosen groups and on fresh
 * random rows; sparse weights refusing a group with three nonzeros (named)
 * and keeping a pruned copy; weft_matmul_sparse equal, bit for bit, to
 * weft_matmul on the pruned weight and within matmul_ref.h's bounds of the
 * float64 product, with bias, ReLU, both GELUs, alpha and C; the whole
 * chain on a task's stream (prune, make, multiply) as on the NULL stream;
 * and every bad argument refused with its reason.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "weft.h"
#include "weft/ops.h"
#include "ops/matmul_ref.h"
#include "ops/sparse.h"
#include "weft_test.h"

/* ---- pruning ------------------------------------------------------------- */

/* One group of four through the host prune; out gets the result. */
static void prune_group(weft_dtype t, const float in[4], float out[4])
{
    unsigned char buf[16];
    for (int i = 0; i < 4; i++)
        weft__store(t, buf, (size_t)i, in[i]);
    assert_int_equal(weft_prune_2_4(NULL, t, buf, 1, 4, 4), WEFT_OK);
    for (int i = 0; i < 4; i++)
        out[i] = weft__load(t, buf, (size_t)i);
}

static void test_prune_keeps_the_two_largest_of_each_four(void **state)
{
    (void)state;
    static const struct {
        float in[4], want[4];
    } cases[] = {
        {{1, -3, 2, 0.5f}, {0, -3, 2, 0}},
        {{-4, 1, 1, 4}, {-4, 0, 0, 4}},     /* equal magnitudes: the earlier stays */
        {{2, 2, 2, 2}, {2, 2, 0, 0}},       /* all equal: the first two */
        {{0, 0, 0, 5}, {0, 0, 0, 5}},       /* zeros stay zeros */
        {{1, NAN, 7, -8}, {0, NAN, 0, -8}}, /* NaN counts as largest */
        {{INFINITY, 1, -INFINITY, 2}, {INFINITY, 0, -INFINITY, 0}},
    };
    const weft_dtype types[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
    for (size_t t = 0; t < 3; t++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            float got[4];
            prune_group(types[t], cases[c].in, got);
            for (int i = 0; i < 4; i++) {
                float w = cases[c].want[i];
                if (isnan(w) ? !isnan(got[i]) : got[i] != w)
                    fail_msg("type %d case %zu element %d: %g, want %g", (int)types[t], c, i,
                             (double)got[i], (double)w);
            }
        }
}

/* Random rows with padding: every group ends 2:4, keeps its two largest
 * untouched, and the padding between rows is never written. */
static void test_prune_random_rows(void **state)
{
    (void)state;
    const size_t rows = 37, cols = 64, ld = 72;
    const weft_dtype types[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
    for (size_t t = 0; t < 3; t++) {
        weft_dtype dt = types[t];
        void *w = mm_random(dt, rows * ld, 2.0), *before = mm_random(dt, rows * ld, 1.0);
        memcpy(before, w, rows * ld * weft__dtype_size(dt));
        assert_int_equal(weft_prune_2_4(NULL, dt, w, rows, cols, ld), WEFT_OK);
        size_t r0, c0;
        assert_int_equal(weft__sparse_find_dense_group(dt, w, rows, cols, ld, &r0, &c0), 0);
        for (size_t r = 0; r < rows; r++) {
            for (size_t g = 0; g < cols; g += 4) {
                float x[4];
                for (int i = 0; i < 4; i++)
                    x[i] = weft__load(dt, before, r * ld + g + (size_t)i);
                unsigned keep = weft__prune_keep(x);
                float lo_kept = INFINITY, hi_dropped = 0;
                for (int i = 0; i < 4; i++) {
                    float now = weft__load(dt, w, r * ld + g + (size_t)i);
                    if (keep >> i & 1u) {
                        assert_true(now == x[i]);
                        lo_kept = fminf(lo_kept, fabsf(x[i]));
                    } else {
                        assert_true(now == 0.0f);
                        hi_dropped = fmaxf(hi_dropped, fabsf(x[i]));
                    }
                }
                assert_int_equal(__builtin_popcount(keep), 2);
                assert_true(lo_kept >= hi_dropped);
            }
            size_t es = weft__dtype_size(dt);
            assert_memory_equal((char *)w + (r * ld + cols) * es,
                                (char *)before + (r * ld + cols) * es, (ld - cols) * es);
        }
        free(w), free(before);
    }
}

/* ---- weights and products ---------------------------------------------- */

#ifdef WEFT_HAVE_HOST_BLAS /* the host's product needs a BLAS */

/* A pruned n x k weight of type t (16-byte aligned rows). */
static void *pruned_weight(weft_dtype t, size_t n, size_t k)
{
    void *w = mm_random(t, n * k, 1.0);
    assert_int_equal(weft_prune_2_4(NULL, t, w, n, k, k), WEFT_OK);
    return w;
}

static void test_a_weight_with_three_nonzeros_in_a_group_is_refused(void **state)
{
    (void)state;
    const size_t n = 8, k = 32;
    uint16_t *w = pruned_weight(WEFT_DTYPE_BF16, n, k);
    weft_sparse_weight *sw = (weft_sparse_weight *)1;
    w[5 * k + 8 + 1] = w[5 * k + 8 + 2] = w[5 * k + 8 + 3] = weft__f32_to_bf16(1.0f);
    w[5 * k + 8] = 0;
    assert_int_equal(weft_sparse_weight_create(NULL, WEFT_DTYPE_BF16, w, n, k, 0, &sw),
                     WEFT_EINVAL);
    assert_null(sw);
    assert_non_null(strstr(weft_last_error(), "row 5 has 3 nonzeros in columns 8-11"));
    free(w);
}

/* D = act(alpha A W^T + beta C + bias) through the sparse weight, against
 * weft_matmul on the pruned weight (bit for bit) and the float64 loop. */
static void sparse_case(weft_dtype t, size_t m, size_t n, size_t k, weft_matmul_act act, int with_c,
                        int with_bias, float alpha, size_t lda)
{
    weft_matmul_desc desc = {.m = m,
                             .n = n,
                             .k = k,
                             .type = t,
                             .trans_b = 1,
                             .lda = lda,
                             .alpha = alpha,
                             .beta = with_c ? 0.5f : 0.0f,
                             .act = act};
    mm_geom g = mm_geometry(&desc);
    void *a = mm_random(t, g.na, 1.0), *w = pruned_weight(t, n, k);
    void *c = with_c ? mm_random(t, m * n, 1.0) : NULL;
    void *bias = with_bias ? mm_random(t, n, 1.0) : NULL;
    desc.bias = bias;
    void *d = mm_poisoned(t, g.nd), *want = mm_poisoned(t, g.nd);
    weft_sparse_weight *sw = NULL;
    assert_int_equal(weft_sparse_weight_create(NULL, t, w, n, k, 0, &sw), WEFT_OK);
    assert_int_equal(weft_sparse_weight_bytes(sw), n * k * 2); /* the pruned copy */
    assert_int_equal(weft_matmul_sparse(NULL, &desc, d, a, sw, c), WEFT_OK);
    assert_int_equal(weft_matmul(NULL, &desc, want, a, w, c), WEFT_OK);
    assert_memory_equal(d, want, g.nd * weft__dtype_size(t));
    char name[96];
    snprintf(name, sizeof name, "sparse %zux%zux%zu act %d", m, n, k, (int)act);
    assert_int_equal(mm_check(name, &desc, a, w, c, d, NULL, 1.0, 1), 0);
    weft_sparse_weight_destroy(sw);
    free(a), free(w), free(c), free(bias), free(d), free(want);
}

static void test_the_sparse_product_is_the_product_with_the_pruned_weight(void **state)
{
    (void)state;
    const weft_dtype types[] = {WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
    for (size_t t = 0; t < 2; t++) {
        sparse_case(types[t], 1, 64, 128, WEFT_MATMUL_ACT_NONE, 0, 0, 0.0f, 0);
        sparse_case(types[t], 17, 48, 64, WEFT_MATMUL_ACT_RELU, 0, 1, 0.0f, 0);
        sparse_case(types[t], 33, 32, 256, WEFT_MATMUL_ACT_GELU_TANH, 1, 1, 1.5f, 264);
        sparse_case(types[t], 128, 16, 32, WEFT_MATMUL_ACT_NONE, 1, 0, 0.0f, 40);
        sparse_case(types[t], 9, 24, 96, WEFT_MATMUL_ACT_GELU_ERF, 0, 1, 0.0f, 0);
    }
}

/* The chain on a task's stream: the prune and the product enqueued in
 * order, the weight made after the task's earlier work. */
typedef struct chain {
    size_t m, n, k;
    void *a, *w, *d;
} chain;

static void *chain_task(void *arg)
{
    chain *c = arg;
    weft_sparse_weight *sw = NULL;
    weft_matmul_desc desc = {
        .m = c->m, .n = c->n, .k = c->k, .type = WEFT_DTYPE_BF16, .trans_b = 1};
    if (weft_prune_2_4(WEFT_TASK_STREAM, WEFT_DTYPE_BF16, c->w, c->n, c->k, 0) != WEFT_OK)
        return "the prune failed";
    if (weft_sparse_weight_create(WEFT_TASK_STREAM, WEFT_DTYPE_BF16, c->w, c->n, c->k, 0, &sw) !=
        WEFT_OK)
        return "the weight was refused (made before the prune ran?)";
    if (weft_matmul_sparse(WEFT_TASK_STREAM, &desc, c->d, c->a, sw, NULL) != WEFT_OK)
        return "the product failed";
    int rc = weft_await();
    weft_sparse_weight_destroy(sw);
    return rc == WEFT_OK ? NULL : "the await failed";
}

static void test_the_chain_runs_on_a_tasks_stream(void **state)
{
    weft_runtime *rt = NULL;
    weft_config cfg = {.workers = 2, .backend = WEFT_BACKEND_HOST};
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    chain c = {.m = 5, .n = 32, .k = 64};
    c.a = mm_random(WEFT_DTYPE_BF16, c.m * c.k, 1.0);
    c.w = mm_random(WEFT_DTYPE_BF16, c.n * c.k, 1.0);
    c.d = mm_poisoned(WEFT_DTYPE_BF16, c.m * c.n);
    void *w = mm_random(WEFT_DTYPE_BF16, c.n * c.k, 1.0),
         *want = mm_poisoned(WEFT_DTYPE_BF16, c.m * c.n);
    memcpy(w, c.w, c.n * c.k * 2);
    assert_int_equal(weft_prune_2_4(NULL, WEFT_DTYPE_BF16, w, c.n, c.k, 0), WEFT_OK);
    weft_matmul_desc desc = {.m = c.m, .n = c.n, .k = c.k, .type = WEFT_DTYPE_BF16, .trans_b = 1};
    assert_int_equal(weft_matmul(NULL, &desc, want, c.a, w, NULL), WEFT_OK);
    void *failure = (void *)"not joined";
    assert_int_equal(weft_join(spawn(rt, chain_task, &c), &failure), WEFT_OK);
    if (failure)
        fail_msg("%s", (const char *)failure);
    assert_memory_equal(c.d, want, c.m * c.n * 2);
    assert_memory_equal(c.w, w, c.n * c.k * 2); /* pruned in place, as on the host */
    weft_runtime_destroy(rt);
    free(c.a), free(c.w), free(c.d), free(w), free(want);
    (void)state;
}

static void test_bad_arguments_are_refused(void **state)
{
    (void)state;
    const size_t n = 16, k = 32;
    void *w = pruned_weight(WEFT_DTYPE_BF16, n, k);
    void *a = mm_random(WEFT_DTYPE_BF16, 8 * k, 1.0), *d = mm_poisoned(WEFT_DTYPE_BF16, 8 * n);
    weft_sparse_weight *sw = NULL;
#define REFUSED(call, why)                                                                         \
    do {                                                                                           \
        assert_int_equal((call), WEFT_EINVAL);                                                     \
        if (!strstr(weft_last_error(), why))                                                       \
            fail_msg("%s: said \"%s\", want \"%s\"", #call, weft_last_error(), why);               \
    } while (0)
    REFUSED(weft_prune_2_4(NULL, WEFT_DTYPE_BF16, w, n, 30, 32), "multiple of 4");
    REFUSED(weft_prune_2_4(NULL, WEFT_DTYPE_F8_E4M3, w, n, k, k), "quantized type");
    REFUSED(weft_prune_2_4(NULL, WEFT_DTYPE_BF16, NULL, n, k, k), "w is NULL");
    REFUSED(weft_sparse_weight_create(NULL, WEFT_DTYPE_F32, w, n, k, 0, &sw), "bf16 or fp16");
    REFUSED(weft_sparse_weight_create(NULL, WEFT_DTYPE_BF16, w, n, 30, 0, &sw), "multiple of 4");
    REFUSED(weft_sparse_weight_create(NULL, WEFT_DTYPE_BF16, w, n, 28, 28, &sw),
            "ldw a multiple of 8");
    REFUSED(weft_sparse_weight_create(NULL, WEFT_DTYPE_BF16, (char *)w + 2, n - 1, k, 0, &sw),
            "16-byte aligned");
    REFUSED(weft_sparse_weight_create(NULL, WEFT_DTYPE_BF16, w, n, k, 0, NULL), "out is NULL");
    assert_int_equal(weft_sparse_weight_create(NULL, WEFT_DTYPE_BF16, w, n, k, 0, &sw), WEFT_OK);

    weft_matmul_desc ok = {.m = 8, .n = n, .k = k, .type = WEFT_DTYPE_BF16, .trans_b = 1};
    weft_matmul_desc x = ok;
    x.type = WEFT_DTYPE_F16;
    REFUSED(weft_matmul_sparse(NULL, &x, d, a, sw, NULL), "the weight's");
    x = ok, x.trans_b = 0;
    REFUSED(weft_matmul_sparse(NULL, &x, d, a, sw, NULL), "trans_b 1");
    x = ok, x.n = n + 8;
    REFUSED(weft_matmul_sparse(NULL, &x, d, a, sw, NULL), "the weight's 16 x 32");
    x = ok, x.batch = 2;
    REFUSED(weft_matmul_sparse(NULL, &x, d, a, sw, NULL), "batch 0 or 1");
    x = ok, x.aux = d;
    REFUSED(weft_matmul_sparse(NULL, &x, d, a, sw, NULL), "aux");
    x = ok, x.lda = k + 4;
    REFUSED(weft_matmul_sparse(NULL, &x, d, a, sw, NULL), "16-byte aligned");
    x = ok, x.m = 0;
    REFUSED(weft_matmul_sparse(NULL, &x, d, a, sw, NULL), "weft_matmul_sparse: weft_matmul:");
    REFUSED(weft_matmul_sparse(NULL, &ok, d, a, NULL, NULL), "w is NULL");
    REFUSED(weft_matmul_sparse(NULL, NULL, d, a, sw, NULL), "desc is NULL");
    assert_int_equal(weft_matmul_sparse(WEFT_TASK_STREAM, &ok, d, a, sw, NULL), WEFT_ENOTASK);
    for (size_t i = 0; i < 8 * n; i++)
        assert_true(mm_poison_kept(WEFT_DTYPE_BF16, d, i));
#undef REFUSED
    weft_sparse_weight_destroy(sw);
    weft_sparse_weight_destroy(NULL);
    free(w), free(a), free(d);
}
#endif

int main(void)
{
    mm_rng_state = (uint64_t)time(NULL);
    printf("seed %llu\n", (unsigned long long)mm_rng_state);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prune_keeps_the_two_largest_of_each_four),
        cmocka_unit_test(test_prune_random_rows),
#ifdef WEFT_HAVE_HOST_BLAS
        cmocka_unit_test(test_a_weight_with_three_nonzeros_in_a_group_is_refused),
        cmocka_unit_test(test_the_sparse_product_is_the_product_with_the_pruned_weight),
        cmocka_unit_test(test_the_chain_runs_on_a_tasks_stream),
        cmocka_unit_test(test_bad_arguments_are_refused),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
