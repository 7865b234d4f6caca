/*
 * main.c - a program built against an installed weft (see README.md here):
 * a hundred tasks each square their number in stream order on the device
 * (the GPU's host-function path, or the host backend), await it, and send
 * the result down a channel to a task that adds them up; then a softmax
 * from the operators' header, on the host.
 */
#include <stdint.h>
#include <stdio.h>

#include <weft.h>
#include <weft/ops.h>

enum { JOBS = 100 };

static weft_chan *results;

static void square(void *arg)
{
    int64_t *v = arg;
    *v *= *v;
}

static void *job(void *arg)
{
    int64_t v = (int64_t)(intptr_t)arg;
    if (weft_host_async(square, &v) != WEFT_OK || weft_await() != WEFT_OK)
        return (void *)1;
    return weft_chan_send(results, &v) == WEFT_OK ? NULL : (void *)1;
}

static void *adder(void *arg)
{
    int64_t *sum = arg, v;
    for (int i = 0; i < JOBS; i++) {
        if (weft_chan_recv(results, &v) != WEFT_OK)
            return (void *)1;
        *sum += v;
    }
    return NULL;
}

int main(void)
{
    weft_runtime *rt;
    weft_task *jobs[JOBS], *total;
    int64_t sum = 0;
    void *failed = NULL;
    weft_task_opts named = WEFT_TASK_OPTS_INIT;

    named.name = "adder";
    if (weft_runtime_create(&rt, NULL) != WEFT_OK || weft_chan_create(&results, sizeof sum, 8)) {
        fprintf(stderr, "consumer: %s\n", weft_last_error());
        return 1;
    }
    weft_spawn(rt, &total, adder, &sum, &named);
    named.name = "job";
    for (int i = 0; i < JOBS; i++)
        weft_spawn(rt, &jobs[i], job, (void *)(intptr_t)(i + 1), &named);
    for (int i = 0; i < JOBS; i++) {
        void *r = NULL;
        if (weft_join(jobs[i], &r) != WEFT_OK || r)
            failed = (void *)1;
    }
    if (weft_join(total, &failed) != WEFT_OK)
        failed = (void *)1;
    printf("consumer: %d jobs on the %s backend, sum of squares %lld\n", JOBS,
           weft_backend_name(rt), (long long)sum);
    weft_chan_destroy(results);
    weft_runtime_destroy(rt);

    float logits[4] = {1, 2, 3, 4}, probs[4];
    float prob_sum = 0;
    if (weft_softmax(NULL, WEFT_DTYPE_F32, probs, logits, 1, 4, 4, NULL) != WEFT_OK) {
        fprintf(stderr, "consumer: %s\n", weft_last_error());
        return 1;
    }
    for (int i = 0; i < 4; i++)
        prob_sum += probs[i];
    int softmax_ok = prob_sum > 0.999999f && prob_sum < 1.000001f && probs[3] > probs[0];
    return !failed && softmax_ok && sum == (int64_t)JOBS * (JOBS + 1) * (2 * JOBS + 1) / 6 ? 0 : 1;
}
