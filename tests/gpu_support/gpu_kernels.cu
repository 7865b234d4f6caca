/*
 * gpu_kernels.cu - the kernels of the GPU tests, and the few host helpers
 * that need CUDA itself. See gpu_kernels.h for what each one computes.
 *
 * Every kernel writes only the words it is told to, so a launch with wrong
 * dimensions or arguments shows up as poison left in the outputs. Time is
 * read from %globaltimer (nanoseconds), so spins last the same on any GPU.
 */
#include <cuda_runtime.h>

#include "gpu_kernels.h"

static __device__ uint64_t now_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ void spin_for(uint64_t ns)
{
    uint64_t start = now_ns();
    while (now_ns() - start < ns)
        __nanosleep(1000);
}

static __device__ unsigned dynamic_shared_bytes(void)
{
    unsigned n;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
    return n;
}

static __device__ unsigned global_thread(void)
{
    return blockIdx.x * blockDim.x + threadIdx.x;
}

static __device__ unsigned grid_threads(void)
{
    return gridDim.x * blockDim.x;
}

static __global__ void saxpy(unsigned n, float a, const float *x, float *y)
{
    for (unsigned i = global_thread(); i < n; i += grid_threads())
        y[i] = __fmaf_rn(a, x[i], y[i]);
}

static __global__ void affine(uint32_t *dst, const uint32_t *src, unsigned n, uint32_t a,
                              uint32_t b)
{
    for (unsigned i = global_thread(); i < n; i += grid_threads())
        dst[i] = gk_affine_ref(src[i], a, b);
}

static __global__ void scramble(uint32_t *dst, const uint32_t *src, unsigned n, uint32_t c)
{
    for (unsigned i = global_thread(); i < n; i += grid_threads())
        dst[i] = gk_scramble_ref(src[i], i, c);
}

static __global__ void spin_affine(uint32_t *dst, const uint32_t *src, unsigned n, uint32_t a,
                                   uint32_t b, uint64_t spin_ns)
{
    unsigned i = global_thread();
    uint32_t x = i < n ? src[i] : 0;

    spin_for(spin_ns);
    if (i < n)
        dst[i] = gk_affine_ref(x, a, b);
}

static __global__ void mixed_args(int8_t a, double f, uint16_t b, const uint32_t *in, int32_t c,
                                  gk_mixed m, int64_t d, float e, uint64_t *out, unsigned n,
                                  gk_echo *echo)
{
    if (global_thread() == 0) {
        echo->a = a;
        echo->f = f;
        echo->b = b;
        echo->in = in;
        echo->c = c;
        echo->m = m;
        echo->d = d;
        echo->e = e;
        echo->out = out;
        echo->n = n;
    }
    for (unsigned i = global_thread(); i < n; i += grid_threads())
        out[i] = gk_mixed_ref(in[i], i, a, f, b, c, m, d, e);
}

