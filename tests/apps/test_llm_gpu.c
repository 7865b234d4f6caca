/*
 * test_llm_gpu.c - weft-llm's forward pass on the GPU against the host
 * backend, batched decoding on the GPU against each sequence alone there,
 * and generate with --backend cuda (also --parallel), for a dense and two
 * mixture-of-experts models, speculative decoding against plain greedy
 * decoding there, and tensor parallel over two GPUs against one. Exits 77
 * (skipped) without a GPU.
 *
 * The same code runs on both (every op on the task's stream); the GPU's
 * matmuls sum in another order, so a bf16 activation may round the other
 * way now and then: the logits agree to a few bf16 units at their scale,
 * and the argmax agrees wherever the top two are further apart than that.
 * A router's choice is as close as its top logits: the tokens are drawn so
 * that the float64 reference routes none within ROUTE_MARGIN units of a tie
 * (llm_ref.h's ref_draw_ids), where a unit's move may pick another expert.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "llm_test.h"
#include "llm_ref.h"

/* bf16 units at the router logits' scale a routing keeps from a tie: the
 * GPU's hidden states differ from the host's by a unit or two there. */
#define ROUTE_MARGIN 4.0

/* n ids for model from st, none routed near a tie. */
static void draw_ids(const char *model, uint64_t *st, int32_t *ids, int n)
{
    wl_model m;
    if (wl_model_open(&m, model))
        fail_msg("%s", wl_error());
    int draws = ref_draw_ids(&m, st, ids, n, ROUTE_MARGIN);
    if (draws > 1)
        printf("  (tokens drawn %d times: a routing within %.0f units of a tie)\n", draws,
               ROUTE_MARGIN);
    wl_model_close(&m);
}

/* The tiny Llama, a tiny Mixtral and a tiny Qwen2-MoE (random-model's
 * tiny, moe and qwen2moe presets): the MoE ones run weft's router,
 * permute, grouped matmul and combine kernels. */
enum { MODELS = 3 };
static const char *const presets[MODELS] = {"tiny", "moe", "qwen2moe"};
static char *dir, *model_dir, *models[MODELS];
static uint64_t seed;

static int setup(void **state)
{
    (void)state;
    seed = test_seed();
    dir = scratch_dir();
    if (!dir)
        return -1;
    for (int i = 0; i < MODELS; i++) {
        models[i] = path_in(dir, presets[i]);
        wl_write_opts o = {.preset = presets[i], .seed = seed};
        if (wl_write_random_model(models[i], &o)) {
            fprintf(stderr, "%s\n", wl_error());
            return -1;
        }
    }
    model_dir = models[0];
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    remove_scratch(dir);
    free(dir);
    for (int i = 0; i < MODELS; i++)
        free(models[i]);
    return 0;
}

static int gpu_logits_match_host(const char *model, double units)
{
    enum { V = TINY_VOCAB, PROMPT = 7, TOTAL = 12, STEPS = TOTAL - PROMPT + 1 };
    int32_t ids[TOTAL];
    uint64_t st = seed ^ 0x6b0;
    draw_ids(model, &st, ids, TOTAL);
    float *host = malloc(sizeof(float) * STEPS * V), *gpu = malloc(sizeof(float) * STEPS * V);
    char msg[512];
    printf("  %s\n", model);
    if (run_forward(WEFT_BACKEND_HOST, model, ids, PROMPT, TOTAL, host, msg))
        fail_msg("host: %s", msg);
    if (run_forward(WEFT_BACKEND_CUDA, model, ids, PROMPT, TOTAL, gpu, msg))
        fail_msg("gpu: %s", msg);
    int bad = 0;
    for (int s = 0; s < STEPS; s++) {
        const float *h = host + (size_t)s * V, *g = gpu + (size_t)s * V;
        double scale = 0, worst = 0;
        int worst_at = 0, ah = 0, ag = 0, second = -1;
        for (int k = 0; k < V; k++) {
            if (isnan(g[k])) {
                printf("  step %d: GPU logit %d not written (NaN)\n", s, k);
                bad++;
                break;
            }
            scale = fmax(scale, fabs(h[k]));
            if (fabs(g[k] - h[k]) > worst) {
                worst = fabs(g[k] - h[k]);
                worst_at = k;
            }
            ah = h[k] > h[ah] ? k : ah;
            ag = g[k] > g[ag] ? k : ag;
        }
        for (int k = 0; k < V; k++)
            if (k != ah && (second < 0 || h[k] > h[second]))
                second = k;
        double ulp = scale / 128, gap = h[ah] - h[second];
        printf("  step %d: scale %.4f, max |gpu - host| %.3e = %.2f bf16 units (logit %d: host "
               "%.6f gpu %.6f), argmax host %d gpu %d, top-two gap %.2f units\n",
               s, scale, worst, worst / ulp, worst_at, h[worst_at], g[worst_at], ah, ag, gap / ulp);
        if (worst > units * ulp)
            bad++;
        if (ah != ag && gap > 8 * ulp)
            bad++;
    }
    free(host);
    free(gpu);
    return bad;
}

