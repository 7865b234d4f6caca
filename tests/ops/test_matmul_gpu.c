/*
 * test_matmul_gpu.c - weft_matmul on the GPU (cuBLASLt) against the host
 * reference and the float64 loop of matmul_ref.h, on fresh random data:
 * every type pair and activation with bias and residual, transposes,
 * batches, padded leading dimensions, in place, aux; which GELU cuBLASLt's
 * epilogue computes (the tanh form, as the host reference says); a plan
 * made once and found on repeat (and what the first call costs); a call
 * captured into a CUDA graph and replayed; many tasks calling at once on their own streams; bad
 * arguments refused before anything is enqueued.
 *
 * Bounds, as ||got - ref|| / ||ref|| over the whole output against the
 * float64 reference: fp32 2e-6 (2e-4 with a GELU, whose fast tanh on the
 * GPU is not libm's), TF32 2e-3, fp16 3e-3, bf16 1e-2 (the outputs'
 * rounding alone is ~1e-3 and ~4e-3 for 16-bit types). The host reference
 * must pass the same bound (it is the tighter element-wise one in
 * test_matmul.c). Every output element must be written and the padding
 * left alone.
 */
#include "gpu_support/gpu_stream.h"

#include <cuda_runtime_api.h>
#include <math.h>

#include "ops/matmul.h"
#include "ops/matmul_ref.h"
#include "weft/ops.h"

static weft_runtime *runtime;
static cudaStream_t stream;

static double bound(const weft_matmul_desc *d)
{
    mm_geom g = mm_geometry(d);
    int gelu = d->act == WEFT_MATMUL_ACT_GELU_TANH || d->act == WEFT_MATMUL_ACT_GELU_ERF;
    if (d->type == WEFT_DTYPE_BF16)
        return 1e-2;
    if (d->type == WEFT_DTYPE_F16)
        return 3e-3;
    if (g.in_type == WEFT_DTYPE_F32 && d->allow_tf32)
        return 2e-3;
    return gelu ? 2e-4 : 2e-6;
}

/* ||out - ref|| / ||ref|| (D, or aux when want_aux) against float64;
 * padding must keep the poison (check_padding) and no element be NaN. */
static double rel_error(const weft_matmul_desc *d, const void *a, const void *b, const void *c,
                        const void *out, int want_aux, int check_padding, const char *name)
{
    mm_geom g = mm_geometry(d);
    size_t ld = want_aux ? g.ldaux : g.ldd, stride = want_aux ? d->stride_aux : d->stride_d;
    size_t n = want_aux ? g.naux : g.nd;
    unsigned char *written = calloc(n, 1);
    double num = 0, den = 0;
    for (size_t bt = 0; bt < g.batch; bt++)
        for (size_t i = 0; i < d->m; i++)
            for (size_t j = 0; j < d->n; j++) {
                mm_ref r = mm_reference(d, &g, a, b, c, bt, i, j);
                double want = want_aux ? r.p : r.y;
                size_t at = bt * stride + i * ld + j;
                double got = weft__load(d->type, out, at);
                written[at] = 1;
                if (isnan(got))
                    fail_msg("%s: element [%zu][%zu][%zu] is NaN (unwritten?)", name, bt, i, j);
                num += (got - want) * (got - want);
                den += want * want;
            }
    for (size_t x = 0; check_padding && x < n; x++)
        if (!written[x] && !mm_poison_kept(d->type, out, x))
            fail_msg("%s: padding element %zu was written", name, x);
    free(written);
    return sqrt(num / (den > 0 ? den : 1));
}

/* Cases over their bound, counted so that one run lists every case that
 * fails (which types, epilogues and layouts) before the test fails. */
static unsigned over_bound;

static void over(const char *name, const char *what, double e, double lim)
{
    printf("  FAILED %s: %s's error %.3g is over %.3g\n", name, what, e, lim);
    over_bound++;
}

/* Fail the test if any of its cases was over its bound. */
static void no_case_over(void)
{
    unsigned n = over_bound;
    over_bound = 0;
    if (n)
        fail_msg("%u cases over their bound (each listed above)", n);
}

