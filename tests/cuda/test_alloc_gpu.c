/*
 * test_alloc.c - the allocators of the CUDA backend.
 *
 * Stream-ordered device memory: every size up to 64 MiB, blocks that never
 * overlap, memory that comes back when freed (more is allocated in all than
 * the GPU has), blocks handed from one task to another, a freed block
 * handed out again on its stream only when it fits and never into a graph
 * region. The pinned pool:
 * page-locked, disjoint, never a block given to two tasks at once. Mapped
 * memory: the alias CUDA reports, read and written by kernels directly.
 */
#include "gpu_support/gpu_test.h"

/* ---- device memory ----------------------------------------------------- */

enum { LIVE_BLOCKS = 64 };

static void *disjoint_main(void *arg)
{
    uint64_t rng = gt_rng(3);
    void *p[LIVE_BLOCKS];
    size_t n[LIVE_BLOCKS];
    unsigned char *out = malloc(64 << 20);
    bool ok = GT_CHECK(out != NULL, "malloc");

    (void)arg;
    memset(p, 0, sizeof p);
    for (unsigned i = 0; ok && i < LIVE_BLOCKS; i++) {
        static const size_t fixed[] = {1, 7, 4096, (1 << 20) + 3, 64 << 20};
        n[i] = i < 5 ? fixed[i] : gt_between(&rng, 1, 1 << 20);
        ok = GT_OK(weft_malloc_async(&p[i], n[i])) && GT_CHECK(p[i] != NULL, "NULL block") &&
             GT_OK(weft_memset_async(p[i], (int)i + 1, n[i]));
    }
    /* every block still holds its own byte: none overlaps another */
    for (unsigned i = 0; ok && i < LIVE_BLOCKS; i++) {
        memset(out, 0, n[i]);
        ok = GT_OK(weft_memcpy_async(out, p[i], n[i])) && GT_OK(weft_await());
        size_t bad = gt_first_not(out, (unsigned char)(i + 1), n[i]);
        ok = ok && GT_CHECK(bad == n[i], "block %u (%zu bytes): byte %zu is 0x%02x", i, n[i], bad,
                            out[bad]);
    }
    for (unsigned i = 0; i < LIVE_BLOCKS; i++)
        if (p[i])
            GT_OK(weft_free_async(p[i]));
    GT_OK(weft_await());
    free(out);
    return NULL;
}

/* 64 live blocks from weft_malloc_async, 1 byte to 64 MiB: each is device
 * memory of its full size, and none overlaps another. */
static void test_malloc_async_blocks_are_disjoint(void **state)
{
    weft_runtime *rt = gt_runtime(0);

    (void)state;
    gt_run(rt, disjoint_main, NULL);
    gt_runtime_destroy(rt);
}

enum { CHURN_TASKS = 16, CHURN_ROUNDS = 16 };
#define CHURN_BYTES ((size_t)1 << 30)

static void *churn_main(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    unsigned char tail[256];

    for (unsigned r = 0; r < CHURN_ROUNDS; r++) {
        void *p = NULL;
        if (!GT_OK(weft_malloc_async(&p, CHURN_BYTES)))
            return NULL;
        unsigned char *end = (unsigned char *)p + CHURN_BYTES - sizeof tail;
        memset(tail, 0, sizeof tail);
        if (!GT_OK(weft_memset_async(end, (int)(id + r), sizeof tail)) ||
            !GT_OK(weft_memcpy_async(tail, end, sizeof tail)) || !GT_OK(weft_free_async(p)))
            return NULL;
        if (r % 4 == 3 && !GT_OK(weft_await()))
            return NULL;
        if (r % 4 == 3 &&
            !GT_CHECK(gt_first_not(tail, (unsigned char)(id + r), sizeof tail) == sizeof tail,
                      "task %u round %u: the end of a 1 GiB block is wrong", id, r))
            return NULL;
    }
    GT_OK(weft_await());
    return NULL;
}

/* 16 tasks allocate, touch and free 1 GiB sixteen times each: 256 GiB in
 * all, more than the GPU has, so freed memory must come back. */