static void test_gpu_logits_match_host(void **state)
{
    (void)state;
    int bad = 0;
    for (int i = 0; i < MODELS; i++)
        bad += gpu_logits_match_host(models[i], 4);
    assert_int_equal(bad, 0);
}

/* An FP8 model (random-model --fp8) on the GPU: its inputs quantized by
 * weft_quantize_fp8's kernel and multiplied by cuBLASLt's FP8 product,
 * against the host's logits as the bf16 models are. An activation one bf16
 * unit off takes the neighbouring FP8 code about one time in 16 (E4M3
 * keeps 3 of bf16's 7 fraction bits), a step of 16 units: held to 8 units
 * where the bf16 models are held to 4 (4.6 seen on an H200). */
static void test_gpu_fp8_model_matches_host(void **state)
{
    (void)state;
    char *d = path_in(dir, "fp8");
    wl_write_opts o = {.preset = "tiny", .seed = seed, .fp8 = 1};
    if (wl_write_random_model(d, &o))
        fail_msg("%s", wl_error());
    assert_int_equal(gpu_logits_match_host(d, 8), 0);
    free(d);
}

/* An fp32 model on the GPU: rounded to bf16 at its upload, its logits are
 * its bf16 twin's, bit for bit. */
static void test_gpu_fp32_model_runs_as_its_bf16_twin(void **state)
{
    (void)state;
    enum { PROMPT = 5, TOTAL = 9 };
    const int32_t ids[TOTAL] = {256, 296, 267, 300, 41, 7, 99, 3, 12};
    char *d16 = path_in(dir, "twin16"), *d32 = path_in(dir, "twin32"), msg[512];
    wl_write_opts o = {.preset = "tiny", .seed = 13};
    assert_int_equal(wl_write_random_model(d16, &o), 0);
    o.fp32 = 1;
    assert_int_equal(wl_write_random_model(d32, &o), 0);
    size_t n = (size_t)(TOTAL - PROMPT + 1) * TINY_VOCAB;
    float *l16 = malloc(n * 4), *l32 = malloc(n * 4);
    assert_true(l16 && l32);
    if (run_forward(WEFT_BACKEND_CUDA, d16, ids, PROMPT, TOTAL, l16, msg) ||
        run_forward(WEFT_BACKEND_CUDA, d32, ids, PROMPT, TOTAL, l32, msg))
        fail_msg("%s", msg);
    assert_memory_equal(l16, l32, n * 4);
    free(l16), free(l32), free(d16), free(d32);
}

/* Three sequences of different lengths through the batcher on the GPU,
 * one stopped midway (their prompts prefilled alone, or in chunks of 2
 * through the batcher's mixed steps), against each alone on the GPU: the batch's matmuls
 * (m = the batch) and its one decode attention may pick other kernels or
 * splits than one row does, so a bf16 activation may round the other way:
 * within 4 bf16 units at the logits' scale, every logit written, every
 * page back. */
