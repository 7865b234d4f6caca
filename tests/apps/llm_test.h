/*
 * llm_test.h - what the weft-llm tests share: a scratch folder, running
 * the program with its output captured, and writing files byte for byte.
 */
#ifndef LLM_TEST_H
#define LLM_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

#include "llm.h"

static inline char *scratch_dir(void)
{
    char tmpl[] = "/tmp/weft-llm-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

static inline void remove_scratch(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

static inline char *path_in(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static inline int write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, n, f);
    return fclose(f) || w != n ? -1 : 0;
}

/* Runs a shell command; its stdout (and stderr, when err is given) into
 * malloc'd strings. Returns the exit status. */
static inline int run_capture(const char *cmd, char **out, char **err)
{
    char full[4096], errpath[] = "/tmp/weft-llm-err-XXXXXX";
    *out = NULL;
    if (err)
        *err = NULL;
    int fd = mkstemp(errpath);
    if (fd < 0)
        return -1;
    close(fd);
    snprintf(full, sizeof full, "%s 2>%s", cmd, errpath);
    FILE *p = popen(full, "r");
    if (!p)
        return -1;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t r; (r = fread(buf + n, 1, cap - n - 1, p)) > 0;) {
        n += r;
        if (n + 1 == cap)
            buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int status = pclose(p);
    *out = buf;
    if (err) {
        FILE *e = fopen(errpath, "rb");
        char *eb = calloc(1, 1 << 16);
        if (e) {
            size_t r = fread(eb, 1, (1 << 16) - 1, e);
            eb[r] = 0;
            fclose(e);
        }
        *err = eb;
    }
    unlink(errpath);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static inline uint64_t test_seed(void)
{
    const char *s = getenv("WEFT_TEST_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu (WEFT_TEST_SEED=%llu repeats it)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    return seed;
}

/* ---- the forward pass in a task ------------------------------------------- */

typedef struct fwd_job {
    wl_model *m;
    const int32_t *ids;
    int n_prompt, n_total;
    float *logits; /* [steps][vocab]: after the prompt, then after each token */
    int failed;
    char message[512]; /* the task's error line (a task may move between threads) */
    int step;          /* tokens a call after the prompt; 0 means 1 */
    wl_kv *kv;         /* the model's cache, shared; NULL: the task makes its own */
} fwd_job;

static inline void *forward_task(void *arg)
{
    fwd_job *j = (fwd_job *)arg;
    wl_seq *s = NULL;
    wl_kv own = {0}, *kv = j->kv ? j->kv : &own;
    const float *lg;
    int V = j->m->cfg.vocab;
    j->failed = 1;
    if (wl_model_upload(j->m) || (!j->kv && wl_kv_create(&own, j->m, 8, 16)) ||
        wl_seq_create(&s, j->m, kv, j->n_total) || wl_forward(s, j->ids, j->n_prompt, &lg))
        goto out;
    memcpy(j->logits, lg, (size_t)V * 4);
    int step = j->step ? j->step : 1;
    for (int t = j->n_prompt, k = 1; t < j->n_total; t += step, k++) {
        int n = j->n_total - t < step ? j->n_total - t : step;
        if (wl_forward(s, &j->ids[t], n, &lg))
            goto out;
        memcpy(j->logits + (size_t)k * V, lg, (size_t)V * 4);
    }
    j->failed = 0;
out:
    snprintf(j->message, sizeof j->message, "%s", wl_error());
    wl_seq_destroy(s);
    if (own.free_list && wl_kv_free_pages(&own) != own.pages) {
        snprintf(j->message, sizeof j->message, "the sequence kept %d pages",
                 own.pages - wl_kv_free_pages(&own));
        j->failed = 1;
    }
    wl_kv_destroy(&own);
    wl_model_release(j->m);
    return NULL;
}

/* Opens the model in dir and runs ids through it on a runtime of the given
 * backend: the prompt's n_prompt tokens at once, then step at a time up to
 * n_total. The logits after each call (poisoned with NaN first) go to
 * logits. Returns 0, or -1 with the reason in message. */
static inline int run_forward_steps(weft_backend backend, const char *dir, const int32_t *ids,
                                    int n_prompt, int n_total, int step, float *logits,
                                    char message[512])
{
    wl_model m;
    if (wl_model_open(&m, dir)) {
        snprintf(message, 512, "%s", wl_error());
        return -1;
    }
    size_t count = (size_t)(1 + (n_total - n_prompt + step - 1) / step) * m.cfg.vocab;
    for (size_t i = 0; i < count; i++)
        logits[i] = NAN; /* every logit must be written */
    fwd_job job = {&m, ids, n_prompt, n_total, logits, 1, "", step, NULL};
    weft_runtime *rt;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 2;
    cfg.backend = backend;
    cfg.stack_size = 1 << 20;
    weft_task *t;
    if (weft_runtime_create(&rt, &cfg) != WEFT_OK) {
        snprintf(message, 512, "runtime: %s", weft_last_error());
        wl_model_close(&m);
        return -1;
    }
    if (weft_spawn(rt, &t, forward_task, &job, NULL) != WEFT_OK || weft_join(t, NULL) != WEFT_OK)
        snprintf(job.message, sizeof job.message, "task: %s", weft_last_error());
    weft_runtime_destroy(rt);
    wl_model_close(&m);
    snprintf(message, 512, "%s", job.message);
    return job.failed ? -1 : 0;
}

/* The prompt, then a token at a time. */
static inline int run_forward(weft_backend backend, const char *dir, const int32_t *ids,
                              int n_prompt, int n_total, float *logits, char message[512])
{
    return run_forward_steps(backend, dir, ids, n_prompt, n_total, 1, logits, message);
}

#endif
