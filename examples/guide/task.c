/*
 * task.c - the README's first program ("A task"): a thousand tasks each
 * copy an array in stream order, square it with a host function in the
 * same stream, await, and print one value. Either backend: these device
 * calls (copies, host functions, await) need no GPU. The README quotes
 * this file as it is, so it keeps the README's layout.
 */
// clang-format off
#include <stdint.h>
#include <stdio.h>
#include <weft.h>

static void square(void *arg) {            /* runs in stream order */
    int *v = arg;
    for (int i = 0; i < 1024; i++) v[i] *= v[i];
}

static void *job(void *arg) {
    int in[1024], out[1024];               /* the task's own stack */
    for (int i = 0; i < 1024; i++) in[i] = i + (int)(intptr_t)arg;
    weft_memcpy_async(out, in, sizeof in); /* enqueue on this task's stream */
    weft_host_async(square, out);
    if (weft_await() != WEFT_OK)           /* suspends; the worker runs others */
        return NULL;
    printf("job %d: %d\n", (int)(intptr_t)arg, out[1]);
    return NULL;
}

int main(void) {
    weft_runtime *rt;
    weft_task *jobs[1000];
    weft_runtime_create(&rt, NULL);        /* one worker per core */
    for (int i = 0; i < 1000; i++)
        weft_spawn(rt, &jobs[i], job, (void *)(intptr_t)i, NULL);
    for (int i = 0; i < 1000; i++)
        weft_join(jobs[i], NULL);
    return weft_runtime_destroy(rt);
}
