/*
 * test_launch.c - weft_launch of real kernels, checked bit for bit.
 *
 * saxpy on random data (fmaf on the host, __fmaf_rn on the GPU, so exact),
 * a kernel with arguments of every size and alignment (it echoes them
 * back), grids and blocks in three dimensions (every thread stores its
 * coordinates), dynamic shared memory, a kernel without arguments.
 *
 * Outputs are poisoned before each launch and compared whole, guard words
 * past the end included.
 */
#include <math.h>

#include "gpu_support/gpu_test.h"

enum { GUARD = 16 }; /* poisoned words past every output */

static weft_dim3 dim(unsigned x, unsigned y, unsigned z)
{
    weft_dim3 d = {x, y, z};
    return d;
}

/* ---- saxpy ------------------------------------------------------------- */

typedef struct saxpy_job {
    unsigned id;
} saxpy_job;

static void *saxpy_main(void *arg)
{
    saxpy_job *j = arg;
    uint64_t rng = gt_rng(10 + j->id);
    unsigned n =
        (unsigned)(j->id % 4 == 0 ? gt_between(&rng, 1, 300) : gt_between(&rng, 1, 1 << 20));
    unsigned blocks =
        (unsigned)gt_between(&rng, 1, (n + 255) / 256); /* grid-stride covers the rest */
    float a = gt_float(&rng);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    float *ref = malloc(n * sizeof *ref), *out = malloc((n + GUARD) * sizeof *out);
    float *dx = NULL, *dy = NULL;
    void *args[] = {&n, &a, &dx, &dy};

    if (!GT_CHECK(x && y && ref && out, "malloc"))
        goto out;
    for (unsigned i = 0; i < n; i++) {
        x[i] = gt_float(&rng);
        y[i] = gt_float(&rng);
        ref[i] = fmaf(a, x[i], y[i]);
    }
    memset(out, GT_POISON, (n + GUARD) * sizeof *out);
    if (!GT_OK(weft_malloc_async((void **)&dx, n * sizeof *x)) ||
        !GT_OK(weft_malloc_async((void **)&dy, n * sizeof *y)) ||
        !GT_OK(weft_memcpy_async(dx, x, n * sizeof *x)) ||
        !GT_OK(weft_memcpy_async(dy, y, n * sizeof *y)) ||
        !GT_OK(weft_launch(gk_saxpy(), dim(blocks, 1, 1), dim(256, 1, 1), 0, args)) ||
        !GT_OK(weft_memcpy_async(out, dy, n * sizeof *out)) || !GT_OK(weft_await()))
        goto out;
    size_t bad = gt_first_diff(out, ref, n * sizeof *out) / sizeof *out;
    if (GT_CHECK(bad == n, "saxpy task %u, n %u: y[%zu] = %a, expected %a", j->id, n, bad,
                 (double)out[bad], (double)ref[bad]))
        GT_CHECK(gt_first_not(out + n, GT_POISON, GUARD * sizeof *out) == GUARD * sizeof *out,
                 "saxpy task %u: written past n", j->id);
out:
    if (dx)
        GT_OK(weft_free_async(dx));
    if (dy)
        GT_OK(weft_free_async(dy));
    GT_OK(weft_await());
    free(x);
    free(y);
    free(ref);
    free(out);
    return NULL;
}

/* 32 tasks at once run saxpy on random data of random sizes with random
 * grids; every result is bit-exact against fmaf. */
static void test_saxpy_is_exact(void **state)
{
    enum { N = 32 };
    weft_runtime *rt = gt_runtime(0);
    weft_task *t[N];
    saxpy_job j[N];

    (void)state;
    for (unsigned i = 0; i < N; i++) {
        j[i].id = i;
        assert_ok(weft_spawn(rt, &t[i], saxpy_main, &j[i], NULL));
    }
    for (unsigned i = 0; i < N; i++)
        assert_ok(weft_join(t[i], NULL));
    gt_assert_passed();
    gt_runtime_destroy(rt);
}

/* ---- arguments of every type ------------------------------------------- */

