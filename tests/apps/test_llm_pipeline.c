/*
 * test_llm_pipeline.c - weft-llm's steps over a pipeline of MPI ranks, run
 * as every rank of a job under mpiexec (CTest: apps.llm_pipeline.2 and .3)
 * on the host backend.
 *
 * For each preset with at least as many layers as ranks (the tiny Llama,
 * Mixtral and Qwen2-MoE), rank 0 first runs a script of steps alone with
 * the whole model: three sequences' prompts in two mixed steps (the second
 * with decode rows beside the last prompt's chunk), then decode steps each
 * feeding the tokens the last one drew; one sequence greedy, two sampled
 * by their own parameters, every step's logits brought back. Then every
 * rank opens the model as its stage (wl_link_stage, wl_model_set_stage),
 * rank 0 runs the same script through its linked batch while the others
 * serve it (wl_batch_follow), and rank 0 checks that the tokens and the
 * logits are those of the run alone, bit for bit: each stage runs the same
 * ops on the same rows. Also: stages out of the model, a stage that is not
 * the link's and more ranks than layers are refused.
 *
 * The model is drawn from a seed rank 0 takes from the clock (or
 * WEFT_TEST_SEED) and prints; every failed check is reported with its rank
 * and line, and a rank with one exits 1.
 */
#include <mpi.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llm.h"

enum { SEQS = 3, CHUNK = 8, STEPS = 6, MAX_TOKENS = 24, PAGES = 16, MAX_VOCAB = 4096 };

/* The script: prompts of 5, 3 and 7 tokens in two mixed steps of at most
 * SEQS + CHUNK rows, then decode steps. counts[s][q]: sequence q's tokens
 * at step s. */
static const int prompt_len[SEQS] = {5, 3, 7};
static const int counts[STEPS][SEQS] = {{5, 3, 3}, {1, 1, 4}, {1, 1, 1},
                                        {1, 1, 1}, {1, 1, 1}, {1, 1, 1}};

static int rank, size;
static atomic_int failures;

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "rank %d: %s:%d: check failed: %s (%s)\n", rank, __FILE__, __LINE__,   \
                    #c, wl_error());                                                               \
            atomic_fetch_add(&failures, 1);                                                        \
        }                                                                                          \
    } while (0)

/* One run's job: the model's directory, whether it is the pipeline's,
 * and (rank 0) what the script drew and every step's logits. */
typedef struct run {
    const char *dir;
    int linked;
    uint64_t seed;
    int vocab;
    int32_t picked[STEPS][SEQS];
    float *logits; /* [STEPS][SEQS][vocab] */
    int failed;
    char message[512];
} run;

/* Rank 0's script on batch b: the prompts' tokens drawn from the seed,
 * then each step's drawn tokens fed to the next. */
static int script(run *r, const wl_model *m, wl_kv *kv, wl_batch *b)
{
    wl_seq *seqs[SEQS] = {0};
    int32_t prompt[SEQS][CHUNK], ids[SEQS * CHUNK];
    uint64_t st = r->seed ^ 0x919e;
    const float *logits[SEQS];
    wl_draw draws[SEQS] = {
        {.how = {.temperature = 0.9f, .top_p = 0.95f, .seed = r->seed, .offset = 3}},
        {.how = {0}}, /* greedy */
        {.how = {.temperature = 1.3f, .top_k = 7, .seed = r->seed + 1}}};
    int rc = -1, fed[SEQS] = {0};
    for (int q = 0; q < SEQS; q++) {
        for (int i = 0; i < prompt_len[q]; i++)
            prompt[q][i] = (int32_t)(wl_rand_next(&st) % (uint64_t)m->cfg.vocab);
        if (wl_seq_create(&seqs[q], m, kv, MAX_TOKENS, 1))
            goto out;
    }
    for (int s = 0; s < STEPS; s++) {
        int rows = 0, mixed = 0;
        for (int q = 0; q < SEQS; q++) {
            for (int t = 0; t < counts[s][q]; t++) /* the prompt's next tokens, or the last draw */
                ids[rows++] = fed[q] < prompt_len[q] ? prompt[q][fed[q]++] : r->picked[s - 1][q];
            mixed |= counts[s][q] > 1;
            draws[q].how.offset++;
        }
        int step =
            mixed ? wl_forward_mixed(b, seqs, ids, counts[s], SEQS, logits, draws, r->picked[s])
                  : wl_forward_batch(b, seqs, ids, SEQS, logits, draws, r->picked[s]);
        if (step)
            goto out;
        for (int q = 0; q < SEQS; q++)
            memcpy(r->logits + ((size_t)s * SEQS + q) * r->vocab, logits[q],
                   (size_t)r->vocab * sizeof(float));
    }
    rc = 0;
out:
    for (int q = 0; q < SEQS; q++)
        wl_seq_destroy(seqs[q]);
    return rc;
}

