/*
 * foreign_cudart.cu - a kernel launched through weft from a program with a
 * CUDA runtime of its own.
 *
 * Built as nvcc builds by default (-cudart static) and linked with
 * libweft.so, which launches through the shared runtime: this program's
 * kernel is registered with its own copy only, so weft_launch of it fails.
 * The failure must be WEFT_EINVAL and say what to do (-cudart shared), and
 * the task must carry on: a copy after it still works. Exits 77 (skipped)
 * without a GPU, 1 with what went wrong on stderr.
 */
#include <stdio.h>
#include <string.h>

#include "weft.h"

__global__ void fill(int *out, int value)
{
    out[threadIdx.x] = value;
}

struct outcome {
    int launch_rc;
    char message[256];
    int after_rc;
    int seen[32];
};

static void *job(void *arg)
{
    outcome *o = static_cast<outcome *>(arg);
    int *dev = NULL, value = 7;
    if (weft_malloc_async(reinterpret_cast<void **>(&dev), sizeof o->seen) != WEFT_OK)
        return NULL;
    void *args[] = {&dev, &value};
    o->launch_rc =
        weft_launch(reinterpret_cast<const void *>(fill), {1, 1, 1}, {32, 1, 1}, 0, args);
    snprintf(o->message, sizeof o->message, "%s", weft_last_error());
    o->after_rc = weft_memset_async(dev, 0, sizeof o->seen);
    if (o->after_rc == WEFT_OK)
        o->after_rc = weft_memcpy_async(o->seen, dev, sizeof o->seen);
    weft_free_async(dev);
    if (o->after_rc == WEFT_OK)
        o->after_rc = weft_await();
    return NULL;
}

int main(void)
{
    weft_config cfg = {};
    cfg.backend = WEFT_BACKEND_CUDA;
    weft_runtime *rt = NULL;
    if (weft_runtime_create(&rt, &cfg) != WEFT_OK || weft_device_count(rt) == 0) {
        printf("SKIPPED: no GPU\n");
        if (rt)
            weft_runtime_destroy(rt);
        return 77;
    }
    outcome o = {};
    o.launch_rc = 1;
    memset(o.seen, 0xff, sizeof o.seen);
    weft_task *t = NULL;
    int ok = weft_spawn(rt, &t, job, &o, NULL) == WEFT_OK && weft_join(t, NULL) == WEFT_OK;
    weft_runtime_destroy(rt);
    if (!ok || o.launch_rc != WEFT_EINVAL || !strstr(o.message, "-cudart shared")) {
        fprintf(stderr, "foreign_cudart: launch returned %d: %s\n", o.launch_rc, o.message);
        return 1;
    }
    for (int i = 0; i < 32; i++)
        if (o.after_rc != WEFT_OK || o.seen[i] != 0) {
            fprintf(stderr, "foreign_cudart: the task did not carry on (%d, word %d = %d)\n",
                    o.after_rc, i, o.seen[i]);
            return 1;
        }
    printf("foreign_cudart: %s\n", o.message);
    return 0;
}