static int gpu_batched_matches_alone(const char *model, int chunk)
{
    enum { SEQS = 3, V = TINY_VOCAB, MAX_TOTAL = 14, STEPS = MAX_TOTAL };
    static const int prompt[SEQS] = {5, 3, 7}, total[SEQS] = {9, 14, 12};
    int32_t ids[SEQS][MAX_TOTAL];
    uint64_t st = seed ^ 0xb47c;
    float *alone = malloc(sizeof(float) * SEQS * STEPS * V);
    float *together = malloc(sizeof(float) * SEQS * STEPS * V);
    char msg[512];
    batch_run r = {.seqs = SEQS, .pages = 8, .chunk = chunk};
    for (size_t i = 0; i < (size_t)SEQS * STEPS * V; i++)
        together[i] = NAN;
    for (int q = 0; q < SEQS; q++) {
        draw_ids(model, &st, ids[q], MAX_TOTAL);
        if (run_forward(WEFT_BACKEND_CUDA, model, ids[q], prompt[q], total[q],
                        alone + (size_t)q * STEPS * V, msg))
            fail_msg("alone on the GPU: %s", msg);
        r.ids[q] = ids[q];
        r.prompt[q] = prompt[q];
        r.total[q] = total[q];
        r.stop[q] = q == 1 ? 3 : 0;
        r.logits[q] = together + (size_t)q * STEPS * V;
    }
    printf("  %s, %s\n", model, chunk ? "prompts in chunks of 2 in the steps" : "prompts alone");
    if (run_batched(WEFT_BACKEND_CUDA, model, &r))
        fail_msg("batched on the GPU: %s", r.message);
    printf("  %ld tokens in %ld batched steps, %d of 8 pages free after\n", r.rows, r.steps,
           r.free_pages);
    int bad = r.free_pages != 8;
    for (int q = 0; q < SEQS; q++) {
        int want = q == 1 ? 3 : total[q] - prompt[q];
        if (r.steps_done[q] != want) {
            printf("  sequence %d: %d steps, not %d\n", q, r.steps_done[q], want);
            bad++;
        }
        for (int k = 0; k <= r.steps_done[q]; k++) {
            const float *a = alone + ((size_t)q * STEPS + k) * V;
            const float *b = together + ((size_t)q * STEPS + k) * V;
            double scale = 0, worst = 0;
            int nan = 0;
            for (int i = 0; i < V; i++) {
                nan += isnan(b[i]);
                scale = fmax(scale, fabs(a[i]));
                worst = fmax(worst, fabs((double)a[i] - b[i]));
            }
            printf("  sequence %d step %d: scale %.4f, max |batched - alone| %.3e = %.2f bf16 "
                   "units, %d NaN\n",
                   q, k, scale, worst, worst / (scale / 128), nan);
            if (nan || worst > 4 * scale / 128)
                bad++;
        }
    }
    free(alone);
    free(together);
    return bad;
}

static void test_gpu_batched_matches_alone(void **state)
{
    (void)state;
    int bad = 0;
    for (int i = 0; i < MODELS; i++)
        bad += gpu_batched_matches_alone(models[i], 0) + gpu_batched_matches_alone(models[i], 2);
    assert_int_equal(bad, 0);
}

/* A preempted sequence's cache swapped to host memory and back into new
 * pages on the GPU continues bit for bit (llm_test.h's round trip). */
static void test_gpu_swapped_sequence_continues_bit_for_bit(void **state)
{
    (void)state;
    char msg[512];
    for (int i = 0; i < MODELS; i++)
        if (run_swap_roundtrip(WEFT_BACKEND_CUDA, models[i], msg))
            fail_msg("%s: %s", models[i], msg);
}

