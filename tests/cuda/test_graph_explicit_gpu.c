/*
 * test_graph_explicit.c - graphs built by hand: copies, fills, kernels and
 * host work with explicit dependencies, child graphs, IF and WHILE nodes
 * whose conditions the GPU sets, and the misuses each call refuses.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_support/gpu_kernels.h"
#include "gpu_support/gpu_test.h"
#include "weft.h"

enum { N = 1 << 15, LAUNCHES = 4 };

static weft_dim3 dim(unsigned x)
{
    weft_dim3 d = {x, 1, 1};
    return d;
}

static void count_run(void *arg)
{
    atomic_fetch_add((atomic_uint *)arg, 1);
}

/* ---- nodes and dependencies -------------------------------------------- */

typedef struct pipeline {
    uint32_t *in, *out;   /* pinned */
    uint32_t *a, *b;      /* device */
    uint32_t mul, add, c; /* the kernels' scalars, fixed at build time */
    unsigned n;
    atomic_uint host_runs;
} pipeline;

/* in -> a; b zeroed meanwhile; b = affine(a); b = scramble(b); b -> out;
 * then a host node counts the run. */
static bool build_pipeline(weft_graph *g, pipeline *p)
{
    weft_graph_node up, zero, aff, scr, down;
    void *affine_args[] = {&p->b, &p->a, &p->n, &p->mul, &p->add};
    void *scramble_args[] = {&p->b, &p->b, &p->n, &p->c};
    return GT_OK(weft_graph_add_copy(g, &up, NULL, 0, p->a, p->in, N * 4)) &&
           GT_OK(weft_graph_add_fill(g, &zero, NULL, 0, p->b, 0, N * 4)) &&
           GT_OK(weft_graph_add_kernel(g, &aff, (weft_graph_node[]){up, zero}, 2, gk_affine(),
                                       dim(64), dim(256), 0, affine_args)) &&
           GT_OK(weft_graph_add_kernel(g, &scr, &aff, 1, gk_scramble(), dim(64), dim(256), 0,
                                       scramble_args)) &&
           GT_OK(weft_graph_add_copy(g, &down, &scr, 1, p->out, p->b, N * 4)) &&
           GT_OK(weft_graph_add_host(g, NULL, &down, 1, count_run, &p->host_runs));
}

static void *pipeline_main(void *arg)
{
    weft_runtime *rt = weft_runtime_current();
    uint64_t rng = gt_rng(301);
    pipeline *p = arg;
    weft_graph *g = NULL;
    p->n = N;
    p->mul = gt_u32(&rng) | 1, p->add = gt_u32(&rng), p->c = gt_u32(&rng);
    if (!GT_OK(weft_host_alloc(rt, (void **)&p->in, N * 4)) ||
        !GT_OK(weft_host_alloc(rt, (void **)&p->out, N * 4)) ||
        !GT_OK(weft_malloc_async((void **)&p->a, N * 4)) ||
        !GT_OK(weft_malloc_async((void **)&p->b, N * 4)) || !GT_OK(weft_await()) ||
        !GT_OK(weft_graph_create(rt, &g)) || !build_pipeline(g, p))
        return NULL;
    for (unsigned r = 0; r < LAUNCHES; r++) { /* new input each launch */
        gt_fill(&rng, p->in, N * 4);
        memset(p->out, GT_POISON, N * 4);
        if (!GT_OK(weft_graph_launch(g)) || !GT_OK(weft_await()))
            break;
        for (unsigned i = 0; i < N; i++) {
            uint32_t want = gk_scramble_ref(gk_affine_ref(p->in[i], p->mul, p->add), i, p->c);
            if (!GT_CHECK(p->out[i] == want, "launch %u: out[%u] = %#x, expected %#x", r, i,
                          p->out[i], want))
                return NULL;
        }
        GT_CHECK(atomic_load(&p->host_runs) == r + 1, "launch %u: the host node ran %u times", r,
                 atomic_load(&p->host_runs));
    }
    /* sealed once launched */
    GT_RC(weft_graph_add_fill(g, NULL, NULL, 0, p->b, 0, 4), WEFT_ESTATE);
    GT_OK(weft_graph_destroy(g));
    GT_OK(weft_free_async(p->a));
    GT_OK(weft_free_async(p->b));
    GT_OK(weft_await());
    weft_host_free(rt, p->in);
    weft_host_free(rt, p->out);
    return NULL;
}

