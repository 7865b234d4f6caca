/*
 * test_paged_gpu.c - the paged KV cache's kernels against the host
 * reference and paged_ref.h's float64 loops, on fresh random data (the
 * seed is printed; WEFT_TEST_SEED replays it): weft_kv_append's pools
 * against the host's (V and unrotated K bit for bit; RoPE'd K within one
 * unit in the last place, where the GPU's double sine may round the other
 * way), every pool slot no token names left poisoned; weft_attention_decode
 * against float64 with its outputs poisoned (0xff: NaN) so an element never
 * written fails, for lengths 0 to 4097, GQA ratios 1 to 32, q_len 1, 4 and
 * 8, pages of 16 and 256, windows, head dims 64 and 128, bf16 and fp16,
 * FP8 E4M3 pools, with the split forced off, chosen by the call, and forced to several
 * parts; the append and decode captured into a CUDA graph and replayed;
 * the calls in a task's stream order; clamped tables that must not fault;
 * and bad arguments refused before launch.
 *
 * Each case prints its shape, the split, and the largest difference from
 * float64 and from the host reference, so one run diagnoses a failure.
 */
#include "gpu_support/gpu_stream.h"

#include <cuda_runtime_api.h>
#include <math.h>

#include "ops/paged_ref.h"
#include "weft/ops.h"

static weft_runtime *runtime;
static cudaStream_t stream;

static void *download(const void *dev, size_t bytes)
{
    void *h = pg_alloc(bytes ? bytes : 1);
    if (bytes)
        assert_cuda(cudaMemcpy(h, dev, bytes, cudaMemcpyDeviceToHost));
    return h;
}

/* A case's device copies. */
typedef struct dev_case {
    weft_kv_cache cache; /* device pointers */
    void *k, *v, *q, *out, *ws;
    float *lse;
    int32_t *seq_ids, *positions, *lens;
    size_t ws_bytes;
} dev_case;

static dev_case dev_make(const pg_case *c, const weft_attention_decode_desc *d)
{
    dev_case g = {.cache = c->cache};
    size_t pool = c->pool_elems * c->esize;
    void *poison = pg_alloc(pool);
    memset(poison, PG_POISON, pool);
    g.cache.k = gt_upload(poison, pool);
    g.cache.v = gt_upload(poison, pool);
    free(poison);
    g.cache.block_table = gt_upload(c->table, c->cache.seqs * c->cache.max_pages * 4);
    if (c->s.fp8) {
        g.cache.k_scale = gt_upload(c->k_scale, c->s.kv_heads * 4);
        g.cache.v_scale = gt_upload(c->v_scale, c->s.kv_heads * 4);
    }
    g.k = gt_upload(c->k, c->tokens * c->row * 2);
    g.v = gt_upload(c->v, c->tokens * c->row * 2);
    g.seq_ids = gt_upload(c->seq_ids, c->tokens * 4);
    g.positions = gt_upload(c->positions, c->tokens * 4);
    g.lens = gt_upload(c->lens, c->s.seqs * 4);
    g.q = gt_upload(c->q, c->q_elems * 2);
    assert_cuda(cudaMalloc(&g.out, c->q_elems * 2));
    assert_cuda(cudaMalloc((void **)&g.lse, c->rows * 4));
    assert_ok(weft_attention_decode_workspace(&g.cache, d, &g.ws_bytes));
    if (g.ws_bytes)
        assert_cuda(cudaMalloc(&g.ws, g.ws_bytes));
    /* the copies ran on the legacy stream, which the test's stream does
     * not wait for */
    assert_cuda(cudaDeviceSynchronize());
    return g;
}

static void dev_poison(const pg_case *c, dev_case *g)
{
    assert_cuda(gt_memset((void *)g->cache.k, PG_POISON, c->pool_elems * c->esize));
    assert_cuda(gt_memset((void *)g->cache.v, PG_POISON, c->pool_elems * c->esize));
    assert_cuda(gt_memset(g->out, PG_POISON, c->q_elems * 2));
    assert_cuda(gt_memset(g->lse, PG_POISON, c->rows * 4));
    if (g->ws)
        assert_cuda(gt_memset(g->ws, PG_POISON, g->ws_bytes));
    assert_cuda(cudaDeviceSynchronize());
}