static void *mixed_main(void *arg)
{
    unsigned round = (unsigned)(uintptr_t)arg;
    uint64_t rng = gt_rng(20 + round);
    int8_t a = (int8_t)gt_u32(&rng);
    double f = gt_double(&rng);
    uint16_t b = (uint16_t)gt_u32(&rng);
    int32_t c = (int32_t)gt_u32(&rng);
    gk_mixed m = {(int8_t)gt_u32(&rng), gt_double(&rng), (int16_t)gt_u32(&rng)};
    int64_t d = (int64_t)gt_rng_next(&rng);
    float e = gt_float(&rng);
    unsigned n = (unsigned)gt_between(&rng, 1, 100000);
    uint32_t *in = malloc(n * 4), *in_d = NULL;
    uint64_t *out = malloc((n + GUARD) * 8), *out_d = NULL;
    gk_echo echo, *echo_d = NULL;
    void *args[] = {&a, &f, &b, &in_d, &c, &m, &d, &e, &out_d, &n, &echo_d};

    if (!GT_CHECK(in && out, "malloc"))
        goto out;
    gt_fill(&rng, in, n * 4);
    if (!GT_OK(weft_malloc_async((void **)&in_d, n * 4)) ||
        !GT_OK(weft_malloc_async((void **)&out_d, (n + GUARD) * 8)) ||
        !GT_OK(weft_malloc_async((void **)&echo_d, sizeof echo)) ||
        !GT_OK(weft_memcpy_async(in_d, in, n * 4)) ||
        !GT_OK(weft_memset_async(out_d, GT_POISON, (n + GUARD) * 8)) ||
        !GT_OK(weft_memset_async(echo_d, GT_POISON, sizeof echo)) ||
        !GT_OK(weft_launch(gk_mixed_args(), dim((n + 127) / 128, 1, 1), dim(128, 1, 1), 0, args)) ||
        !GT_OK(weft_memcpy_async(out, out_d, (n + GUARD) * 8)) ||
        !GT_OK(weft_memcpy_async(&echo, echo_d, sizeof echo)) || !GT_OK(weft_await()))
        goto out;
    if (!GT_CHECK(echo.a == a && echo.b == b && echo.c == c && echo.d == d &&
                      gk_bits_d(echo.f) == gk_bits_d(f) && gk_bits_f(echo.e) == gk_bits_f(e),
                  "scalar arguments arrived changed: a %d/%d b %u/%u c %d/%d d %lld/%lld", echo.a,
                  a, echo.b, b, echo.c, c, (long long)echo.d, (long long)d) ||
        !GT_CHECK(echo.m.c == m.c && gk_bits_d(echo.m.d) == gk_bits_d(m.d) && echo.m.s == m.s,
                  "struct argument arrived changed") ||
        !GT_CHECK(echo.in == in_d && echo.out == out_d && echo.n == n,
                  "pointer or count arguments arrived changed"))
        goto out;
    for (unsigned i = 0; i < n; i++) {
        uint64_t want = gk_mixed_ref(in[i], i, a, f, b, c, m, d, e);
        if (!GT_CHECK(out[i] == want, "mixed out[%u] = %016llx, expected %016llx", i,
                      (unsigned long long)out[i], (unsigned long long)want))
            goto out;
    }
    GT_CHECK(gt_first_not(out + n, GT_POISON, GUARD * 8) == GUARD * 8, "mixed: written past n");
out:
    GT_OK(weft_free_async(in_d));
    GT_OK(weft_free_async(out_d));
    GT_OK(weft_free_async(echo_d));
    GT_OK(weft_await());
    free(in);
    free(out);
    return NULL;
}

/* A kernel taking int8, double, uint16, pointer, int32, a padded struct,
 * int64, float, pointer, unsigned, pointer receives each value exactly. */
static void test_kernel_arguments_of_every_type(void **state)
{
    weft_runtime *rt = gt_runtime(0);

    (void)state;
    for (unsigned r = 0; r < 8; r++)
        gt_run(rt, mixed_main, (void *)(uintptr_t)r);
    gt_runtime_destroy(rt);
}

/* ---- launch shapes ----------------------------------------------------- */

typedef struct shape_case {
    weft_dim3 grid, block;
    size_t shared;
} shape_case;