static void test_cli_generates_on_the_gpu(void **state)
{
    (void)state;
    char cmd[2048], *out_h, *err_h, *out_g, *err_g;
    snprintf(cmd, sizeof cmd,
             "%s generate %s --prompt 'The old woman' --max-tokens 16 --print-ids --backend host",
             WL_BIN, model_dir);
    assert_int_equal(run_capture(cmd, &out_h, &err_h), 0);
    snprintf(cmd, sizeof cmd,
             "%s generate %s --prompt 'The old woman' --max-tokens 16 --print-ids --backend cuda",
             WL_BIN, model_dir);
    int rc = run_capture(cmd, &out_g, &err_g);
    printf("  host: %s", err_h);
    printf("  cuda (exit %d): %s", rc, err_g);
    assert_int_equal(rc, 0);
    /* the same prompt; the ids agree up to the first near tie (see above) */
    assert_non_null(strstr(err_g, "generated ids: "));
    free(out_g);
    free(err_g);
    /* three copies through the batcher on the GPU, each with its index */
    snprintf(cmd, sizeof cmd,
             "%s generate %s --prompt 'The old woman' --max-tokens 16 --print-ids --backend cuda "
             "--parallel 3 --temperature 0.8 --seed 3",
             WL_BIN, model_dir);
    rc = run_capture(cmd, &out_g, &err_g);
    printf("  cuda --parallel 3 (exit %d): %s%s", rc, out_g, err_g);
    assert_int_equal(rc, 0);
    for (int i = 0; i < 3; i++) {
        char head[32];
        snprintf(head, sizeof head, "[%d] ", i);
        assert_non_null(strstr(out_g, head));
        assert_non_null(strstr(err_g, head));
    }
    free(out_h);
    free(err_h);
    free(out_g);
    free(err_g);
    /* penalties applied on the GPU before each step's draw: a presence
     * penalty of 2 (above the tiny model's logits' span) forbids repeating
     * an output token, a repetition penalty of 100 the prompt's too */
    static const char *const penalties[] = {"--presence-penalty 2", "--repetition-penalty 100"};
    for (int p = 0; p < 2; p++) {
        snprintf(cmd, sizeof cmd,
                 "%s generate %s --prompt-ids 256,296,267 --max-tokens 40 --ignore-eos "
                 "--print-ids --backend cuda %s",
                 WL_BIN, model_dir, penalties[p]);
        assert_int_equal(run_capture(cmd, &out_g, &err_g), 0);
        const char *at = strstr(err_g, "generated ids: ");
        assert_non_null(at);
        int ids[41], n = 0, repeats = 0;
        for (const char *q = at + strlen("generated ids: "); n < 41 && *q && *q != '\n';) {
            ids[n++] = (int)strtol(q, (char **)&q, 10);
            if (*q == ',')
                q++;
        }
        for (int i = 0; i < n; i++)
            for (int j = 0; j < i; j++)
                repeats += ids[i] == ids[j];
        for (int i = 0; p == 1 && i < n; i++)
            repeats += ids[i] == 256 || ids[i] == 296 || ids[i] == 267;
        printf("  cuda %s: %d ids, %d repeats\n", penalties[p], n, repeats);
        assert_int_equal(n, 40);
        assert_int_equal(repeats, 0);
        free(out_g);
        free(err_g);
    }
    /* the MoE presets on the GPU, one sequence and three batched */
    for (int m = 1; m < MODELS; m++) {
        snprintf(cmd, sizeof cmd,
                 "%s generate %s --prompt 'The old woman' --max-tokens 16 --print-ids --print-top "
                 "--backend cuda --parallel 3",
                 WL_BIN, models[m]);
        rc = run_capture(cmd, &out_g, &err_g);
        printf("  %s on cuda, --parallel 3 (exit %d): %s%s", presets[m], rc, out_g, err_g);
        assert_int_equal(rc, 0);
        assert_non_null(strstr(err_g, "[2] "));
        free(out_g);
        free(err_g);
    }
}