static void dev_free(dev_case *g)
{
    cudaFree(g->cache.k), cudaFree(g->cache.v), cudaFree((void *)g->cache.block_table);
    cudaFree((void *)g->cache.k_scale), cudaFree((void *)g->cache.v_scale);
    cudaFree(g->k), cudaFree(g->v), cudaFree(g->q), cudaFree(g->out), cudaFree(g->ws);
    cudaFree(g->lse), cudaFree(g->seq_ids), cudaFree(g->positions), cudaFree(g->lens);
}

static int enqueue(const pg_case *c, dev_case *g, const weft_attention_decode_desc *d)
{
    weft_kv_rope rope = pg_rope(c);
    int rc = weft_kv_append(stream, &g->cache, g->k, 0, g->v, 0, c->tokens, g->seq_ids,
                            g->positions, c->s.rope ? &rope : NULL);
    if (rc != WEFT_OK)
        return rc;
    return weft_attention_decode(stream, &g->cache, d, g->out, g->lse, g->q, g->lens, g->ws,
                                 g->ws_bytes);
}

/* Pool element i's code: 16 bits, or an FP8 byte. */
static int code_at(const pg_case *c, const void *pool, size_t i)
{
    return c->s.fp8 ? ((const uint8_t *)pool)[i] : ((const uint16_t *)pool)[i];
}

/* The GPU's pools against the host append's (hk, hv): V and unrotated K
 * the same codes; RoPE'd K at most one code away (the GPU's double sine
 * may round the other way), of the same sign; mismatches. */
static size_t check_pools(const char *name, const pg_case *c, const void *gk, const void *gv,
                          const void *hk, const void *hv)
{
    size_t bad = 0, ulp = 0;
    int sign = c->s.fp8 ? 0x80 : 0x8000, poison = c->s.fp8 ? 0xff : 0xffff;
    for (size_t i = 0; i < c->pool_elems; i++) {
        int a = code_at(c, gk, i), b = code_at(c, hk, i), va = code_at(c, gv, i),
            vb = code_at(c, hv, i);
        int near = c->s.rope && b != poison && (a & sign) == (b & sign) && abs(a - b) <= 1;
        if (va != vb || (a != b && !near)) {
            if (bad++ < 4)
                printf("  %s: pool element %zu: k %x v %x, host k %x v %x\n", name, i, a, va, b,
                       vb);
        } else if (a != b)
            ulp++;
    }
    if (ulp)
        printf("  %s: %zu RoPE'd key elements one unit from the host's\n", name, ulp);
    return bad;
}

static unsigned failed_cases;

/* One case on the GPU with the given split (graph: captured and replayed
 * twice); failures are counted and printed, the test fails at its end. */