static void *run_task(void *arg)
{
    run *r = arg;
    wl_model m;
    wl_kv kv = {0};
    wl_batch *b = NULL;
    wl_link *l = NULL;
    int kv_made = 0;
    r->failed = 1;
    if (wl_model_open(&m, r->dir))
        goto out_msg;
    r->vocab = m.cfg.vocab;
    if (r->vocab > MAX_VOCAB) {
        wl_fail("a vocabulary of %d; the test keeps %d logits a row", r->vocab, MAX_VOCAB);
        goto out_model;
    }
    if (r->linked) {
        int first, end;
        if (wl_link_open(&l, weft_runtime_current()) ||
            wl_link_stage(l, m.cfg.layers, &first, &end) || wl_model_set_stage(&m, first, end))
            goto out_model;
    }
    if (wl_model_upload(&m) || wl_kv_create(&kv, &m, PAGES, WL_KV_PAGE))
        goto out_model;
    kv_made = 1;
    if (wl_batch_create(&b, &m, &kv, SEQS, MAX_TOKENS, CHUNK) || (l && wl_batch_link(b, l)))
        goto out_model;
    if (rank == 0 || !l) {
        int rc = script(r, &m, &kv, b);
        if (l && wl_batch_unlink(b) && !rc)
            rc = -1;
        r->failed = rc != 0;
    } else {
        r->failed = wl_batch_follow(b) != 0;
    }
out_model:
    if (r->failed)
        snprintf(r->message, sizeof r->message, "%s", wl_error());
    wl_batch_destroy(b);
    if (kv_made)
        wl_kv_destroy(&kv);
    wl_link_close(l);
    wl_model_release(&m);
    wl_model_close(&m);
    return NULL;
out_msg:
    snprintf(r->message, sizeof r->message, "%s", wl_error());
    return NULL;
}

/* r's job in a task of a fresh host-backend runtime. */
static void run_on_runtime(run *r)
{
    weft_runtime *rt;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 2;
    cfg.backend = WEFT_BACKEND_HOST;
    cfg.stack_size = 1 << 20;
    weft_task *t;
    r->failed = 1;
    if (weft_runtime_create(&rt, &cfg) != WEFT_OK) {
        snprintf(r->message, sizeof r->message, "runtime: %s", weft_last_error());
        return;
    }
    if (weft_spawn(rt, &t, run_task, r, NULL) != WEFT_OK || weft_join(t, NULL) != WEFT_OK)
        snprintf(r->message, sizeof r->message, "task: %s", weft_last_error());
    weft_runtime_destroy(rt);
}

