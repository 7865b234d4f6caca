/*
 * pipeline.c - the guide's pipeline (docs/guide.md, "Writing a pipeline"):
 * for each item, host work, copy in, a kernel, copy out, host work again,
 * one task per item, at most IN_FLIGHT items holding memory at once.
 *
 * The kernel is in filter.cu (built by nvcc). weft_launch needs the CUDA
 * backend: on the host backend, which runs no kernels, each task enqueues
 * the kernel's host version with weft_host_async in its place, in the same
 * stream order, and everything else is the same calls on either backend.
 * Each item's result is checked against the same arithmetic done here.
 * `pipeline --trace FILE` records the items' part of the run (the guide's
 * "Tracing").
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <weft.h>

enum { N = 1 << 16, IN_FLIGHT = 16, ITEMS = 64 };

typedef struct slot { /* what one item in flight needs */
    float *in, *out;  /* pinned host memory: fast copies */
    float *dev;       /* device memory */
} slot;

typedef struct pipeline {
    weft_chan *free; /* numbers of the slots not in use */
    slot slots[IN_FLIGHT];
} pipeline;

typedef struct item {
    pipeline *p;
    unsigned id;
    int failed;
} item;

const void *filter_kernel(void); /* the address of a __global__ function (filter.cu) */

static int on_gpu; /* the runtime's backend is "cuda": kernels can be launched */

/* The kernel's arithmetic on the host: its stand-in on the host backend. */
typedef struct filter_args {
    float *data;
    unsigned n;
} filter_args;

static void filter_host(void *arg)
{
    filter_args *f = arg;
    for (unsigned i = 0; i < f->n; i++)
        f->data[i] = f->data[i] * 0.5f + 1.0f;
}

/* Host work before and after: here, make the item's input and check its
 * output (a real program would read and write files, with weft_blocking). */
static void load_and_preprocess(unsigned id, float *in, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        in[i] = (float)((id * 7 + i) % 1024);
}

static int postprocess(unsigned id, const float *out, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        if (out[i] != (float)((id * 7 + i) % 1024) * 0.5f + 1.0f)
            return -1;
    return 0;
}

static void *process(void *arg)
{
    item *it = arg;
    unsigned k;
    int rc;
    if ((rc = weft_chan_recv(it->p->free, &k))) /* wait for a free slot */
        return NULL;
    slot *s = &it->p->slots[k];

    load_and_preprocess(it->id, s->in, N); /* host work */
    unsigned n = N;
    void *args[] = {&s->dev, &n};
    filter_args host_args = {s->dev, n}; /* read by filter_host until the await */
    weft_dim3 grid = {N / 256, 1, 1}, block = {256, 1, 1};
    if ((rc = weft_memcpy_async(s->dev, s->in, N * sizeof(float))) ||
        (rc = on_gpu ? weft_launch(filter_kernel(), grid, block, 0, args)
                     : weft_host_async(filter_host, &host_args)) ||
        (rc = weft_memcpy_async(s->out, s->dev, N * sizeof(float))) ||
        (rc = weft_await())) /* suspends; the worker moves on */
        fprintf(stderr, "item %u: %s\n", it->id, weft_last_error());
    else
        rc = postprocess(it->id, s->out, N); /* host work again */
    it->failed = rc != 0;

    weft_chan_send(it->p->free, &k); /* give the slot back */
    return NULL;
}

static void *setup(void *arg) /* device memory comes from a task */
{
    pipeline *p = arg;
    for (unsigned k = 0; k < IN_FLIGHT; k++)
        weft_malloc_async((void **)&p->slots[k].dev, N * sizeof(float));
    return (void *)(intptr_t)weft_await();
}

static void *teardown(void *arg) /* and goes back from one */
{
    pipeline *p = arg;
    for (unsigned k = 0; k < IN_FLIGHT; k++)
        weft_free_async(p->slots[k].dev);
    return (void *)(intptr_t)weft_await();
}

/* A failure of the setup: said, and the program ends. */
static int fail(const char *what)
{
    fprintf(stderr, "pipeline: %s: %s\n", what, weft_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    const char *trace_path = argc == 3 && strcmp(argv[1], "--trace") == 0 ? argv[2] : NULL;
    weft_runtime *rt;
    pipeline p = {0};
    weft_task *t;
    void *rc = NULL;
    if (weft_runtime_create(&rt, NULL) || weft_chan_create(&p.free, sizeof(unsigned), IN_FLIGHT))
        return fail("setup");
    on_gpu = strcmp(weft_backend_name(rt), "cuda") == 0;
    for (unsigned k = 0; k < IN_FLIGHT; k++) {
        if (weft_host_alloc(rt, (void **)&p.slots[k].in, N * sizeof(float)) ||
            weft_host_alloc(rt, (void **)&p.slots[k].out, N * sizeof(float)))
            return fail("pinned memory");
        weft_chan_send(p.free, &k);
    }
    if (weft_spawn(rt, &t, setup, &p, NULL) || weft_join(t, &rc) || rc)
        return fail("device memory");

    item items[ITEMS];
    weft_task *tasks[ITEMS];
    weft_task_opts opts = WEFT_TASK_OPTS_INIT;
    opts.name = "item";
    int failed = 0;
    if (trace_path && weft_trace_start(rt, trace_path) != WEFT_OK)
        fprintf(stderr, "%s\n", weft_last_error());
    for (unsigned i = 0; i < ITEMS; i++) {
        items[i] = (item){&p, i, 1};
        if (weft_spawn(rt, &tasks[i], process, &items[i], &opts))
            return fail("spawn");
    }
    for (unsigned i = 0; i < ITEMS; i++)
        if (weft_join(tasks[i], NULL) || items[i].failed)
            failed++;
    weft_trace_stop(rt); /* or let weft_runtime_destroy stop it */

    if (weft_spawn(rt, &t, teardown, &p, NULL) || weft_join(t, &rc) || rc)
        failed++;
    for (unsigned k = 0; k < IN_FLIGHT; k++) {
        weft_host_free(rt, p.slots[k].in);
        weft_host_free(rt, p.slots[k].out);
    }
    weft_chan_destroy(p.free);
    printf("pipeline: %d items through %s on the %s backend, %d failed\n", ITEMS,
           on_gpu ? "the filter kernel" : "the filter's host version", weft_backend_name(rt),
           failed);
    return weft_runtime_destroy(rt) || failed;
}