static __global__ void coords(uint64_t *out, gk_launch_shape *shape)
{
    unsigned block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    unsigned thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    unsigned per_block = blockDim.x * blockDim.y * blockDim.z;

    out[(uint64_t)block * per_block + thread] =
        gk_coords_ref(blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
    if (block == 0 && thread == 0) {
        shape->grid[0] = gridDim.x;
        shape->grid[1] = gridDim.y;
        shape->grid[2] = gridDim.z;
        shape->block[0] = blockDim.x;
        shape->block[1] = blockDim.y;
        shape->block[2] = blockDim.z;
        shape->dynamic_shared = dynamic_shared_bytes();
    }
}

static __global__ void reverse_shared(uint32_t *data, unsigned n, gk_launch_shape *shape)
{
    extern __shared__ uint32_t slice[];
    unsigned have = dynamic_shared_bytes();
    unsigned i = global_thread();

    if (i == 0)
        shape->dynamic_shared = have;
    if (have < blockDim.x * sizeof(uint32_t) || i >= n)
        return;
    slice[threadIdx.x] = data[i];
    __syncthreads();
    data[i] = slice[blockDim.x - 1 - threadIdx.x];
}

static __device__ uint32_t marker_word;

static __global__ void set_marker(void)
{
    marker_word = GK_MARKER_VALUE;
}

static __global__ void take_marker(uint32_t *out)
{
    out[0] = marker_word;
    marker_word = 0;
}

static __global__ void busy(uint64_t spin_ns, uint32_t *done)
{
    spin_for(spin_ns);
    __syncthreads();
    if (done && threadIdx.x == 0)
        atomicAdd(done, 1u);
}

static __global__ void wait_flag(const uint32_t *flag, uint64_t cap_ns, uint32_t *result)
{
    uint64_t start = now_ns();
    const volatile uint32_t *f = flag;

    while (*f == 0 && now_ns() - start < cap_ns)
        __nanosleep(1000);
    result[0] = *f != 0 ? 1u : 2u;
}

static __global__ void fault(uint32_t *bad)
{
    bad[threadIdx.x] = 1;
}

extern "C" {

const void *gk_saxpy(void)
{
    return (const void *)saxpy;
}

/* One round of a device-side loop: count it, and go on while the count is
 * below the limit the GPU reads. */
static __global__ void while_step(unsigned *count, const unsigned *limit,
                                  cudaGraphConditionalHandle cond)
{
    unsigned c = ++*count;
    cudaGraphSetConditional(cond, c < *limit);
}

/* Decide an IF node on the GPU: run the body when the value is odd. */
static __global__ void if_odd(const unsigned *value, cudaGraphConditionalHandle cond)
{
    cudaGraphSetConditional(cond, *value & 1u);
}

const void *gk_while_step(void)
{
    return (const void *)while_step;
}

const void *gk_if_odd(void)
{
    return (const void *)if_odd;
}

const void *gk_affine(void)
{
    return (const void *)affine;
}

const void *gk_scramble(void)
{
    return (const void *)scramble;
}

const void *gk_spin_affine(void)
{
    return (const void *)spin_affine;
}

const void *gk_mixed_args(void)
{
    return (const void *)mixed_args;
}

const void *gk_coords(void)
{
    return (const void *)coords;
}

const void *gk_reverse_shared(void)
{
    return (const void *)reverse_shared;
}

const void *gk_set_marker(void)
{
    return (const void *)set_marker;
}

const void *gk_take_marker(void)
{
    return (const void *)take_marker;
}

const void *gk_busy(void)
{
    return (const void *)busy;
}

const void *gk_wait_flag(void)
{
    return (const void *)wait_flag;
}

const void *gk_fault(void)
{
    return (const void *)fault;
}

int gk_gpu_count(void)
{
    int n = 0;

    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

const char *gk_error_name(int err)
{
    return cudaGetErrorName((cudaError_t)err);
}

int gk_forbidden_during_capture(void **ptr)
{
    cudaError_t e = cudaMalloc(ptr, 4096);
    if (e == cudaSuccess) {
        cudaFree(*ptr);
        *ptr = NULL;
        return 0;
    }
    cudaGetLastError();
    return (int)e;
}

int gk_stream_device(void *stream)
{
    int dev = -1;

    if (cudaStreamGetDevice((cudaStream_t)stream, &dev) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return dev;
}

int gk_pointer_kind(const void *ptr, void **device_alias)
{
    cudaPointerAttributes attr;

    if (device_alias)
        *device_alias = NULL;
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    if (device_alias)
        *device_alias = attr.devicePointer;
    switch (attr.type) {
    case cudaMemoryTypeUnregistered:
        return GK_MEM_PAGEABLE;
    case cudaMemoryTypeHost:
        return GK_MEM_PINNED;
    case cudaMemoryTypeDevice:
        return GK_MEM_DEVICE;
    case cudaMemoryTypeManaged:
        return GK_MEM_MANAGED;
    }
    return -1;
}

/* weft keeps each worker thread's current device; put it back after. */
int gk_launch_spin_affine_on(void *stream, uint32_t *dst, const uint32_t *src, unsigned n,
                             uint32_t a, uint32_t b, uint64_t spin_ns)
{
    cudaStream_t s = (cudaStream_t)stream;
    int dev = gk_stream_device(stream), prev = -1;
    cudaError_t e;

    if (dev < 0)
        return (int)cudaErrorInvalidResourceHandle;
    if ((e = cudaGetDevice(&prev)) != cudaSuccess || (e = cudaSetDevice(dev)) != cudaSuccess)
        return (int)e;
    spin_affine<<<(n + 255) / 256, 256, 0, s>>>(dst, src, n, a, b, spin_ns);
    e = cudaGetLastError();
    cudaSetDevice(prev);
    return (int)e;
}

int gk_launch_affine_on(void *stream, uint32_t *dst, const uint32_t *src, unsigned n, uint32_t a,
                        uint32_t b)
{
    spin_affine<<<(n + 255) / 256, 256, 0, (cudaStream_t)stream>>>(dst, src, n, a, b, 0);
    return (int)cudaGetLastError();
}

unsigned gk_busy_blocks_to_fill(unsigned threads)
{
    int dev = 0, sms = 0, per_sm = 0;

    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, busy, (int)threads, 0) !=
            cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return (unsigned)sms * (unsigned)per_sm;
}

} /* extern "C" */
