/*
 * test_plans.cu - the row operators' launch plans (src/ops/rows.cuh), on
 * the host: every row length a plan is asked for must be covered by the
 * threads it gives, with a kernel instantiated for its vectors a thread.
 *
 * The GPU suite runs the kernels on a few dozen awkward shapes; a plan that
 * left the end of some other row length unread, or asked for a kernel that
 * does not exist, would only show there by chance. These are pure
 * functions, so here they are swept over every length up to 4096 and a
 * spread beyond, for each vector width. Built with nvcc; needs no GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" { /* this cmocka.h declares its C functions without it */
#include <cmocka.h>
}

#include <stdio.h>

#include "ops/rows.cuh"

using namespace weft_ops;

static const int WIDTHS[] = {1, 2, 4, 8}; /* elements a vector: 16 bytes or one element */
static const int HELD_WIDTHS[] = {4, 8};  /* the held kernels' (fp32, half types) */

/* Row lengths: all up to 4096, then a spread to beyond what a block holds,
 * with the lengths either side of each power of two. */
template <typename F> static void for_each_cols(F f)
{
    for (size_t cols = 1; cols <= 4096; cols++)
        f(cols);
    for (size_t cols = 4097; cols <= 300000; cols += 997)
        f(cols);
    for (size_t p = 8192; p <= ((size_t)1 << 22); p *= 2) {
        f(p - 1);
        f(p);
        f(p + 1);
    }
}

static bool pow2(size_t n)
{
    return n != 0 && (n & (n - 1)) == 0;
}

/* Elements the plan's threads reach in a row. */
static size_t reach(const row_plan &p, int V)
{
    return (size_t)p.cluster * p.tiles * p.tpr * p.vpt * (size_t)V;
}

/* What every plan must hold, whichever kernel it is for: blocks of up to
 * max_tpr threads (512, or 1024 for packed rows). */
static void check_common(const row_plan &p, size_t cols, int V, const char *what,
                         unsigned max_tpr = 512)
{
    bool ok = pow2(p.tpr) && p.tpr >= 32 && p.tpr <= max_tpr && pow2(p.cluster) && p.cluster <= 8 &&
              p.tiles >= 1 && reach(p, V) >= cols && (p.rpb == 1 || (p.rpb == 8 && p.tpr == 32));
    if (!ok)
        fail_msg("%s, %zu columns of V = %d: tpr %u, rpb %u, cluster %u, vpt %u, tiles %zu "
                 "reach %zu",
                 what, cols, V, p.tpr, p.rpb, p.cluster, p.vpt, p.tiles, reach(p, V));
}

/* The register-tile kernels: instantiated for vpt a power of two up to
 * vpt_max(V); long rows loop over tiles in a cluster of 8. */
static void test_plan_rows_covers_every_length(void **state)
{
    (void)state;
    for (int V : WIDTHS)
        for_each_cols([&](size_t cols) {
            row_plan p = plan_rows(cols, V);
            check_common(p, cols, V, "plan_rows");
            if (!pow2(p.vpt) || p.vpt > vpt_max(V) || (p.tiles > 1 && p.cluster != 8))
                fail_msg("plan_rows, %zu columns of V = %d: vpt %u, cluster %u, tiles %zu", cols, V,
                         p.vpt, p.cluster, p.tiles);
            /* no more than one tile's worth of threads beyond the row */
            if (reach(p, V) >= cols + (size_t)p.cluster * p.tpr * p.vpt * V && p.tiles > 1)
                fail_msg("plan_rows, %zu columns: %zu tiles reach %zu", cols, p.tiles, reach(p, V));
        });
}

/* The held kernels: the whole row in registers, at most HELD_MAX_VALUES a
 * thread (vpt a power of two), one tile; rows too long for 8 blocks of 512
 * threads are refused, and only those. */
static void test_plan_held_covers_every_length_it_takes(void **state)
{
    (void)state;
    for (int V : HELD_WIDTHS)
        for (unsigned values : {8u, 16u, 32u})
            for_each_cols([&](size_t cols) {
                row_plan p;
                bool taken = plan_held(cols, V, values, &p);
                if (taken != (cols <= (size_t)8 * 512 * HELD_MAX_VALUES))
                    fail_msg("plan_held, %zu columns of V = %d: %s", cols, V,
                             taken ? "taken" : "refused");
                if (!taken)
                    return;
                check_common(p, cols, V, "plan_held");
                if (!pow2(p.vpt) || p.vpt * (unsigned)V > HELD_MAX_VALUES || p.tiles != 1)
                    fail_msg("plan_held, %zu columns of V = %d at %u values: vpt %u, tiles "
                             "%zu, rpb %u",
                             cols, V, values, p.vpt, p.tiles, p.rpb);
                /* a block or cluster a row takes no more threads than it needs
                 * at up to `values` a thread */
                if (p.tpr > 32 && p.cluster == 1 && p.tpr / 2 * values >= cols)
                    fail_msg("plan_held, %zu columns at %u values: %u threads", cols, values,
                             p.tpr);
            });
}