/* Graph mode: the batch's decode steps are graphs on the GPU (weft-llm
 * bench counts their launches), and the tokens of generate, whose steps
 * after the first replay the recorded graph as it stands, are the same
 * with every step recorded (WEFT_LLM_REPLAY=0) and with graph mode off
 * (WEFT_LLM_GRAPH=0: every op launched as it comes); greedy, and sampled
 * with a seed (a replayed step draws with its own offset: a graph that
 * kept the first step's would repeat its draws). */
static void test_gpu_decode_steps_are_graphs(void **state)
{
    (void)state;
    char cmd[2048], *out, *err, *out_e, *err_e;
    snprintf(cmd, sizeof cmd,
             "%s bench %s --backend cuda --prompt-lens 16 --batches 1,3 --steps 6 --repeats 1 "
             "--decode-prompt 8",
             WL_BIN, model_dir);
    int rc = run_capture(cmd, &out, &err);
    printf("%s%s", out, err);
    assert_int_equal(rc, 0);
    const char *at = strstr(out, "BENCH llm.decode.graph_launches ");
    assert_non_null(at);
    long launches = strtol(at + strlen("BENCH llm.decode.graph_launches "), NULL, 10);
    assert_true(launches >= 2 * 8); /* each batch size: 2 warm-up steps and 6 timed */
    free(out);
    free(err);
    static const char *const draws[] = {"", "--temperature 0.8 --top-p 0.9 --seed 7"};
    for (int d = 0; d < 2; d++) {
        snprintf(cmd, sizeof cmd,
                 "%s generate %s --prompt 'The old woman' --max-tokens 16 --print-ids "
                 "--backend cuda %s",
                 WL_BIN, model_dir, draws[d]);
        assert_int_equal(run_capture(cmd, &out, &err), 0);
        char eager[2200], *out_r, *err_r;
        snprintf(eager, sizeof eager, "WEFT_LLM_GRAPH=0 %s", cmd);
        assert_int_equal(run_capture(eager, &out_e, &err_e), 0);
        snprintf(eager, sizeof eager, "WEFT_LLM_REPLAY=0 %s", cmd);
        assert_int_equal(run_capture(eager, &out_r, &err_r), 0);
        printf("  %s\n  graphs: %s  recorded every step: %s  eager: %s", d ? draws[d] : "greedy",
               err, err_r, err_e);
        /* one sequence: the same kernels, launched three ways */
        assert_string_equal(err, err_e);
        assert_string_equal(err, err_r);
        free(out);
        free(err);
        free(out_e);
        free(err_e);
        free(out_r);
        free(err_r);
    }
}

/* How many ways spec's run fails plain's (test_gpu_speculative_matches_plain
 * says which): logits apart by more than 4 bf16 units, NaN, a parting
 * that is not at a near tie, a short run. */
static int spec_faults(const gen_run *plain, const gen_run *spec, int V, int maxt)
{
    int bad = plain->n != maxt || spec->n != maxt || spec->st.tokens != maxt - 1;
    for (int i = 0; i < plain->n && i < spec->n; i++) {
        const float *a = plain->logits + (size_t)i * V, *b = spec->logits + (size_t)i * V;
        double scale = 0, worst = 0;
        int top = 0, second = -1, nan = 0;
        for (int k = 0; k < V; k++) {
            nan += isnan(b[k]);
            scale = fmax(scale, fabs(a[k]));
            worst = fmax(worst, fabs((double)a[k] - b[k]));
            top = a[k] > a[top] ? k : top;
        }
        for (int k = 0; k < V; k++)
            if (k != top && (second < 0 || a[k] > a[second]))
                second = k;
        double ulp = scale / 128, gap = a[top] - a[second];
        printf("  token %d: plain %d speculative %d, max |difference| %.2f bf16 units, top-two "
               "gap %.2f units%s\n",
               i, plain->ids[i], spec->ids[i], worst / ulp, gap / ulp, nan ? ", NaN" : "");
        if (nan || worst > 4 * ulp)
            bad++;
        if (plain->ids[i] != spec->ids[i]) {
            printf("  the runs part at token %d, %s (gap %.2f bf16 units); the rest is not "
                   "compared\n",
                   i, gap > 8 * ulp ? "NOT a near tie" : "a near tie", gap / ulp);
            bad += gap > 8 * ulp;
            break;
        }
    }
    return bad;
}