/* One case: random operands, the GPU's D (and aux) checked against float64
 * and the host reference checked against the same bound. */
static void gpu_case(const char *name, weft_matmul_desc desc, int with_c, int in_place,
                     int with_bias, int with_aux, double scale)
{
    mm_geom g = mm_geometry(&desc);
    size_t es = weft__dtype_size(desc.type), ei = weft__dtype_size(g.in_type);
    void *a = mm_random(g.in_type, g.na, scale), *b = mm_random(g.in_type, g.nb, scale);
    size_t nc = in_place ? g.nd : g.nc;
    void *c = with_c ? mm_random(desc.type, nc, 1.0) : NULL;
    void *bias = with_bias ? mm_random(desc.type, desc.n, 1.0) : NULL;
    void *pd = mm_poisoned(desc.type, g.nd), *paux = mm_poisoned(desc.type, g.naux);

    void *da = gt_upload(a, g.na * ei), *db = gt_upload(b, g.nb * ei);
    void *dc = c ? gt_upload(c, nc * es) : NULL;
    void *dd = in_place ? dc : gt_upload(pd, g.nd * es);
    void *dbias = bias ? gt_upload(bias, desc.n * es) : NULL;
    void *daux = with_aux ? gt_upload(paux, g.naux * es) : NULL;

    weft_matmul_desc gd = desc;
    gd.bias = dbias, gd.aux = daux;
    assert_ok(weft_matmul(stream, &gd, dd, da, db, dc));
    assert_cuda(cudaStreamSynchronize(stream));
    void *got = gt_download(dd, g.nd * es);
    double lim = bound(&desc);
    weft_matmul_desc rd = desc; /* the reference reads the host's bias */
    rd.bias = bias;
    double e = rel_error(&rd, a, b, c, got, 0, !in_place, name);
    printf("  %-40s D error %.2e (bound %.0e)\n", name, e, lim);
    if (!(e <= lim))
        over(name, "D", e, lim);
    if (with_aux) {
        void *got_aux = gt_download(daux, g.naux * es);
        double ea = rel_error(&rd, a, b, c, got_aux, 1, 1, name);
        if (!(ea <= lim))
            over(name, "aux", ea, lim);
        free(got_aux);
    }
#ifdef WEFT_HAVE_HOST_BLAS
    /* The host reference, on the same inputs, within the same bound. */
    void *hd = in_place ? malloc(g.nd * es) : mm_poisoned(desc.type, g.nd);
    if (in_place)
        memcpy(hd, c, g.nd * es);
    weft_matmul_desc hdesc = desc;
    hdesc.bias = bias, hdesc.aux = with_aux ? paux : NULL;
    assert_ok(weft_matmul(NULL, &hdesc, hd, a, b, in_place ? hd : c));
    double eh = rel_error(&rd, a, b, c, hd, 0, !in_place, name);
    if (!(eh <= lim))
        over(name, "the host's D", eh, lim);
    free(hd);
#endif
    cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dbias), cudaFree(daux);
    if (!in_place)
        cudaFree(dd);
    free(a), free(b), free(c), free(bias), free(pd), free(paux), free(got);
}

static const weft_dtype OUT_T[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16, WEFT_DTYPE_F32,
                                   WEFT_DTYPE_F32};
static const weft_dtype IN_T[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16, WEFT_DTYPE_BF16,
                                  WEFT_DTYPE_F16};
static const char *const TYPE_NAME[] = {"f32", "bf16", "f16", "bf16->f32", "f16->f32"};