static void test_malloc_free_async_reuses_memory(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    weft_task *t[CHURN_TASKS];

    (void)state;
    for (unsigned i = 0; i < CHURN_TASKS; i++)
        assert_ok(weft_spawn(rt, &t[i], churn_main, (void *)(uintptr_t)i, NULL));
    for (unsigned i = 0; i < CHURN_TASKS; i++)
        assert_ok(weft_join(t[i], NULL));
    gt_assert_passed();
    gt_runtime_destroy(rt);
}

/* A block filled with byte and read back whole: false (reported) if any
 * byte differs. */
static bool holds(void *p, size_t n, int byte, unsigned char *out)
{
    memset(out, 0, n);
    if (!GT_OK(weft_memset_async(p, byte, n)) || !GT_OK(weft_memcpy_async(out, p, n)) ||
        !GT_OK(weft_await()))
        return false;
    size_t bad = gt_first_not(out, (unsigned char)byte, n);
    return GT_CHECK(bad == n, "%zu-byte block: byte %zu is 0x%02x, not 0x%02x", n, bad, out[bad],
                    byte);
}

static void *kept_main(void *arg)
{
    enum { N = 3 << 20 };
    unsigned char *out = gt_xmalloc(2 * N);
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    (void)arg;
    /* no await between the free and the allocation: the task keeps its
     * stream, so the block freed on it comes back */
    if (!GT_OK(weft_malloc_async(&a, N)) || !GT_OK(weft_memset_async(a, 1, N)) ||
        !GT_OK(weft_free_async(a)) || !GT_OK(weft_malloc_async(&b, N - 5)))
        goto out;
    GT_CHECK(b == a, "a block freed on the stream was not handed out again (%p, then %p)", a, b);
    if (!holds(b, N - 5, 2, out))
        goto out;
    /* given back once: a second free is refused, the kept block untouched */
    GT_OK(weft_free_async(b));
    GT_RC(weft_free_async(b), WEFT_EINVAL);
    /* too small a request for the kept block (under half of it): a new one,
     * disjoint from it; then one that fits takes the kept block */
    if (!GT_OK(weft_malloc_async(&c, N / 3)) || !GT_OK(weft_malloc_async(&d, 2 * N / 3)))
        goto out;
    GT_CHECK(c != a, "a block more than twice the request was handed out");
    GT_CHECK(d == a, "the kept block (%p) was not handed out for a request it fits (%p)", a, d);
    if (holds(c, N / 3, 3, out) && holds(d, 2 * N / 3, 4, out))
        holds(c, N / 3, 3, out); /* d's fill did not reach into c */
    GT_OK(weft_free_async(c));
    GT_OK(weft_free_async(d));
    /* inside a graph region no kept block is handed out: a graph replayed
     * later must not point into memory the stream hands out again */
    void *g = NULL;
    if (GT_OK(weft_region_begin(42))) {
        if (GT_OK(weft_malloc_async(&g, N))) {
            GT_CHECK(g != a && g != c, "a kept block was baked into a graph region");
            GT_OK(weft_memset_async(g, 5, N));
            GT_OK(weft_free_async(g));
        }
        GT_OK(weft_region_end());
    }
    /* more blocks than a stream keeps, all freed: every one still refused
     * on a second free, and allocation goes on */
    void *many[8];
    for (unsigned i = 0; i < 8; i++)
        if (!GT_OK(weft_malloc_async(&many[i], 4096 * (i + 1))))
            goto out;
    for (unsigned i = 0; i < 8; i++)
        GT_OK(weft_free_async(many[i]));
    for (unsigned i = 0; i < 8; i++)
        GT_RC(weft_free_async(many[i]), WEFT_EINVAL);
    GT_OK(weft_await());
out:
    free(out);
    return NULL;
}

/* A block freed on a stream is handed out again to the next allocation on
 * that stream that it fits (no more than twice the request), holds what is
 * written to it, is refused a second free, and never goes into a graph
 * region. */
static void test_freed_block_comes_back_on_its_stream(void **state)
{
    weft_runtime *rt = gt_runtime(0);

    (void)state;
    gt_run(rt, kept_main, NULL);
    gt_runtime_destroy(rt);
}

