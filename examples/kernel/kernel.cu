/*
 * kernel.cu - a program with a kernel of its own, built against an
 * installed weft (see README.md here).
 *
 * Each of 64 tasks takes a slice of x, and in stream order copies it to the
 * device, launches saxpy on it (y = a * x + y), copies y back and awaits;
 * then it checks its slice against the same arithmetic on the host. The
 * kernel must be registered with the CUDA runtime weft launches through:
 * build with nvcc -cudart shared against libweft.so, or link libweft.a
 * (which carries the static runtime) with nvcc's default.
 *
 * Without a GPU the runtime falls back to the host backend, which runs no
 * kernels: each task then enqueues the kernel's host version with
 * weft_host_async in the launch's place, and the rest is unchanged.
 */
#include <stdio.h>
#include <string.h>

#include <weft.h>

enum { TASKS = 64, N = 4096, BLOCK = 256 };

__global__ void saxpy(float a, const float *x, float *y, unsigned n)
{
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a * x[i] + y[i];
}

/* The kernel's arithmetic on the host: the host backend's launch, and the
 * reference each task checks against. The values are small enough that
 * every product and sum is exact in float, fused or not, so the results
 * compare bit for bit. */
struct saxpy_args {
    float a;
    const float *x;
    float *y;
    unsigned n;
};

static void saxpy_host(void *arg)
{
    const saxpy_args *s = static_cast<saxpy_args *>(arg);
    for (unsigned i = 0; i < s->n; i++)
        s->y[i] = s->a * s->x[i] + s->y[i];
}

static float x_host[TASKS][N], y_host[TASKS][N];
static bool on_gpu;

static void *job(void *arg)
{
    unsigned t = (unsigned)(size_t)arg;
    float *x = NULL, *y = NULL, a = 0.5f + (float)t;
    float expect[N];
    unsigned n = N;
    void *failed = reinterpret_cast<void *>(1);

    for (unsigned i = 0; i < N; i++) {
        x_host[t][i] = (float)i;
        y_host[t][i] = (float)(t * N + i);
    }
    saxpy_args ref = {a, x_host[t], expect, N};
    memcpy(expect, y_host[t], sizeof expect);
    saxpy_host(&ref);

    if (weft_malloc_async(reinterpret_cast<void **>(&x), sizeof x_host[t]) != WEFT_OK ||
        weft_malloc_async(reinterpret_cast<void **>(&y), sizeof y_host[t]) != WEFT_OK)
        goto out;
    if (weft_memcpy_async(x, x_host[t], sizeof x_host[t]) != WEFT_OK ||
        weft_memcpy_async(y, y_host[t], sizeof y_host[t]) != WEFT_OK)
        goto out;
    {
        saxpy_args dev = {a, x, y, n};
        void *args[] = {&a, &x, &y, &n};
        int rc = on_gpu ? weft_launch(reinterpret_cast<const void *>(saxpy),
                                      {(N + BLOCK - 1) / BLOCK, 1, 1}, {BLOCK, 1, 1}, 0, args)
                        : weft_host_async(saxpy_host, &dev);
        /* dev lives on this stack until the await below: the host function
         * may read it until then */
        if (rc != WEFT_OK || weft_memcpy_async(y_host[t], y, sizeof y_host[t]) != WEFT_OK ||
            weft_await() != WEFT_OK)
            goto out;
    }
    failed = memcmp(y_host[t], expect, sizeof expect) ? reinterpret_cast<void *>(2) : NULL;
out:
    if (failed == reinterpret_cast<void *>(1))
        fprintf(stderr, "kernel: task %u: %s\n", t, weft_last_error());
    weft_free_async(x);
    weft_free_async(y);
    weft_await();
    return failed;
}

int main(void)
{
    weft_runtime *rt;
    weft_task *tasks[TASKS];
    int bad = 0;

    if (weft_runtime_create(&rt, NULL) != WEFT_OK) {
        fprintf(stderr, "kernel: %s\n", weft_last_error());
        return 1;
    }
    on_gpu = strcmp(weft_backend_name(rt), "cuda") == 0;
    for (unsigned t = 0; t < TASKS; t++)
        if (weft_spawn(rt, &tasks[t], job, reinterpret_cast<void *>((size_t)t), NULL) != WEFT_OK) {
            fprintf(stderr, "kernel: %s\n", weft_last_error());
            return 1;
        }
    for (unsigned t = 0; t < TASKS; t++) {
        void *r = NULL;
        if (weft_join(tasks[t], &r) != WEFT_OK || r)
            bad++;
    }
    if (on_gpu)
        printf("kernel: %d tasks launched saxpy on the GPU, %d results wrong\n", TASKS, bad);
    else
        printf("kernel: no GPU, so %d tasks ran saxpy's host version on the %s backend, %d "
               "results wrong\n",
               TASKS, weft_backend_name(rt), bad);
    weft_runtime_destroy(rt);
    return bad ? 1 : 0;
}