static void test_every_type_and_epilogue_matches_the_reference(void **state)
{
    (void)state;
    char name[96];
    for (int t = 0; t < 5; t++)
        for (int act = 0; act <= WEFT_MATMUL_ACT_GELU_ERF; act++)
            for (int extra = 0; extra < 8; extra++) { /* bias, C, B transposed */
                weft_matmul_desc d = {.m = 96,
                                      .n = 200,
                                      .k = 136,
                                      .type = OUT_T[t],
                                      .in_type = IN_T[t],
                                      .act = (weft_matmul_act)act,
                                      .trans_b = extra >> 2,
                                      .beta = 0.5f};
                snprintf(name, sizeof name, "%s act %d bias %d C %d trans_b %d", TYPE_NAME[t], act,
                         extra & 1, (extra >> 1) & 1, extra >> 2);
                gpu_case(name, d, (extra >> 1) & 1, 0, extra & 1, 0, 1.0);
            }
    no_case_over();
}

static void test_shapes_transposes_batches_and_padding_match(void **state)
{
    (void)state;
    static const size_t SHAPES[][3] = {{1, 1, 1},     {7, 13, 5},      {9, 11, 1},
                                       {1, 300, 257}, {1000, 3, 1000}, {16, 1024, 4096}};
    char name[96];
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++)
        for (int t = 0; t < 3; t++) {
            weft_matmul_desc d = {.m = SHAPES[s][0],
                                  .n = SHAPES[s][1],
                                  .k = SHAPES[s][2],
                                  .type = OUT_T[t],
                                  .act = WEFT_MATMUL_ACT_GELU_TANH,
                                  .trans_b = 1};
            snprintf(name, sizeof name, "%s %zu x %zu x %zu", TYPE_NAME[t], d.m, d.n, d.k);
            gpu_case(name, d, 0, 0, 1, 0, 1.0);
        }
    for (int t = 0; t < 3; t++)
        for (int tr = 0; tr < 4; tr++) {
            weft_matmul_desc d = {.m = 70,
                                  .n = 50,
                                  .k = 90,
                                  .type = OUT_T[t],
                                  .trans_a = tr & 1,
                                  .trans_b = tr >> 1,
                                  .alpha = -0.5f,
                                  .batch = 3,
                                  .act = WEFT_MATMUL_ACT_RELU};
            mm_geom g = mm_geometry(&d);
            d.lda = g.a_cols + 8, d.ldb = g.b_cols + 3, d.ldd = d.n + 6, d.ldc = d.n + 2;
            d.stride_a = g.a_rows * d.lda + 16, d.stride_b = tr == 3 ? 0 : g.b_rows * d.ldb;
            d.stride_c = 0, d.stride_d = d.m * d.ldd + 40;
            snprintf(name, sizeof name, "%s batched trans %d%d", TYPE_NAME[t], tr & 1, tr >> 1);
            gpu_case(name, d, 1, 0, 1, 0, 1.0);
        }
    weft_matmul_desc tf = {.m = 256, .n = 256, .k = 512, .type = WEFT_DTYPE_F32, .allow_tf32 = 1};
    gpu_case("f32 as TF32", tf, 0, 0, 1, 0, 1.0);
    no_case_over();
}

static void test_residual_in_place_and_aux_match(void **state)
{
    (void)state;
    char name[96];
    for (int t = 0; t < 5; t++)
        for (int act = WEFT_MATMUL_ACT_GELU_TANH; act <= WEFT_MATMUL_ACT_GELU_ERF; act++) {
            weft_matmul_desc d = {.m = 64,
                                  .n = 72,
                                  .k = 128,
                                  .type = OUT_T[t],
                                  .in_type = IN_T[t],
                                  .act = (weft_matmul_act)act,
                                  .batch = 2,
                                  .stride_a = 64 * 128,
                                  .stride_d = 64 * 72,
                                  .ldaux = 80,
                                  .stride_aux = 64 * 80 + 8};
            snprintf(name, sizeof name, "%s aux act %d", TYPE_NAME[t], act);
            gpu_case(name, d, 1, 0, 1, 1, 1.0);
            weft_matmul_desc ip = {.m = 64,
                                   .n = 72,
                                   .k = 128,
                                   .type = OUT_T[t],
                                   .in_type = IN_T[t],
                                   .act = (weft_matmul_act)act,
                                   .beta = -1.0f,
                                   .ldd = 80,
                                   .ldc = 80};
            snprintf(name, sizeof name, "%s in place act %d", TYPE_NAME[t], act);
            gpu_case(name, ip, 1, 1, 1, 0, 1.0);
        }
    no_case_over();
}