static void test_nodes_run_in_dependency_order_every_launch(void **state)
{
    weft_runtime *rt = gt_runtime(2);
    pipeline p = {0};
    (void)state;
    gt_run(rt, pipeline_main, &p);
    assert_int_equal(atomic_load(&p.host_runs), LAUNCHES);
    gt_runtime_destroy(rt);
}

/* ---- child graphs ------------------------------------------------------- */

static void *child_main(void *arg)
{
    weft_runtime *rt = weft_runtime_current();
    uint64_t rng = gt_rng(302);
    uint32_t *in, *out, *dev = NULL, mul = gt_u32(&rng) | 1, add = gt_u32(&rng);
    unsigned n = N;
    weft_graph *child = NULL, *parent = NULL;
    weft_graph_node up, middle;
    void *args[] = {&dev, &dev, &n, &mul, &add};
    (void)arg;
    if (!GT_OK(weft_host_alloc(rt, (void **)&in, N * 4)) ||
        !GT_OK(weft_host_alloc(rt, (void **)&out, N * 4)) ||
        !GT_OK(weft_malloc_async((void **)&dev, N * 4)) || !GT_OK(weft_await()) ||
        !GT_OK(weft_graph_create(rt, &child)) || !GT_OK(weft_graph_create(rt, &parent)) ||
        !GT_OK(
            weft_graph_add_kernel(child, NULL, NULL, 0, gk_affine(), dim(64), dim(256), 0, args)) ||
        !GT_OK(weft_graph_add_copy(parent, &up, NULL, 0, dev, in, N * 4)) ||
        !GT_OK(weft_graph_add_child(parent, &middle, &up, 1, child)) ||
        !GT_OK(weft_graph_add_copy(parent, NULL, &middle, 1, out, dev, N * 4)))
        return NULL;
    GT_RC(weft_graph_add_child(parent, NULL, NULL, 0, parent), WEFT_EINVAL);
    gt_fill(&rng, in, N * 4);
    memset(out, GT_POISON, N * 4);
    if (GT_OK(weft_graph_launch(parent)) && GT_OK(weft_await()))
        for (unsigned i = 0; i < N; i++)
            if (!GT_CHECK(out[i] == gk_affine_ref(in[i], mul, add), "out[%u] = %#x", i, out[i]))
                break;
    GT_OK(weft_graph_destroy(parent));
    GT_OK(weft_graph_destroy(child));
    GT_OK(weft_free_async(dev));
    GT_OK(weft_await());
    weft_host_free(rt, in);
    weft_host_free(rt, out);
    return NULL;
}

static void test_a_child_graph_runs_inside_its_parent(void **state)
{
    weft_runtime *rt = gt_runtime(2);
    (void)state;
    gt_run(rt, child_main, NULL);
    gt_runtime_destroy(rt);
}

/* ---- conditional nodes --------------------------------------------------- */

/* A WHILE loop whose trip count is a limit only the GPU reads: the count it
 * leaves must equal the limit, launch after launch, limits drawn anew. */
