/*
 * gpu_kernels.h - the kernels the GPU tests launch, callable from C.
 *
 * The test programs are C, like the library's users; the kernels live in
 * gpu_kernels.cu. Each gk_<name>() returns the address of a __global__
 * function for weft_launch, and its comment gives the argument list, in
 * order, that args[] must point at. The formulas a kernel computes are the
 * gk_*_ref functions below, compiled for both sides: the host checks every
 * output word against them.
 *
 * Kernels and the test programs must use the same CUDA runtime: a kernel is
 * known by the runtime it was registered with (both link cudart_static).
 */
#ifndef WEFT_GPU_KERNELS_H
#define WEFT_GPU_KERNELS_H

#include <stdint.h>

#ifdef __CUDACC__
#define GK_HD __host__ __device__
#else
#define GK_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- kernels for weft_launch ------------------------------------------- */

/* (unsigned n, float a, const float *x, float *y): y[i] = fmaf(a, x[i], y[i]).
 * Grid-stride; any grid. */
const void *gk_saxpy(void);

/* (uint32_t *dst, const uint32_t *src, unsigned n, uint32_t a, uint32_t b):
 * dst[i] = gk_affine_ref(src[i], a, b). Grid-stride; dst may equal src. */
const void *gk_affine(void);

/* (uint32_t *dst, const uint32_t *src, unsigned n, uint32_t c):
 * dst[i] = gk_scramble_ref(src[i], i, c). Grid-stride; dst may equal src. */
const void *gk_scramble(void);

/* As gk_affine, with one more argument (uint64_t spin_ns), but one word
 * per thread (launch at least n threads): each thread reads its word, spins
 * for spin_ns of GPU time, then writes. Work that starts too early reads
 * stale data; work that is waited for too briefly is not done yet. */
const void *gk_spin_affine(void);

/* A kernel with arguments of every size and alignment:
 * (int8_t a, double f, uint16_t b, const uint32_t *in, int32_t c, gk_mixed m,
 *  int64_t d, float e, uint64_t *out, unsigned n, gk_echo *echo).
 * out[i] = gk_mixed_ref(in[i], i, ...); thread 0 of block 0 stores every
 * argument as it arrived in *echo. Grid-stride. */
typedef struct gk_mixed {
    int8_t c;
    double d; /* padding before and after: layout must survive the launch */
    int16_t s;
} gk_mixed;

typedef struct gk_echo {
    int8_t a;
    double f;
    uint16_t b;
    const uint32_t *in;
    int32_t c;
    gk_mixed m;
    int64_t d;
    float e;
    uint64_t *out;
    unsigned n;
} gk_echo;

const void *gk_mixed_args(void);

/* (uint64_t *out, gk_launch_shape *shape): each thread stores
 * gk_coords_ref(block, thread) at its linear index
 * ((bz * gy + by) * gx + bx) * threads_per_block + (tz * bdy + ty) * bdx + tx;
 * thread 0 of block 0 stores gridDim and blockDim in *shape. Needs
 * coordinates that fit gk_coords_ref: block.x < 2^24, the rest < 256. */
typedef struct gk_launch_shape {
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t dynamic_shared; /* %dynamic_smem_size as the kernel saw it */
} gk_launch_shape;

const void *gk_coords(void);

/* (uint32_t *data, unsigned n, gk_launch_shape *shape): each block
 * reverses its blockDim.x-word slice of data through dynamic shared memory
 * (needs shared_bytes >= 4 * blockDim.x; with less it writes nothing and
 * sets shape->dynamic_shared only). n must be a multiple of blockDim.x. */
const void *gk_reverse_shared(void);

/* No arguments (args may be NULL): sets a device-global word to
 * GK_MARKER_VALUE. */
#define GK_MARKER_VALUE 0x5eed1e55u
const void *gk_set_marker(void);
/* (uint32_t *out): out[0] = that word; then clears it. One thread. */
const void *gk_take_marker(void);

/* (uint64_t spin_ns, uint32_t *done): every block spins for spin_ns, then
 * (if done is not NULL) adds 1 to *done. Keeps the GPU busy. */
const void *gk_busy(void);

/* (const uint32_t *flag, uint64_t cap_ns, uint32_t *result): one thread
 * spins until *flag (volatile, e.g. mapped host memory) is non-zero or
 * cap_ns have passed; result[0] = 1 if it saw the flag, 2 if it gave up. */
const void *gk_wait_flag(void);

/* (uint32_t *bad): every thread stores to bad[threadIdx.x]. With an
 * address nothing is mapped at, a fault: cudaErrorIllegalAddress. */