/* cuBLASLt's GELU epilogue must be the tanh form: on pre-activations over
 * [-4, 4], where the two forms differ by up to ~5e-4, the GPU's result is
 * far nearer the tanh form than the erf form. */
static void test_cublaslt_gelu_is_the_tanh_form(void **state)
{
    (void)state;
    weft_matmul_desc d = {
        .m = 128, .n = 128, .k = 64, .type = WEFT_DTYPE_F32, .act = WEFT_MATMUL_ACT_GELU_TANH};
    mm_geom g = mm_geometry(&d);
    void *a = mm_random(WEFT_DTYPE_F32, g.na, 0.5), *b = mm_random(WEFT_DTYPE_F32, g.nb, 0.5);
    void *da = gt_upload(a, g.na * 4), *db = gt_upload(b, g.nb * 4), *dd = NULL;
    assert_cuda(cudaMalloc(&dd, g.nd * 4));
    assert_ok(weft_matmul(stream, &d, dd, da, db, NULL));
    assert_cuda(cudaStreamSynchronize(stream));
    float *got = gt_download(dd, g.nd * 4);
    double to_tanh = 0, to_erf = 0, den = 0;
    for (size_t i = 0; i < d.m; i++)
        for (size_t j = 0; j < d.n; j++) {
            mm_ref r = mm_reference(&d, &g, a, b, NULL, 0, i, j);
            double e = mm_act(WEFT_MATMUL_ACT_GELU_ERF, r.p), x = got[i * d.n + j];
            to_tanh += (x - r.y) * (x - r.y), to_erf += (x - e) * (x - e), den += r.y * r.y;
        }
    to_tanh = sqrt(to_tanh / den), to_erf = sqrt(to_erf / den);
    printf("  cuBLASLt GELU: %.2e from the tanh form, %.2e from the erf form\n", to_tanh, to_erf);
    assert_true(to_tanh * 4 < to_erf);
    free(a), free(b), free(got);
    cudaFree(da), cudaFree(db), cudaFree(dd);
}

/* A shape's first call makes its plan; the next finds it. The first call's
 * cost (heuristic, and here no new workspace) is printed. */
static void test_a_plan_is_made_once_and_found_on_repeat(void **state)
{
    (void)state;
    weft_matmul_desc d = {.m = 333,
                          .n = 520,
                          .k = 264,
                          .type = WEFT_DTYPE_BF16,
                          .act = WEFT_MATMUL_ACT_GELU_TANH,
                          .trans_b = 1};
    mm_geom g = mm_geometry(&d);
    void *a = mm_random(d.type, g.na, 1), *b = mm_random(d.type, g.nb, 1);
    void *bias = mm_random(d.type, d.n, 1);
    void *da = gt_upload(a, g.na * 2), *db = gt_upload(b, g.nb * 2),
         *dbias = gt_upload(bias, d.n * 2);
    void *dd = NULL;
    assert_cuda(cudaMalloc(&dd, g.nd * 2));
    d.bias = dbias;
    unsigned long long h0, m0, h1, m1, h2, m2;
    weft__matmul_cuda_plan_stats(&h0, &m0);
    double t0 = gt_now();
    assert_ok(weft_matmul(stream, &d, dd, da, db, NULL));
    double t1 = gt_now();
    weft__matmul_cuda_plan_stats(&h1, &m1);
    assert_ok(weft_matmul(stream, &d, dd, da, db, NULL));
    double t2 = gt_now();
    weft__matmul_cuda_plan_stats(&h2, &m2);
    assert_cuda(cudaStreamSynchronize(stream));
    printf("  first call %.1f us (plan made), second %.1f us (plan found)\n", (t1 - t0) * 1e6,
           (t2 - t1) * 1e6);
    assert_int_equal(m1 - m0, 1);
    assert_int_equal(h1 - h0, 0);
    assert_int_equal(m2 - m1, 0);
    assert_int_equal(h2 - h1, 1);
    /* Another bias address of the same alignment is the same plan. */
    void *dbias2 = gt_upload(bias, d.n * 2);
    d.bias = dbias2;
    assert_ok(weft_matmul(stream, &d, dd, da, db, NULL));
    unsigned long long h3, m3;
    weft__matmul_cuda_plan_stats(&h3, &m3);
    assert_int_equal(m3 - m2, 0);
    assert_cuda(cudaStreamSynchronize(stream));
    free(a), free(b), free(bias);
    cudaFree(da), cudaFree(db), cudaFree(dbias), cudaFree(dbias2), cudaFree(dd);
}