static void *shapes_main(void *arg)
{
    const shape_case *sc = arg;
    size_t per_block = (size_t)sc->block.x * sc->block.y * sc->block.z;
    size_t total = (size_t)sc->grid.x * sc->grid.y * sc->grid.z * per_block;
    uint64_t *out = malloc((total + GUARD) * 8), *out_d = NULL;
    gk_launch_shape shape, *shape_d = NULL;
    void *args[] = {&out_d, &shape_d};

    if (!GT_CHECK(out != NULL, "malloc") ||
        !GT_OK(weft_malloc_async((void **)&out_d, (total + GUARD) * 8)) ||
        !GT_OK(weft_malloc_async((void **)&shape_d, sizeof shape)) ||
        !GT_OK(weft_memset_async(out_d, GT_POISON, (total + GUARD) * 8)) ||
        !GT_OK(weft_memset_async(shape_d, GT_POISON, sizeof shape)) ||
        !GT_OK(weft_launch(gk_coords(), sc->grid, sc->block, sc->shared, args)) ||
        !GT_OK(weft_memcpy_async(out, out_d, (total + GUARD) * 8)) ||
        !GT_OK(weft_memcpy_async(&shape, shape_d, sizeof shape)) || !GT_OK(weft_await()))
        goto out;
    if (!GT_CHECK(shape.grid[0] == sc->grid.x && shape.grid[1] == sc->grid.y &&
                      shape.grid[2] == sc->grid.z && shape.block[0] == sc->block.x &&
                      shape.block[1] == sc->block.y && shape.block[2] == sc->block.z,
                  "launched %ux%ux%u x %ux%ux%u, the kernel saw %ux%ux%u x %ux%ux%u", sc->grid.x,
                  sc->grid.y, sc->grid.z, sc->block.x, sc->block.y, sc->block.z, shape.grid[0],
                  shape.grid[1], shape.grid[2], shape.block[0], shape.block[1], shape.block[2]) ||
        !GT_CHECK(shape.dynamic_shared == sc->shared,
                  "asked for %zu bytes of dynamic shared memory, the kernel had %u", sc->shared,
                  shape.dynamic_shared))
        goto out;
    size_t k = 0;
    for (unsigned bz = 0; bz < sc->grid.z; bz++)
        for (unsigned by = 0; by < sc->grid.y; by++)
            for (unsigned bx = 0; bx < sc->grid.x; bx++)
                for (unsigned tz = 0; tz < sc->block.z; tz++)
                    for (unsigned ty = 0; ty < sc->block.y; ty++)
                        for (unsigned tx = 0; tx < sc->block.x; tx++, k++)
                            if (out[k] != gk_coords_ref(bx, by, bz, tx, ty, tz)) {
                                GT_FAIL("shape %ux%ux%u x %ux%ux%u: word %zu is %016llx, "
                                        "expected block (%u,%u,%u) thread (%u,%u,%u)",
                                        sc->grid.x, sc->grid.y, sc->grid.z, sc->block.x,
                                        sc->block.y, sc->block.z, k, (unsigned long long)out[k], bx,
                                        by, bz, tx, ty, tz);
                                goto out;
                            }
    GT_CHECK(gt_first_not(out + total, GT_POISON, GUARD * 8) == GUARD * 8,
             "written past the last thread's word");
out:
    GT_OK(weft_free_async(out_d));
    GT_OK(weft_free_async(shape_d));
    GT_OK(weft_await());
    free(out);
    return NULL;
}

/* Grids and blocks in all three dimensions reach the kernel unchanged (a
 * grid wider than 65535, a block of 1024 threads, dynamic shared memory
 * sizes): every thread of the launch, and no other, stores its coordinates. */
static void test_grid_and_block_dimensions_reach_the_kernel(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    uint64_t rng = gt_rng(30);
    shape_case fixed[] = {
        {{1, 1, 1}, {1, 1, 1}, 0},      {{3, 5, 7}, {4, 2, 8}, 0},
        {{70001, 1, 1}, {32, 1, 1}, 0}, {{1, 200, 3}, {1, 1, 64}, 128},
        {{2, 2, 2}, {1024, 1, 1}, 0},   {{5, 1, 3}, {8, 8, 16}, 48 * 1024},
        {{1, 1, 255}, {7, 3, 1}, 1},
    };

    (void)state;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        gt_run(rt, shapes_main, &fixed[i]);
    for (unsigned r = 0; r < 8; r++) {
        shape_case sc;
        sc.block.x = (unsigned)gt_between(&rng, 1, 32);
        sc.block.y = (unsigned)gt_between(&rng, 1, 8);
        sc.block.z = (unsigned)gt_between(&rng, 1, 4);
        sc.grid.x = (unsigned)gt_between(&rng, 1, 40);
        sc.grid.y = (unsigned)gt_between(&rng, 1, 12);
        sc.grid.z = (unsigned)gt_between(&rng, 1, 6);
        sc.shared = gt_between(&rng, 0, 8192);
        gt_run(rt, shapes_main, &sc);
    }
    gt_runtime_destroy(rt);
}

typedef struct reverse_case {
    unsigned blocks, threads;
    size_t shared;
} reverse_case;