/* The packed held kernels (half types): at most PACKED_MAX_VALUES a
 * thread in blocks of up to 1024 threads; rows too long for 8 such blocks
 * are refused, and only those. Asked for 64 values a thread, as the
 * library asks on rows that a cluster would hold as fp32, every row longer
 * than 512 threads at 32 values gets the one kernel it instantiates: 64. */
static void test_plan_packed_covers_every_length_it_takes(void **state)
{
    (void)state;
    const int V = 8;
    for (unsigned values : {16u, 32u, 64u})
        for_each_cols([&](size_t cols) {
            row_plan p;
            bool taken = plan_packed(cols, V, values, &p);
            if (taken != (cols <= (size_t)8 * 1024 * PACKED_MAX_VALUES))
                fail_msg("plan_packed, %zu columns: %s", cols, taken ? "taken" : "refused");
            if (!taken)
                return;
            check_common(p, cols, V, "plan_packed", 1024);
            if (!pow2(p.vpt) || p.vpt * (unsigned)V > PACKED_MAX_VALUES || p.tiles != 1)
                fail_msg("plan_packed, %zu columns at %u values: vpt %u, tiles %zu", cols, values,
                         p.vpt, p.tiles);
            if (values == 64 && cols > 512 * 32 && p.vpt * (unsigned)V != 64)
                fail_msg("plan_packed, %zu columns at 64 values: vpt %u", cols, p.vpt);
        });
}

/* Split over warps, a row a warp would hold keeps its reach and comes to
 * at most `values` a thread, in a block of its own. */
static void test_split_warp_rows_keeps_the_reach(void **state)
{
    (void)state;
    unsigned split_some = 0;
    for (int V : HELD_WIDTHS)
        for_each_cols([&](size_t cols) {
            row_plan warp, split;
            if (!plan_held(cols, V, 16, &warp))
                return;
            split = warp;
            plan_held_split_warp_rows(&split, V, 16);
            if (warp.tpr != 32) {
                if (split.tpr != warp.tpr || split.vpt != warp.vpt || split.rpb != warp.rpb)
                    fail_msg("split changed a plan of %u threads a row (%zu columns)", warp.tpr,
                             cols);
                return;
            }
            check_common(split, cols, V, "plan_held_split_warp_rows");
            if (reach(split, V) != reach(warp, V) || (split.vpt > 1 && split.vpt * V > 16) ||
                (split.tpr > 32 && split.rpb != 1))
                fail_msg("split of %zu columns of V = %d: tpr %u, vpt %u, rpb %u", cols, V,
                         split.tpr, split.vpt, split.rpb);
            split_some += split.tpr > 32;
        });
    assert_true(split_some > 0); /* rows of 1024 in half types, for one */
}

/* The staged kernels: the row in shared memory, within a block's share, in
 * a cluster of up to 8; rows beyond that are refused. */
static void test_plan_staged_covers_every_length_it_takes(void **state)
{
    (void)state;
    for (int V : HELD_WIDTHS)
        for (unsigned buffers : {1u, 2u})
            for_each_cols([&](size_t cols) {
                row_plan p;
                if (!plan_staged(cols, V, buffers, &p))
                    return;
                check_common(p, cols, V, "plan_staged");
                if (p.vpt == 0 || p.smem > STAGED_BLOCK_BYTES ||
                    p.smem < (size_t)p.rpb * p.tpr * p.vpt * 16 * buffers)
                    fail_msg("plan_staged, %zu columns of V = %d: vpt %u, %zu bytes a block", cols,
                             V, p.vpt, p.smem);
            });
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_rows_covers_every_length),
        cmocka_unit_test(test_plan_held_covers_every_length_it_takes),
        cmocka_unit_test(test_plan_packed_covers_every_length_it_takes),
        cmocka_unit_test(test_split_warp_rows_keeps_the_reach),
        cmocka_unit_test(test_plan_staged_covers_every_length_it_takes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