static void *while_main(void *arg)
{
    weft_runtime *rt = weft_runtime_current();
    uint64_t rng = gt_rng(303);
    unsigned *host, *dev = NULL; /* [0] count, [1] limit */
    weft_graph *g = NULL, *body = NULL;
    weft_graph_cond cond;
    weft_graph_node up, zero, loop;
    (void)arg;
    if (!GT_OK(weft_host_alloc(rt, (void **)&host, 2 * sizeof *host)) ||
        !GT_OK(weft_malloc_async((void **)&dev, 2 * sizeof *dev)) || !GT_OK(weft_await()) ||
        !GT_OK(weft_graph_create(rt, &g)) || !GT_OK(weft_graph_cond_create(g, &cond, 1)))
        return NULL;
    unsigned *count = dev, *limit = dev + 1;
    void *step_args[] = {&count, &limit, &cond};
    if (!GT_OK(weft_graph_add_copy(g, &up, NULL, 0, limit, host + 1, sizeof *host)) ||
        !GT_OK(weft_graph_add_fill(g, &zero, NULL, 0, count, 0, sizeof *count)) ||
        !GT_OK(weft_graph_add_while(g, &loop, (weft_graph_node[]){up, zero}, 2, cond, &body)) ||
        !GT_OK(weft_graph_add_kernel(body, NULL, NULL, 0, gk_while_step(), dim(1), dim(1), 0,
                                     step_args)) ||
        !GT_OK(weft_graph_add_copy(g, NULL, &loop, 1, host, count, sizeof *host)))
        return NULL;
    GT_RC(weft_graph_destroy(body), WEFT_EINVAL); /* it belongs to g */
    GT_RC(weft_graph_launch(body), WEFT_EINVAL);
    for (unsigned r = 0; r < LAUNCHES; r++) {
        unsigned want = (unsigned)gt_between(&rng, 1, 200);
        host[0] = GT_POISON32;
        host[1] = want;
        if (!GT_OK(weft_graph_launch(g)) || !GT_OK(weft_await()) ||
            !GT_CHECK(host[0] == want, "launch %u: the loop ran %u times, the GPU was told %u", r,
                      host[0], want))
            break;
    }
    GT_OK(weft_graph_destroy(g));
    GT_OK(weft_free_async(dev));
    GT_OK(weft_await());
    weft_host_free(rt, host);
    return NULL;
}

static void test_a_while_loop_runs_as_often_as_the_gpu_decides(void **state)
{
    weft_runtime *rt = gt_runtime(2);
    (void)state;
    gt_run(rt, while_main, NULL);
    gt_runtime_destroy(rt);
}

/* An IF node decided on the GPU by the parity of a value uploaded each
 * launch: its body marks the output only for odd values. */
static void *if_main(void *arg)
{
    weft_runtime *rt = weft_runtime_current();
    uint64_t rng = gt_rng(304);
    unsigned *host, *dev = NULL; /* [0] value, [1] mark */
    weft_graph *g = NULL, *body = NULL;
    weft_graph_cond cond;
    weft_graph_node up, clear, decide, branch;
    (void)arg;
    if (!GT_OK(weft_host_alloc(rt, (void **)&host, 2 * sizeof *host)) ||
        !GT_OK(weft_malloc_async((void **)&dev, 2 * sizeof *dev)) || !GT_OK(weft_await()) ||
        !GT_OK(weft_graph_create(rt, &g)) || !GT_OK(weft_graph_cond_create(g, &cond, 0)))
        return NULL;
    unsigned *value = dev;
    void *decide_args[] = {&value, &cond};
    if (!GT_OK(weft_graph_add_copy(g, &up, NULL, 0, dev, host, sizeof *host)) ||
        !GT_OK(weft_graph_add_fill(g, &clear, NULL, 0, dev + 1, 0, sizeof *dev)) ||
        !GT_OK(weft_graph_add_kernel(g, &decide, (weft_graph_node[]){up, clear}, 2, gk_if_odd(),
                                     dim(1), dim(1), 0, decide_args)) ||
        !GT_OK(weft_graph_add_if(g, &branch, &decide, 1, cond, &body)) ||
        !GT_OK(weft_graph_add_fill(body, NULL, NULL, 0, dev + 1, 0x5a, sizeof *dev)) ||
        !GT_OK(weft_graph_add_copy(g, NULL, &branch, 1, host + 1, dev + 1, sizeof *host)))
        return NULL;
    unsigned odd = 0;
    for (unsigned r = 0; r < 4 * LAUNCHES; r++) {
        unsigned v = gt_u32(&rng);
        host[0] = v;
        host[1] = GT_POISON32;
        odd += v & 1;
        if (!GT_OK(weft_graph_launch(g)) || !GT_OK(weft_await()) ||
            !GT_CHECK(host[1] == ((v & 1) ? 0x5a5a5a5au : 0u),
                      "launch %u: value %#x left the mark %#x", r, v, host[1]))
            break;
    }
    GT_CHECK(odd > 0 && odd < 4 * LAUNCHES, "the draws took one branch only (%u odd)", odd);
    GT_OK(weft_graph_destroy(g));
    GT_OK(weft_free_async(dev));
    GT_OK(weft_await());
    weft_host_free(rt, host);
    return NULL;
}