typedef struct handoff {
    uint32_t *dev;
    size_t words;
    uint32_t *expect;
} handoff;

static void *handoff_producer(void *arg)
{
    handoff *h = arg;
    void *p = NULL;

    if (GT_OK(weft_malloc_async(&p, h->words * 4)) &&
        GT_OK(weft_memcpy_async(p, h->expect, h->words * 4)) && GT_OK(weft_await()))
        h->dev = p;
    return NULL;
}

static void *handoff_consumer(void *arg)
{
    handoff *h = arg;
    uint32_t *out = malloc(h->words * 4);

    if (GT_CHECK(out != NULL, "malloc")) {
        memset(out, GT_POISON, h->words * 4);
        if (GT_OK(weft_memcpy_async(out, h->dev, h->words * 4)) && GT_OK(weft_free_async(h->dev)) &&
            GT_OK(weft_await()))
            GT_CHECK(memcmp(out, h->expect, h->words * 4) == 0,
                     "data written by one task read wrong by another");
    }
    free(out);
    return NULL;
}

/* Device memory allocated and filled by one task is read and freed by
 * another after the first awaited it. */
static void test_device_memory_passes_between_tasks(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    uint64_t rng = gt_rng(4);
    handoff h = {NULL, 300000, NULL};

    (void)state;
    h.expect = gt_xmalloc(h.words * 4);
    gt_fill(&rng, h.expect, h.words * 4);
    gt_run(rt, handoff_producer, &h);
    assert_non_null(h.dev);
    gt_run(rt, handoff_consumer, &h);
    gt_runtime_destroy(rt);
    free(h.expect);
}

/* ---- pinned and mapped host memory ------------------------------------- */

/* Pinned blocks from a plain thread: page-locked, writable over their full
 * size, disjoint; mapped blocks: page-locked and with the device alias CUDA
 * reports. */
static void test_host_and_mapped_alloc_from_a_thread(void **state)
{
    enum { N = 40 };
    weft_runtime *rt = gt_runtime(2);
    uint64_t rng = gt_rng(5);
    unsigned char *p[N];
    size_t n[N];

    (void)state;
    for (unsigned i = 0; i < N; i++) {
        static const size_t fixed[] = {1, 100, 4095, 4096, 4097, (1 << 20) + 1, 16 << 20};
        n[i] = i < 7 ? fixed[i] : gt_between(&rng, 1, 1 << 20);
        void *q = NULL;
        assert_ok(weft_host_alloc(rt, &q, n[i]));
        assert_non_null(q);
        assert_int_equal(gk_pointer_kind(q, NULL), GK_MEM_PINNED);
        p[i] = q;
        memset(p[i], (int)i + 1, n[i]);
    }
    for (unsigned i = 0; i < N; i++) {
        assert_int_equal(gt_first_not(p[i], (unsigned char)(i + 1), n[i]), n[i]);
        assert_ok(weft_host_free(rt, p[i]));
    }
    for (unsigned i = 0; i < 8; i++) {
        void *h = NULL, *d = NULL, *alias = NULL;
        size_t bytes = gt_between(&rng, 1, 4 << 20);
        assert_ok(weft_mapped_alloc(rt, &h, &d, bytes));
        assert_non_null(h);
        assert_non_null(d);
        assert_int_equal(gk_pointer_kind(h, &alias), GK_MEM_PINNED);
        assert_ptr_equal(alias, d);
        memset(h, 0x5a, bytes);
        assert_ok(weft_mapped_free(rt, h));
    }
    gt_runtime_destroy(rt);
}

typedef struct mapped_job {
    unsigned id;
    unsigned words;
} mapped_job;