static void gpu_case(const char *name, const pg_shape *shape, size_t splits, int graph)
{
    pg_shape s = *shape;
    s.splits = splits;
    pg_case c = pg_make(&s);
    weft_attention_decode_desc d = pg_desc(&c);
    weft_kv_rope rope = pg_rope(&c);
    dev_case g = dev_make(&c, &d);
    char full[256];
    snprintf(full, sizeof full, "%s splits %zu%s", name, splits, graph ? " (graph)" : "");

    /* the host reference: its pools and its decode */
    assert_ok(weft_kv_append(NULL, &c.cache, c.k, 0, c.v, 0, c.tokens, c.seq_ids, c.positions,
                             s.rope ? &rope : NULL));
    void *hws = g.ws_bytes ? pg_alloc(g.ws_bytes) : NULL;
    void *hout = pg_alloc(c.q_elems * 2);
    assert_ok(weft_attention_decode(NULL, &c.cache, &d, hout, NULL, c.q, c.lens, hws, g.ws_bytes));

    cudaGraph_t gr = NULL;
    cudaGraphExec_t exec = NULL;
    if (graph) {
        assert_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        int rc = enqueue(&c, &g, &d);
        assert_cuda(cudaStreamEndCapture(stream, &gr));
        assert_ok(rc);
        assert_cuda(cudaGraphInstantiate(&exec, gr, 0));
    }
    size_t bad = 0;
    for (int round = 0; round < (graph ? 2 : 1); round++) {
        dev_poison(&c, &g);
        if (graph)
            assert_cuda(cudaGraphLaunch(exec, stream));
        else
            assert_ok(enqueue(&c, &g, &d));
        assert_cuda(cudaStreamSynchronize(stream));
        void *gk = download(g.cache.k, c.pool_elems * c.esize);
        void *gv = download(g.cache.v, c.pool_elems * c.esize);
        void *out = download(g.out, c.q_elems * 2);
        float *lse = download(g.lse, c.rows * 4);
        bad += check_pools(full, &c, gk, gv, c.kp, c.vp);
        /* the decode against float64 of the keys and values the GPU wrote */
        pg_case on_gpu = c;
        on_gpu.kp = gk, on_gpu.vp = gv;
        bad += pg_check_decode(full, &on_gpu, out, lse);
        double host_diff = 0;
        for (size_t i = 0; i < c.q_elems; i++) {
            double e = fabs((double)weft__load(s.dtype, out, i) - weft__load(s.dtype, hout, i));
            if (e > host_diff)
                host_diff = e;
        }
        printf("  %s: largest difference from the host reference %.3g\n", full, host_diff);
        free(gk), free(gv), free(out), free(lse);
    }
    if (!graph) {
        /* q as a view into wider rows, NaN between: the same output, bit for bit */
        size_t width = s.heads * s.head_dim, stride = width + 24, rows = c.q_elems / width;
        uint16_t *wide = pg_alloc(rows * stride * 2);
        for (size_t r = 0; r < rows; r++) {
            memcpy(wide + r * stride, (const uint16_t *)c.q + r * width, width * 2);
            for (size_t e = width; e < stride; e++)
                wide[r * stride + e] = 0x7fc1; /* NaN in bf16 and fp16 */
        }
        void *dwide = gt_upload(wide, rows * stride * 2), *dout2 = NULL;
        assert_cuda(cudaMalloc(&dout2, c.q_elems * 2));
        assert_cuda(cudaDeviceSynchronize());
        weft_attention_decode_desc ds = d;
        ds.q_stride = stride;
        assert_ok(weft_attention_decode(stream, &g.cache, &ds, dout2, NULL, dwide, g.lens, g.ws,
                                        g.ws_bytes));
        assert_cuda(cudaStreamSynchronize(stream));
        void *packed = download(g.out, c.q_elems * 2), *strided = download(dout2, c.q_elems * 2);
        if (memcmp(packed, strided, c.q_elems * 2) != 0) {
            printf("  %s: q_stride %zu gives another output than packed q\n", full, stride);
            bad++;
        }
        free(wide), free(packed), free(strided);
        cudaFree(dwide), cudaFree(dout2);
    }
    if (bad) {
        failed_cases++;
        printf("FAILED %s\n", full);
    }
    if (graph)
        cudaGraphExecDestroy(exec), cudaGraphDestroy(gr);
    dev_free(&g);
    free(hws), free(hout);
    pg_free(&c);
}

static int32_t BATCH16[16];

/* The shared cases (paged_ref.h), then the GPU's own: a long window at
 * head dim 64, and the benchmark's shape (32 heads on 8 kv heads, page 16)
 * over 16 random lengths, q read as it is and turned. */
static const pg_row GPU_CASES[] = {
    {WEFT_DTYPE_BF16, 1, 1, 32, 64, 16, 8, 300, PG_LONG, 1, 0, 0, 0, 0},
    {WEFT_DTYPE_BF16, 16, 8, 32, 128, 16, 1, 0, BATCH16, 2, 0, 0, 0, 0},
    {WEFT_DTYPE_BF16, 16, 8, 32, 64, 16, 1, 0, BATCH16, 2, 0, 0, 0, 1},
};
enum { NCASES = PG_NCASES + sizeof GPU_CASES / sizeof GPU_CASES[0] };

static pg_shape shape_of(size_t i)
{
    return pg_shape_of(i < PG_NCASES ? &PG_CASES[i] : &GPU_CASES[i - PG_NCASES], 0);
}

static void name_of(size_t i, char *name, size_t n)
{
    pg_shape s = shape_of(i);
    pg_name(name, n, i, &s);
}

static void test_append_and_decode_match_float64_split_or_not(void **state)
{
    (void)state;
    static const size_t SPLITS[] = {1, 0, 3, 64};
    failed_cases = 0;
    for (size_t i = 0; i < NCASES; i++)
        for (size_t k = 0; k < sizeof SPLITS / sizeof SPLITS[0]; k++) {
            char name[200];
            name_of(i, name, sizeof name);
            pg_shape s = shape_of(i);
            gpu_case(name, &s, SPLITS[k], 0);
        }
    if (failed_cases)
        fail_msg("%u cases failed (listed above)", failed_cases);
}