/* Speculative decoding on the GPU: greedy with 4 draft tokens a round
 * against plain greedy decoding (the batcher's steps), on a repetitive
 * prompt. The verify pass runs its matmuls over 5 rows and its attention
 * with q_len 5 where a plain step runs one row, so cuBLASLt may pick
 * another kernel and a bf16 activation may round the other way: the
 * logits handed with each token agree within 4 bf16 units, and the tokens
 * agree up to the first near tie (top two within 8 units), where the two
 * runs may part; a parting at a wider gap is a bug. */
static void test_gpu_speculative_matches_plain(void **state)
{
    (void)state;
    enum { V = 512, PHRASE = 6, NP = 36, MAXT = 48 };
    int32_t prompt[NP];
    uint64_t st = seed ^ 0x5bec;
    for (int i = 0; i < PHRASE; i++)
        prompt[i] = 256 + (int32_t)(wl_rand_next(&st) % (V - 256));
    for (int i = PHRASE; i < NP; i++)
        prompt[i] = prompt[i - PHRASE];
    wl_model m;
    assert_int_equal(wl_model_open(&m, model_dir), 0);
    m.cfg.n_eos = 0; /* the whole length */
    weft_runtime *rt;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 2;
    cfg.backend = WEFT_BACKEND_CUDA;
    cfg.stack_size = 1 << 20;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    wl_engine e;
    if (wl_engine_start(&e, rt, &m, 8, 1, 128))
        fail_msg("engine: %s", wl_error());
    gen_run *plain = calloc(1, sizeof *plain), *spec = calloc(1, sizeof *spec);
    *plain = (gen_run){.e = &e, .prompt = prompt, .n_prompt = NP, .max_tokens = MAXT};
    plain->logits = malloc(sizeof(float) * GR_MAX_TOKENS * V);
    *spec = *plain;
    spec->logits = malloc(sizeof(float) * GR_MAX_TOKENS * V);
    spec->speculate = 4;
    if (run_generation(rt, plain))
        fail_msg("plain: %s", plain->message);
    if (run_generation(rt, spec))
        fail_msg("speculative: %s", spec->message);
    printf("  plain %d tokens; speculative %d tokens in %ld rounds, %ld of %ld draft tokens "
           "accepted\n",
           plain->n, spec->n, spec->st.rounds, spec->st.accepted, spec->st.proposed);
    int bad = spec_faults(plain, spec, V, MAXT);
    /* the same generation drafted by the model's own weights, opened again:
     * every draft token but near ties accepted */
    wl_model d;
    assert_int_equal(wl_model_open(&d, model_dir), 0);
    if (wl_engine_set_draft(&e, &d))
        fail_msg("draft: %s", wl_error());
    spec->use_draft = 1;
    if (run_generation(rt, spec))
        fail_msg("drafted: %s", spec->message);
    printf("  drafted by its own weights: %d tokens in %ld rounds, %ld of %ld draft tokens "
           "accepted\n",
           spec->n, spec->st.rounds, spec->st.accepted, spec->st.proposed);
    bad += spec_faults(plain, spec, V, MAXT);
    bad += spec->st.accepted < spec->st.proposed * 8 / 10;
    wl_engine_counts counts;
    wl_engine_stats(&e, &counts);
    bad += counts.used_pages != 0;
    assert_int_equal(wl_engine_stop(&e), 0);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    wl_model_close(&m);
    wl_model_close(&d);
    free(plain->logits);
    free(spec->logits);
    free(plain);
    free(spec);
    assert_int_equal(bad, 0);
    /* and the command line's --speculate on the GPU */
    char cmd[2048], *out, *err;
    snprintf(cmd, sizeof cmd,
             "%s generate %s --prompt 'the cat sat. the cat sat. the cat sat.' --max-tokens 32 "
             "--print-ids --backend cuda --speculate 4 --stats",
             WL_BIN, model_dir);
    int rc = run_capture(cmd, &out, &err);
    printf("  cuda --speculate 4 (exit %d): %s%s", rc, out, err);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(err, "speculative: "));
    free(out);
    free(err);
}