static void *mapped_kernel_main(void *arg)
{
    mapped_job *j = arg;
    weft_runtime *rt = weft_runtime_current();
    uint64_t rng = gt_rng(1000 + j->id);
    uint32_t *in_h = NULL, *out_h = NULL, *in_d = NULL, *out_d = NULL;
    uint32_t a = gt_u32(&rng) | 1, b = gt_u32(&rng);
    unsigned n = j->words;
    void *args[] = {&out_d, &in_d, &n, &a, &b};
    weft_dim3 grid = {(n + 255) / 256, 1, 1}, block = {256, 1, 1};

    if (!GT_OK(weft_mapped_alloc(rt, (void **)&in_h, (void **)&in_d, (size_t)n * 4)) ||
        !GT_OK(weft_mapped_alloc(rt, (void **)&out_h, (void **)&out_d, (size_t)n * 4 + 64)))
        goto out;
    gt_fill(&rng, in_h, (size_t)n * 4);
    memset(out_h, GT_POISON, (size_t)n * 4 + 64);
    if (!GT_OK(weft_launch(gk_affine(), grid, block, 0, args)) || !GT_OK(weft_await()))
        goto out;
    for (unsigned i = 0; i < n; i++)
        if (!GT_CHECK(out_h[i] == gk_affine_ref(in_h[i], a, b),
                      "task %u: mapped word %u is %08x, expected %08x", j->id, i, out_h[i],
                      gk_affine_ref(in_h[i], a, b)))
            goto out;
    GT_CHECK(gt_first_not(out_h + n, GT_POISON, 64) == 64, "kernel wrote past the mapped output");
out:
    if (in_h)
        GT_OK(weft_mapped_free(rt, in_h));
    if (out_h)
        GT_OK(weft_mapped_free(rt, out_h));
    return NULL;
}

/* Kernels read and write mapped host memory directly: the host sees the
 * results after weft_await. 64 tasks at once, so the pools are shared. */
static void test_kernels_use_mapped_memory(void **state)
{
    enum { N = 64 };
    weft_runtime *rt = gt_runtime(0);
    uint64_t rng = gt_rng(6);
    weft_task *t[N];
    mapped_job j[N];

    (void)state;
    for (unsigned i = 0; i < N; i++) {
        j[i] = (mapped_job){i, (unsigned)gt_between(&rng, 1, 200000)};
        assert_ok(weft_spawn(rt, &t[i], mapped_kernel_main, &j[i], NULL));
    }
    for (unsigned i = 0; i < N; i++)
        assert_ok(weft_join(t[i], NULL));
    gt_assert_passed();
    gt_runtime_destroy(rt);
}

static void *pinned_churn_main(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    weft_runtime *rt = weft_runtime_current();
    uint64_t rng = gt_rng(2000 + id);

    for (unsigned r = 0; r < 100; r++) {
        size_t n = gt_between(&rng, 1, 256 << 10);
        unsigned char mark = (unsigned char)(id * 7 + r);
        void *p = NULL;
        if (!GT_OK(weft_host_alloc(rt, &p, n)))
            return NULL;
        memset(p, mark, n);
        GT_OK(weft_yield()); /* let others allocate: a block given twice shows */
        bool same = gt_first_not(p, mark, n) == n;
        GT_OK(weft_host_free(rt, p));
        if (!GT_CHECK(same, "task %u: a pinned block was handed out twice", id))
            return NULL;
    }
    return NULL;
}

/* 64 tasks allocate and free pinned memory at once: no block is ever held
 * by two of them. */
static void test_pinned_pool_under_contention(void **state)
{
    enum { N = 64 };
    weft_runtime *rt = gt_runtime(0);
    weft_task *t[N];

    (void)state;
    for (unsigned i = 0; i < N; i++)
        assert_ok(weft_spawn(rt, &t[i], pinned_churn_main, (void *)(uintptr_t)i, NULL));
    for (unsigned i = 0; i < N; i++)
        assert_ok(weft_join(t[i], NULL));
    gt_assert_passed();
    gt_runtime_destroy(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malloc_async_blocks_are_disjoint),
        cmocka_unit_test(test_malloc_free_async_reuses_memory),
        cmocka_unit_test(test_freed_block_comes_back_on_its_stream),
        cmocka_unit_test(test_device_memory_passes_between_tasks),
        cmocka_unit_test(test_host_and_mapped_alloc_from_a_thread),
        cmocka_unit_test(test_kernels_use_mapped_memory),
        cmocka_unit_test(test_pinned_pool_under_contention),
    };
    int skip = gt_start("gpu.alloc");

    if (skip)
        return skip;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