/* A matmul captured into a CUDA graph (no workspace then) computes the
 * same when the graph is launched, twice. */
static void test_a_captured_matmul_replays_right(void **state)
{
    (void)state;
    weft_matmul_desc d = {.m = 200,
                          .n = 384,
                          .k = 520,
                          .type = WEFT_DTYPE_BF16,
                          .trans_b = 1,
                          .act = WEFT_MATMUL_ACT_GELU_TANH};
    mm_geom g = mm_geometry(&d);
    void *a = mm_random(d.type, g.na, 1), *b = mm_random(d.type, g.nb, 1);
    void *bias = mm_random(d.type, d.n, 1), *pd = mm_poisoned(d.type, g.nd);
    void *da = gt_upload(a, g.na * 2), *db = gt_upload(b, g.nb * 2),
         *dbias = gt_upload(bias, d.n * 2);
    void *dd = gt_upload(pd, g.nd * 2);
    weft_matmul_desc gd = d;
    gd.bias = dbias;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    assert_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    int rc = weft_matmul(stream, &gd, dd, da, db, NULL);
    assert_cuda(cudaStreamEndCapture(stream, &graph));
    assert_ok(rc);
    assert_cuda(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 2; i++) {
        assert_cuda(gt_copy_in(dd, pd, g.nd * 2));
        assert_cuda(cudaGraphLaunch(exec, stream));
        assert_cuda(cudaStreamSynchronize(stream));
        void *got = gt_download(dd, g.nd * 2);
        d.bias = bias;
        double e = rel_error(&d, a, b, NULL, got, 0, 1, "captured");
        if (!(e <= bound(&d)))
            fail_msg("replay %d: error %.3g", i, e);
        free(got);
    }
    cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
    free(a), free(b), free(bias), free(pd);
    cudaFree(da), cudaFree(db), cudaFree(dbias), cudaFree(dd);
}

/* ---- many tasks at once ------------------------------------------------- */

enum { TASKS = 24, ROUNDS = 4 };

typedef struct job {
    weft_matmul_desc d;
    void *a, *b, *bias, *out; /* device */
} job;

static void *job_main(void *arg)
{
    job *j = arg;
    for (int r = 0; r < ROUNDS; r++)
        if (!GT_OK(weft_matmul(WEFT_TASK_STREAM, &j->d, j->out, j->a, j->b, NULL)))
            return NULL;
    GT_OK(weft_await());
    return NULL;
}