static void *reverse_main(void *arg)
{
    const reverse_case *rc = arg;
    uint64_t rng = gt_rng(40 + rc->shared);
    unsigned n = rc->blocks * rc->threads;
    uint32_t *in = malloc(n * 4), *out = malloc(n * 4), *data_d = NULL;
    gk_launch_shape shape, *shape_d = NULL;
    bool enough = rc->shared >= rc->threads * 4;
    void *args[] = {&data_d, &n, &shape_d};

    if (!GT_CHECK(in && out, "malloc"))
        goto out;
    gt_fill(&rng, in, n * 4);
    memset(out, GT_POISON, n * 4);
    if (!GT_OK(weft_malloc_async((void **)&data_d, n * 4)) ||
        !GT_OK(weft_malloc_async((void **)&shape_d, sizeof shape)) ||
        !GT_OK(weft_memcpy_async(data_d, in, n * 4)) ||
        !GT_OK(weft_memset_async(shape_d, GT_POISON, sizeof shape)) ||
        !GT_OK(weft_launch(gk_reverse_shared(), dim(rc->blocks, 1, 1), dim(rc->threads, 1, 1),
                           rc->shared, args)) ||
        !GT_OK(weft_memcpy_async(out, data_d, n * 4)) ||
        !GT_OK(weft_memcpy_async(&shape, shape_d, sizeof shape)) || !GT_OK(weft_await()))
        goto out;
    if (!GT_CHECK(shape.dynamic_shared == rc->shared, "asked for %zu shared bytes, had %u",
                  rc->shared, shape.dynamic_shared))
        goto out;
    for (unsigned i = 0; i < n; i++) {
        unsigned base = i / rc->threads * rc->threads, t = i % rc->threads;
        uint32_t want = enough ? in[base + rc->threads - 1 - t] : in[i];
        if (!GT_CHECK(out[i] == want, "reverse (%zu shared bytes): word %u is %08x, expected %08x",
                      rc->shared, i, out[i], want))
            break;
    }
out:
    GT_OK(weft_free_async(data_d));
    GT_OK(weft_free_async(shape_d));
    GT_OK(weft_await());
    free(in);
    free(out);
    return NULL;
}

/* A kernel reversing each block's slice through dynamic shared memory gets
 * exactly the shared_bytes asked for (and with none, touches nothing). */
static void test_dynamic_shared_memory(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    reverse_case cases[] = {
        {300, 256, 1024}, {7, 1024, 4096}, {64, 32, 128 + 4}, {50, 256, 0}, {3, 64, 40 * 1024},
    };

    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        gt_run(rt, reverse_main, &cases[i]);
    gt_runtime_destroy(rt);
}

static void *no_args_main(void *arg)
{
    uint32_t got[2] = {0, GT_POISON32}, *out_d = NULL;
    void *args[] = {&out_d};

    (void)arg;
    if (GT_OK(weft_malloc_async((void **)&out_d, sizeof got)) &&
        GT_OK(weft_memset_async(out_d, GT_POISON, sizeof got)) &&
        GT_OK(weft_launch(gk_set_marker(), dim(1, 1, 1), dim(1, 1, 1), 0, NULL)) &&
        GT_OK(weft_launch(gk_take_marker(), dim(1, 1, 1), dim(1, 1, 1), 0, args)) &&
        GT_OK(weft_memcpy_async(&got[0], out_d, 4)) && GT_OK(weft_await()) &&
        GT_CHECK(got[0] == GK_MARKER_VALUE, "the kernel without arguments did not run: %08x",
                 got[0])) {
        /* taken: a second take reads 0 */
        void *args2[] = {&out_d};
        if (GT_OK(weft_launch(gk_take_marker(), dim(1, 1, 1), dim(1, 1, 1), 0, args2)) &&
            GT_OK(weft_memcpy_async(&got[1], out_d, 4)) && GT_OK(weft_await()))
            GT_CHECK(got[1] == 0, "the marker was not cleared: %08x", got[1]);
    }
    GT_OK(weft_free_async(out_d));
    GT_OK(weft_await());
    return NULL;
}

/* A kernel without parameters launches with args NULL. */
static void test_kernel_without_arguments(void **state)
{
    weft_runtime *rt = gt_runtime(2);

    (void)state;
    gt_run(rt, no_args_main, NULL);
    gt_runtime_destroy(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_saxpy_is_exact),
        cmocka_unit_test(test_kernel_arguments_of_every_type),
        cmocka_unit_test(test_grid_and_block_dimensions_reach_the_kernel),
        cmocka_unit_test(test_dynamic_shared_memory),
        cmocka_unit_test(test_kernel_without_arguments),
    };
    int skip = gt_start("gpu.launch");

    if (skip)
        return skip;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