/* A preset's model through the pipeline against rank 0 alone. */
static void check_preset(const char *dir, const char *preset, int layers, uint64_t seed)
{
    size_t bytes = (size_t)STEPS * SEQS * MAX_VOCAB * sizeof(float);
    run alone = {.dir = dir, .seed = seed, .logits = calloc(1, bytes)};
    run piped = {.dir = dir, .seed = seed, .linked = 1, .logits = calloc(1, bytes)};
    if (layers < size) { /* every rank sees it: a stage for each is refused */
        run_on_runtime(&piped);
        CHECK(piped.failed && strstr(piped.message, "ranks for a model of"));
        if (rank == 0)
            printf("%s: %d layers for %d ranks refused: %s\n", preset, layers, size, piped.message);
        free(alone.logits), free(piped.logits);
        return;
    }
    if (rank == 0) {
        run_on_runtime(&alone);
        CHECK(!alone.failed);
        if (alone.failed)
            fprintf(stderr, "rank 0: %s alone: %s\n", preset, alone.message);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    run_on_runtime(&piped);
    CHECK(!piped.failed);
    if (piped.failed) { /* the other ranks may wait on this one: the job ends */
        fprintf(stderr, "rank %d: %s through the pipeline: %s\n", rank, preset, piped.message);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0 && !alone.failed && !piped.failed) {
        size_t n = (size_t)STEPS * SEQS * alone.vocab;
        CHECK(memcmp(alone.picked, piped.picked, sizeof alone.picked) == 0);
        CHECK(memcmp(alone.logits, piped.logits, n * sizeof(float)) == 0);
        float top = 0;
        for (size_t i = 0; i < n; i++)
            top = alone.logits[i] > top ? alone.logits[i] : top;
        CHECK(top > 0.01f); /* logits were written */
        printf("%s: %d steps of %d sequences over %d ranks, tokens and logits as alone (largest "
               "logit %.4f)\n",
               preset, STEPS, SEQS, size, top);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    free(alone.logits), free(piped.logits);
}

/* Stages out of the model refused; on two ranks or more, a model set to
 * all its layers, never a rank's share then, refused by wl_batch_link. */
static void *wrong_stage_task(void *arg)
{
    const char *dir = arg;
    wl_model m;
    wl_kv kv = {0};
    wl_batch *b = NULL;
    wl_link *l = NULL;
    if (wl_model_open(&m, dir)) {
        CHECK(!"the model opens");
        return NULL;
    }
    CHECK(wl_model_set_stage(&m, 0, m.cfg.layers + 1) != 0); /* past the model */
    CHECK(wl_model_set_stage(&m, 1, 1) != 0);                /* empty */
    CHECK(wl_model_whole(&m));
    if (size > 1 && wl_link_open(&l, weft_runtime_current()) == 0) {
        CHECK(wl_model_upload(&m) == 0 && wl_kv_create(&kv, &m, PAGES, WL_KV_PAGE) == 0);
        CHECK(wl_batch_create(&b, &m, &kv, SEQS, MAX_TOKENS, CHUNK) == 0);
        CHECK(b && wl_batch_link(b, l) != 0 && strstr(wl_error(), "its model is set to"));
        wl_batch_destroy(b);
        wl_kv_destroy(&kv);
        wl_link_close(l);
    }
    wl_model_release(&m);
    wl_model_close(&m);
    return NULL;
}

int main(int argc, char **argv)
{
    (void)argc, (void)argv;
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "rank %d: MPI gives thread level %d, not MULTIPLE\n", rank, provided);
        MPI_Finalize();
        return 1;
    }
    /* rank 0's seed and scratch folder, the models written there once */
    uint64_t seed = 0;
    char dir[256] = "";
    static const char *const presets[] = {"tiny", "moe", "qwen2moe"};
    if (rank == 0) {
        const char *s = getenv("WEFT_TEST_SEED");
        seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
        printf("seed %llu (WEFT_TEST_SEED=%llu repeats it), %d ranks\n", (unsigned long long)seed,
               (unsigned long long)seed, size);
        char tmpl[] = "/tmp/weft-llm-pipeline-XXXXXX";
        if (mkdtemp(tmpl))
            snprintf(dir, sizeof dir, "%s", tmpl);
        for (size_t i = 0; dir[0] && i < sizeof presets / sizeof *presets; i++) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s", dir, presets[i]);
            wl_write_opts o = {.preset = presets[i], .seed = seed};
            if (wl_write_random_model(path, &o)) {
                fprintf(stderr, "rank 0: %s: %s\n", presets[i], wl_error());
                dir[0] = 0;
            }
        }
    }
    MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    CHECK(dir[0]);
    for (size_t i = 0; dir[0] && i < sizeof presets / sizeof *presets; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, presets[i]);
        wl_model m;
        int layers = 0;
        if (wl_model_open(&m, path) == 0) {
            layers = m.cfg.layers;
            wl_model_close(&m);
        }
        CHECK(layers > 0);
        check_preset(path, presets[i], layers, seed);
    }
    if (dir[0]) { /* refusals, on the tiny model */
        char path[512];
        snprintf(path, sizeof path, "%s/tiny", dir);
        weft_runtime *rt;
        weft_config cfg = WEFT_CONFIG_INIT;
        cfg.backend = WEFT_BACKEND_HOST;
        cfg.stack_size = 1 << 20;
        weft_task *t;
        if (weft_runtime_create(&rt, &cfg) == WEFT_OK) {
            CHECK(weft_spawn(rt, &t, wrong_stage_task, path, NULL) == WEFT_OK &&
                  weft_join(t, NULL) == WEFT_OK);
            weft_runtime_destroy(rt);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0 && dir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", dir);
    }
    int mine = atomic_load(&failures), all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("%s: %d failed checks over %d ranks\n", all ? "FAILED" : "passed", all, size);
    MPI_Finalize();
    return all ? 1 : 0;
}