const void *gk_fault(void);

/* (unsigned *count, const unsigned *limit, uint64_t cond): one thread;
 * ++*count, then sets the graph condition cond to (*count < *limit). */
const void *gk_while_step(void);

/* (const unsigned *value, uint64_t cond): one thread; sets cond to *value
 * & 1. */
const void *gk_if_odd(void);

/* ---- host helpers that call CUDA directly ------------------------------ */

/* GPUs CUDA sees; 0 when there are none or no driver. Creates no context. */
int gk_gpu_count(void);

/* cudaGetErrorName of a cudaError_t. */
const char *gk_error_name(int err);

/* Launch the gk_spin_affine kernel on `stream` (a cudaStream_t from
 * weft_stream) with <<<>>>, from the calling thread, on the stream's own
 * device. Returns the cudaError_t of the launch (0: cudaSuccess). */
int gk_launch_spin_affine_on(void *stream, uint32_t *dst, const uint32_t *src, unsigned n,
                             uint32_t a, uint32_t b, uint64_t spin_ns);

/* The same kernel without the spin, on the calling thread's current
 * device: what a library does with the stream weft_stream gives. */
int gk_launch_affine_on(void *stream, uint32_t *dst, const uint32_t *src, unsigned n, uint32_t a,
                        uint32_t b);

/* A plain cudaMalloc of 4 KiB, which CUDA forbids while the calling thread
 * captures a stream: returns its cudaError_t (0 if it was allowed, in which
 * case *ptr is freed again and NULL). */
int gk_forbidden_during_capture(void **ptr);

/* The device ordinal `stream` belongs to, or -1. */
int gk_stream_device(void *stream);

/* What CUDA knows of ptr: GK_MEM_PAGEABLE (not registered with CUDA),
 * GK_MEM_PINNED (page-locked host memory), GK_MEM_DEVICE, GK_MEM_MANAGED,
 * or -1 if CUDA refuses to say. *device_alias (if not NULL) receives the
 * address kernels use for it (NULL for pageable memory). */
enum { GK_MEM_PAGEABLE = 0, GK_MEM_PINNED = 1, GK_MEM_DEVICE = 2, GK_MEM_MANAGED = 3 };
int gk_pointer_kind(const void *ptr, void **device_alias);

/* How many blocks of `threads` threads of gk_busy fill every SM of the
 * calling thread's current device (creates the context if needed). */
unsigned gk_busy_blocks_to_fill(unsigned threads);

/* ---- reference formulas ------------------------------------------------ */

static inline GK_HD uint32_t gk_affine_ref(uint32_t x, uint32_t a, uint32_t b)
{
    return x * a + b;
}

static inline GK_HD uint32_t gk_scramble_ref(uint32_t x, uint32_t i, uint32_t c)
{
    return (x ^ (x >> 7)) * c + i;
}

static inline GK_HD uint64_t gk_mix64(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

/* Bits of a float or double, exactly, on both sides. */
static inline GK_HD uint64_t gk_bits_f(float x)
{
    union {
        float f;
        uint32_t u;
    } v;
    v.f = x;
    return v.u;
}

static inline GK_HD uint64_t gk_bits_d(double x)
{
    union {
        double d;
        uint64_t u;
    } v;
    v.d = x;
    return v.u;
}

static inline GK_HD uint64_t gk_mixed_ref(uint32_t in, uint32_t i, int8_t a, double f, uint16_t b,
                                          int32_t c, gk_mixed m, int64_t d, float e)
{
    uint64_t h = gk_mix64(in, i);
    h = gk_mix64(h, (uint64_t)(int64_t)a);
    h = gk_mix64(h, gk_bits_d(f));
    h = gk_mix64(h, b);
    h = gk_mix64(h, (uint64_t)(int64_t)c);
    h = gk_mix64(h, (uint64_t)(int64_t)m.c);
    h = gk_mix64(h, gk_bits_d(m.d));
    h = gk_mix64(h, (uint64_t)(int64_t)m.s);
    h = gk_mix64(h, (uint64_t)d);
    return gk_mix64(h, gk_bits_f(e));
}

/* What gk_coords stores for one thread. */
static inline GK_HD uint64_t gk_coords_ref(uint32_t bx, uint32_t by, uint32_t bz, uint32_t tx,
                                           uint32_t ty, uint32_t tz)
{
    return (uint64_t)bx | (uint64_t)by << 24 | (uint64_t)bz << 32 | (uint64_t)tx << 40 |
           (uint64_t)ty << 48 | (uint64_t)tz << 56;
}

#ifdef __cplusplus
}
#endif

#endif