/* The append and the decode captured into one CUDA graph, split and not,
 * replayed twice on freshly poisoned memory. */
static void test_a_captured_append_and_decode_replay_right(void **state)
{
    (void)state;
    failed_cases = 0;
    static const size_t PICK[] = {2, 7, 10, 14, PG_NCASES + 1};
    for (size_t j = 0; j < sizeof PICK / sizeof PICK[0]; j++) {
        char name[200];
        name_of(PICK[j], name, sizeof name);
        pg_shape s = shape_of(PICK[j]);
        gpu_case(name, &s, 1, 1);
        gpu_case(name, &s, 0, 1);
        gpu_case(name, &s, 5, 1);
    }
    if (failed_cases)
        fail_msg("%u cases failed (listed above)", failed_cases);
}

/* ---- a task's stream order ------------------------------------------------ */

typedef struct chain {
    pg_case *c;
    dev_case *g;
    weft_attention_decode_desc d;
} chain;

static void *chain_task(void *arg)
{
    chain *j = arg;
    weft_kv_rope rope = pg_rope(j->c);
    dev_case *g = j->g;
    if (GT_OK(weft_kv_append(WEFT_TASK_STREAM, &g->cache, g->k, 0, g->v, 0, j->c->tokens,
                             g->seq_ids, g->positions, &rope)) &&
        GT_OK(weft_attention_decode(WEFT_TASK_STREAM, &g->cache, &j->d, g->out, g->lse, g->q,
                                    g->lens, g->ws, g->ws_bytes)))
        GT_OK(weft_await());
    return NULL;
}

static void test_the_calls_run_in_a_tasks_stream_order(void **state)
{
    (void)state;
    pg_shape s = shape_of(4);
    s.splits = 4;
    pg_case c = pg_make(&s);
    weft_kv_rope rope = pg_rope(&c);
    weft_attention_decode_desc d = pg_desc(&c);
    dev_case g = dev_make(&c, &d);
    dev_poison(&c, &g);
    assert_cuda(cudaDeviceSynchronize());
    chain j = {.c = &c, .g = &g, .d = d};
    gt_reset();
    gt_run(runtime, chain_task, &j);
    gt_assert_passed();
    assert_ok(
        weft_kv_append(NULL, &c.cache, c.k, 0, c.v, 0, c.tokens, c.seq_ids, c.positions, &rope));
    void *gk = download(g.cache.k, c.pool_elems * c.esize);
    void *gv = download(g.cache.v, c.pool_elems * c.esize);
    void *out = download(g.out, c.q_elems * 2);
    float *lse = download(g.lse, c.rows * 4);
    assert_int_equal(check_pools("task", &c, gk, gv, c.kp, c.vp), 0);
    pg_case on_gpu = c;
    on_gpu.kp = gk, on_gpu.vp = gv;
    assert_int_equal(pg_check_decode("task", &on_gpu, out, lse), 0);
    free(gk), free(gv), free(out), free(lse);
    dev_free(&g);
    pg_free(&c);
}

/* ---- tables read too late to refuse ------------------------------------- */

/* Lengths past max_seq_len and below 0, table entries past the pool and
 * negative, seq_ids and positions out of range: the kernels clamp or skip
 * them and never fault (compute-sanitizer, scripts/gpu-check, sees any
 * access outside the pools); a length of 0 still gives zeros and -Inf. */