static void test_many_tasks_on_their_own_streams_at_once(void **state)
{
    (void)state;
    weft_config cfg = {.workers = 8, .backend = WEFT_BACKEND_CUDA};
    weft_runtime *rt = NULL;
    assert_ok(weft_runtime_create(&rt, &cfg));
    static job jobs[TASKS];
    void *host[TASKS][3];
    weft_task *tasks[TASKS];
    gt_reset();
    for (int t = 0; t < TASKS; t++) {
        /* Four shapes among the tasks: new plans race to be published. */
        weft_matmul_desc d = {.m = 64 + 32 * (size_t)(t % 4),
                              .n = 256,
                              .k = 320,
                              .type = WEFT_DTYPE_BF16,
                              .trans_b = 1,
                              .act = WEFT_MATMUL_ACT_GELU_TANH};
        mm_geom g = mm_geometry(&d);
        host[t][0] = mm_random(d.type, g.na, 1), host[t][1] = mm_random(d.type, g.nb, 1);
        host[t][2] = mm_random(d.type, d.n, 1);
        jobs[t].d = d;
        jobs[t].a = gt_upload(host[t][0], g.na * 2), jobs[t].b = gt_upload(host[t][1], g.nb * 2);
        jobs[t].bias = gt_upload(host[t][2], d.n * 2);
        jobs[t].d.bias = jobs[t].bias;
        assert_cuda(cudaMalloc(&jobs[t].out, g.nd * 2));
        assert_cuda(gt_memset(jobs[t].out, 0xff, g.nd * 2));
    }
    for (int t = 0; t < TASKS; t++)
        assert_ok(weft_spawn(rt, &tasks[t], job_main, &jobs[t], NULL));
    for (int t = 0; t < TASKS; t++)
        assert_ok(weft_join(tasks[t], NULL));
    gt_assert_passed();
    for (int t = 0; t < TASKS; t++) {
        weft_matmul_desc d = jobs[t].d;
        mm_geom g = mm_geometry(&d);
        void *got = gt_download(jobs[t].out, g.nd * 2);
        d.bias = host[t][2];
        double e = rel_error(&d, host[t][0], host[t][1], NULL, got, 0, 1, "task");
        if (!(e <= bound(&d)))
            fail_msg("task %d: error %.3g", t, e);
        free(got);
        for (int i = 0; i < 3; i++)
            free(host[t][i]);
        cudaFree(jobs[t].a), cudaFree(jobs[t].b), cudaFree(jobs[t].bias), cudaFree(jobs[t].out);
    }
    assert_ok(weft_runtime_destroy(rt));
}

/* ---- bad arguments ---------------------------------------------------- */

static void test_bad_arguments_are_refused_before_launch(void **state)
{
    (void)state;
    weft_matmul_desc d = {.m = 32, .n = 32, .k = 32, .type = WEFT_DTYPE_BF16};
    char *buf = NULL;
    assert_cuda(cudaMalloc((void **)&buf, 3 * 32 * 32 * 2 + 64));
    assert_cuda(gt_memset(buf, 0x5a, 3 * 32 * 32 * 2 + 64));
    char *a = buf, *b = buf + 2048 + 16, *dd = buf + 4096 + 32;
    assert_rc(weft_matmul(stream, &d, dd, a + 1, b, NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "A is not aligned"));
    d.ldd = 16;
    assert_rc(weft_matmul(stream, &d, dd, a, b, NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "D's leading dimension 16"));
    d.ldd = 0, d.act = WEFT_MATMUL_ACT_GELU_TANH, d.aux = buf, d.ldaux = 36;
    assert_rc(weft_matmul(stream, &d, dd, a, b, NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "multiples of 8"));
    assert_cuda(cudaStreamSynchronize(stream));
    unsigned char *h = gt_download(dd, 32 * 32 * 2);
    for (size_t i = 0; i < 32 * 32 * 2; i++)
        assert_int_equal(h[i], 0x5a);
    free(h);
    cudaFree(buf);
}

/* ---- main ------------------------------------------------------------------ */

static int setup(void **state)
{
    (void)state;
    mm_rng_state = gt_rng(39);
    return gt_stream_setup(&runtime, &stream);
}

static int teardown(void **state)
{
    (void)state;
    return gt_stream_teardown(runtime, stream);
}

int main(void)
{
    int skip = gt_start("gpu.matmul");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_and_epilogue_matches_the_reference),
        cmocka_unit_test(test_shapes_transposes_batches_and_padding_match),
        cmocka_unit_test(test_residual_in_place_and_aux_match),
        cmocka_unit_test(test_cublaslt_gelu_is_the_tanh_form),
        cmocka_unit_test(test_a_plan_is_made_once_and_found_on_repeat),
        cmocka_unit_test(test_a_captured_matmul_replays_right),
        cmocka_unit_test(test_many_tasks_on_their_own_streams_at_once),
        cmocka_unit_test(test_bad_arguments_are_refused_before_launch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