/* Tensor parallel on the GPUs through NCCL: with two or more, generate
 * --tensor-parallel 2 gives one GPU's greedy ids up to a near tie (the
 * ranks' partial sums are rounded before they are added), also with three
 * sequences batched; with one, it is refused, saying how many there are,
 * and the two-GPU part is skipped. */
static void test_gpu_tensor_parallel(void **state)
{
    (void)state;
    weft_runtime *rt = NULL;
    weft_config cfg = {.workers = 1, .backend = WEFT_BACKEND_CUDA};
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    unsigned gpus = weft_device_count(rt);
    weft_runtime_destroy(rt);
    char cmd[2048], *out, *err, *out1, *err1;
    const char *common = "--prompt 'The old woman' --max-tokens 16 --print-ids --ignore-eos "
                         "--backend cuda";
    snprintf(cmd, sizeof cmd, "%s generate %s %s --tensor-parallel 2", WL_BIN, model_dir, common);
    int rc = run_capture(cmd, &out, &err);
    printf("  %u GPUs; --tensor-parallel 2 (exit %d): %s%s", gpus, rc, out, err);
    if (gpus < 2) {
        assert_int_equal(rc, 1);
        assert_non_null(strstr(err, "this machine has 1"));
        free(out), free(err);
        printf("  skipped: tensor parallel's run needs two GPUs\n");
        skip();
    }
    assert_int_equal(rc, 0);
    snprintf(cmd, sizeof cmd, "%s generate %s %s --print-top", WL_BIN, model_dir, common);
    assert_int_equal(run_capture(cmd, &out1, &err1), 0);
    long long a[64], b[64], token;
    int n = printed_ids(err1, a, 64), k = 0;
    assert_int_equal(printed_ids(err, b, 64), n);
    while (k < n && a[k] == b[k])
        k++;
    if (k < n) {
        double gap = printed_gap(err1, k, &token);
        printf("  one GPU and two part at token %d, gap %.2g of the top\n", k, gap);
        assert_true(gap < 1.0 / 64);
    }
    free(out), free(err), free(out1), free(err1);
    snprintf(cmd, sizeof cmd, "%s generate %s %s --tensor-parallel 2 --parallel 3", WL_BIN,
             model_dir, common);
    rc = run_capture(cmd, &out, &err);
    printf("  --tensor-parallel 2 --parallel 3 (exit %d): %s%s", rc, out, err);
    assert_int_equal(rc, 0);
    for (int i = 0; i < 3; i++) { /* each copy printed with its index */
        char head[32];
        snprintf(head, sizeof head, "[%d] ", i);
        assert_non_null(strstr(out, head));
    }
    free(out), free(err);
}

int main(void)
{
    weft_runtime *rt = NULL;
    weft_config cfg = {.workers = 1};
    int gpu = weft_runtime_create(&rt, &cfg) == WEFT_OK && !strcmp(weft_backend_name(rt), "cuda");
    if (rt)
        weft_runtime_destroy(rt);
    if (!gpu) {
        printf("SKIPPED: no GPU\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_logits_match_host),
        cmocka_unit_test(test_gpu_fp32_model_runs_as_its_bf16_twin),
        cmocka_unit_test(test_gpu_fp8_model_matches_host),
        cmocka_unit_test(test_gpu_batched_matches_alone),
        cmocka_unit_test(test_gpu_swapped_sequence_continues_bit_for_bit),
        cmocka_unit_test(test_cli_generates_on_the_gpu),
        cmocka_unit_test(test_gpu_speculative_matches_plain),
        cmocka_unit_test(test_gpu_decode_steps_are_graphs),
        cmocka_unit_test(test_gpu_tensor_parallel),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