static void test_an_if_node_follows_the_gpu(void **state)
{
    weft_runtime *rt = gt_runtime(2);
    (void)state;
    gt_run(rt, if_main, NULL);
    gt_runtime_destroy(rt);
}

/* ---- misuse ------------------------------------------------------------ */

static void *misuse_main(void *arg)
{
    weft_runtime *rt = weft_runtime_current();
    weft_graph *g = NULL;
    weft_graph_node a, b;
    uint32_t *dev = NULL, pageable[4];
    (void)arg;
    if (!GT_OK(weft_malloc_async((void **)&dev, 64)) || !GT_OK(weft_await()) ||
        !GT_OK(weft_graph_create(rt, &g)) ||
        !GT_OK(weft_graph_add_fill(g, &a, NULL, 0, dev, 1, 64)))
        return NULL;
    GT_RC(weft_graph_add_fill(g, NULL, (weft_graph_node[]){5}, 1, dev, 0, 4), WEFT_EINVAL);
    GT_RC(weft_graph_add_fill(g, NULL, (weft_graph_node[]){a, a}, 2, dev, 0, 4), WEFT_EINVAL);
    GT_RC(weft_graph_add_fill(g, NULL, NULL, 1, dev, 0, 4), WEFT_EINVAL);
    GT_RC(weft_graph_add_copy(g, NULL, &a, 1, pageable, dev, sizeof pageable), WEFT_EINVAL);
    GT_RC(weft_graph_add_copy(g, NULL, &a, 1, dev, dev, 0), WEFT_EINVAL);
    GT_RC(weft_graph_add_kernel(g, NULL, &a, 1, NULL, dim(1), dim(1), 0, NULL), WEFT_EINVAL);
    GT_RC(weft_graph_add_host(g, NULL, &a, 1, NULL, NULL), WEFT_EINVAL);
    GT_RC(weft_graph_add_fill(NULL, NULL, NULL, 0, dev, 0, 4), WEFT_EINVAL);
    GT_RC(weft_graph_launch(NULL), WEFT_EINVAL);
    /* the refused calls added nothing: the next node is number 1 */
    if (GT_OK(weft_graph_add_fill(g, &b, &a, 1, dev, 2, 4)))
        GT_CHECK(b == 1, "the second node is number %u", b);
    GT_OK(weft_graph_launch(g));
    GT_OK(weft_await());
    GT_OK(weft_graph_destroy(g));
    GT_OK(weft_free_async(dev));
    GT_OK(weft_await());
    return NULL;
}

static void test_misuse_is_refused_and_the_graph_still_works(void **state)
{
    weft_runtime *rt = gt_runtime(2);
    weft_graph *g = NULL;
    (void)state;
    gt_run(rt, misuse_main, NULL);
    assert_ok(weft_graph_create(rt, &g)); /* launching is for tasks */
    assert_int_equal(weft_graph_launch(g), WEFT_ENOTASK);
    assert_ok(weft_graph_destroy(g));
    assert_int_equal(weft_graph_create(NULL, &g), WEFT_EINVAL);
    gt_runtime_destroy(rt);
}

int main(void)
{
    int skip = gt_start("gpu.graph_explicit");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nodes_run_in_dependency_order_every_launch),
        cmocka_unit_test(test_a_child_graph_runs_inside_its_parent),
        cmocka_unit_test(test_a_while_loop_runs_as_often_as_the_gpu_decides),
        cmocka_unit_test(test_an_if_node_follows_the_gpu),
        cmocka_unit_test(test_misuse_is_refused_and_the_graph_still_works),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