static void test_bad_tables_are_clamped_without_faults(void **state)
{
    (void)state;
    static const int32_t LENS[] = {40, 20};
    pg_shape s = {.dtype = WEFT_DTYPE_BF16,
                  .seqs = 2,
                  .kv_heads = 2,
                  .heads = 8,
                  .head_dim = 128,
                  .page_size = 16,
                  .q_len = 2,
                  .lens = LENS,
                  .splits = 3};
    pg_case c = pg_make(&s);
    weft_attention_decode_desc d = pg_desc(&c);
    dev_case g = dev_make(&c, &d);
    dev_poison(&c, &g);
    size_t entries = c.cache.seqs * c.cache.max_pages;
    int32_t *table = pg_alloc(entries * 4);
    for (size_t i = 0; i < entries; i++)
        table[i] = i % 2 ? INT32_MAX : -7;
    assert_cuda(gt_copy_in((void *)g.cache.block_table, table, entries * 4));
    int32_t ids[4] = {-1, 2, 0, 1}, pos[4] = {3, 3, -1, 1 << 30}, lens[2] = {1 << 30, 0};
    assert_cuda(gt_copy_in(g.seq_ids, ids, sizeof ids));
    assert_cuda(gt_copy_in(g.positions, pos, sizeof pos));
    assert_cuda(gt_copy_in(g.lens, lens, sizeof lens));
    assert_cuda(cudaDeviceSynchronize());
    assert_ok(weft_kv_append(stream, &g.cache, g.k, 0, g.v, 0, 4, g.seq_ids, g.positions, NULL));
    assert_ok(
        weft_attention_decode(stream, &g.cache, &d, g.out, g.lse, g.q, g.lens, g.ws, g.ws_bytes));
    assert_cuda(cudaStreamSynchronize(stream));
    uint16_t *gk = download(g.cache.k, c.pool_elems * 2);
    for (size_t i = 0; i < c.pool_elems; i++)
        if (gk[i] != 0xffff)
            fail_msg("pool element %zu written by a token that goes nowhere", i);
    uint16_t *out = download(g.out, c.q_elems * 2);
    float *lse = download(g.lse, c.rows * 4);
    for (size_t i = c.q_elems / 2; i < c.q_elems; i++)
        assert_int_equal(out[i], 0);
    for (size_t i = c.rows / 2; i < c.rows; i++)
        assert_true(isinf(lse[i]) && lse[i] < 0);
    free(gk), free(out), free(lse), free(table);
    dev_free(&g);
    pg_free(&c);
}

/* ---- bad arguments -------------------------------------------------------- */

static void test_bad_arguments_are_refused_before_launch(void **state)
{
    (void)state;
    pg_shape s = shape_of(2);
    s.splits = 4;
    pg_case c = pg_make(&s);
    weft_attention_decode_desc d = pg_desc(&c);
    dev_case g = dev_make(&c, &d);
    dev_poison(&c, &g);
    assert_true(g.ws_bytes > 0);
    weft_kv_cache bad = g.cache;
    bad.head_dim = 96;
    assert_rc(weft_attention_decode(stream, &bad, &d, g.out, g.lse, g.q, g.lens, g.ws, g.ws_bytes),
              WEFT_EINVAL);
    bad = g.cache;
    bad.k = (char *)bad.k + 8;
    assert_rc(weft_kv_append(stream, &bad, g.k, 0, g.v, 0, c.tokens, g.seq_ids, g.positions, NULL),
              WEFT_EINVAL);
    weft_attention_decode_desc e = d;
    e.heads = d.heads + 1;
    assert_rc(
        weft_attention_decode(stream, &g.cache, &e, g.out, g.lse, g.q, g.lens, g.ws, g.ws_bytes),
        WEFT_EINVAL);
    assert_rc(weft_attention_decode(stream, &g.cache, &d, g.out, g.lse, g.q, g.lens, g.ws,
                                    g.ws_bytes - 4),
              WEFT_EINVAL);
    assert_rc(weft_attention_decode(stream, &g.cache, &d, (char *)g.out + 2, g.lse, g.q, g.lens,
                                    g.ws, g.ws_bytes),
              WEFT_EINVAL);
    assert_cuda(cudaStreamSynchronize(stream));
    void *out = download(g.out, c.q_elems * 2);
    for (size_t i = 0; i < c.q_elems * 2; i++)
        assert_int_equal(((unsigned char *)out)[i], PG_POISON);
    free(out);
    dev_free(&g);
    pg_free(&c);
}

/* ---- main ------------------------------------------------------------------ */

static int setup(void **state)
{
    (void)state;
    pg_rng_state = gt_rng(41);
    for (size_t b = 0; b < 16; b++)
        BATCH16[b] = (int32_t)(1 + pg_rng() % 4096);
    return gt_stream_setup(&runtime, &stream);
}

static int teardown(void **state)
{
    (void)state;
    return gt_stream_teardown(runtime, stream);
}

int main(void)
{
    int skip = gt_start("gpu.paged");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_and_decode_match_float64_split_or_not),
        cmocka_unit_test(test_a_captured_append_and_decode_replay_right),
        cmocka_unit_test(test_the_calls_run_in_a_tasks_stream_order),
        cmocka_unit_test(test_bad_tables_are_clamped_without_faults),
        cmocka_unit_test(test_bad_arguments_are_refused_before_launch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
