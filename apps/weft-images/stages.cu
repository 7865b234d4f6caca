/*
 * stages.cu - the CUDA kernels of weft-images.
 *
 * One kernel per stage (stages.h), each calling the same per-element
 * functions as its host version, so the results are bit-identical. Sums
 * are integers: the order in which threads and atomics add them does not
 * matter. The kernels take the frame by value; wi_cuda_plan gives their
 * launch shapes to whoever enqueues them (weft_launch in weft-images,
 * cudaLaunchKernel in the thread-pool peer).
 */
#include "stages.h"

namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kMaxBlocks = 1024; /* grid-stride beyond */
constexpr unsigned kTile = 16;        /* 2-D blocks of kTile x kTile */

__global__ void luma_hist(wi_frame f)
{
    __shared__ uint32_t bins[WI_HIST_BINS];
    for (unsigned i = threadIdx.x; i < WI_HIST_BINS; i += blockDim.x)
        bins[i] = 0;
    __syncthreads();
    size_t n = (size_t)f.width * f.height;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint8_t *px = f.rgb + 3 * i;
        uint8_t r = px[0], g = px[1], b = px[2];
        f.luma[i] = wi_luma(r, g, b);
        atomicAdd(&bins[wi_hist_bin(r, g, b)], 1u);
    }
    __syncthreads();
    for (unsigned i = threadIdx.x; i < WI_HIST_BINS; i += blockDim.x)
        if (bins[i])
            atomicAdd(&f.result->histogram[i], bins[i]);
}

__global__ void blur_rows(wi_frame f)
{
    uint32_t x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < f.width && y < f.height)
        f.rows[(size_t)y * f.width + x] = wi_blur_row_at(f.luma, f.width, x, y);
}

__global__ void blur_cols(wi_frame f)
{
    uint32_t x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < f.width && y < f.height)
        f.blur[(size_t)y * f.width + x] = wi_blur_col_at(f.rows, f.width, f.height, x, y);
}

/* One block per output cell: the threads sum its span, then a tree. */
__global__ void shrink(wi_frame f)
{
    __shared__ unsigned long long part[kThreads];
    uint32_t x0, x1, y0, y1;
    wi_cell_span(blockIdx.x, f.width, &x0, &x1);
    wi_cell_span(blockIdx.y, f.height, &y0, &y1);
    uint32_t cw = x1 - x0;
    uint64_t count = (uint64_t)cw * (y1 - y0), sum = 0;
    for (uint64_t i = threadIdx.x; i < count; i += blockDim.x) {
        uint32_t x = x0 + (uint32_t)(i % cw), y = y0 + (uint32_t)(i / cw);
        sum += f.blur[(size_t)y * f.width + x];
    }
    part[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half)
            part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        f.small[blockIdx.y * WI_SIDE + blockIdx.x] = wi_cell_mean(part[0], count);
}

/* One block of 64 threads: thread i owns coefficient i. */
__global__ void dct_hash(wi_frame f, wi_basis basis)
{
    __shared__ uint32_t small[WI_SIDE * WI_SIDE];
    __shared__ int64_t rowpass[WI_FREQS * WI_SIDE];
    __shared__ int64_t coef[WI_FREQS * WI_FREQS];
    __shared__ unsigned long long mid2, hash, detail;
    unsigned t = threadIdx.x;
    for (unsigned i = t; i < WI_SIDE * WI_SIDE; i += blockDim.x)
        small[i] = f.small[i];
    if (t == 0)
        mid2 = hash = detail = 0;
    __syncthreads();
    for (unsigned i = t; i < WI_FREQS * WI_SIDE; i += blockDim.x)
        rowpass[i] = wi_dct_row(&basis, small, i / WI_SIDE, i % WI_SIDE);
    __syncthreads();
    coef[t] = wi_dct_coef(&basis, rowpass, t / WI_FREQS, t % WI_FREQS);
    atomicAdd(&detail, (unsigned long long)wi_detail_term(coef[t])); /* integers: any order */
    __syncthreads();
    unsigned r = wi_rank(coef, t);
    if (r == WI_FREQS * WI_FREQS / 2 - 1 || r == WI_FREQS * WI_FREQS / 2)
        atomicAdd(&mid2, (unsigned long long)coef[t]); /* two's complement: exact */
    __syncthreads();
    uint64_t bit = wi_hash_bit(coef[t], (int64_t)mid2, t);
    if (bit)
        atomicOr(&hash, (unsigned long long)bit);
    __syncthreads();
    if (t == 0) {
        f.result->hash = hash;
        f.result->detail = detail;
    }
}

unsigned blocks_for(size_t n)
{
    size_t b = (n + kThreads - 1) / kThreads;
    return b < 1 ? 1 : b > kMaxBlocks ? kMaxBlocks : (unsigned)b;
}

void set(wi_launch *l, const void *kernel, unsigned gx, unsigned gy, unsigned bx, unsigned by)
{
    l->kernel = kernel;
    l->grid[0] = gx, l->grid[1] = gy, l->grid[2] = 1;
    l->block[0] = bx, l->block[1] = by, l->block[2] = 1;
    l->shared_bytes = 0;
}

} // namespace

extern "C" unsigned wi_cuda_plan(const wi_frame *f, const wi_basis *basis,
                                 wi_launch out[WI_STAGES])
{
    unsigned tx = (f->width + kTile - 1) / kTile, ty = (f->height + kTile - 1) / kTile;
    set(&out[0], (const void *)luma_hist, blocks_for((size_t)f->width * f->height), 1, kThreads, 1);
    set(&out[1], (const void *)blur_rows, tx, ty, kTile, kTile);
    set(&out[2], (const void *)blur_cols, tx, ty, kTile, kTile);
    set(&out[3], (const void *)shrink, WI_SIDE, WI_SIDE, kThreads, 1);
    set(&out[4], (const void *)dct_hash, 1, 1, WI_FREQS * WI_FREQS, 1);
    for (unsigned i = 0; i < WI_STAGES; i++)
        out[i].args[0] = (void *)f;
    out[4].args[1] = (void *)basis;
    return WI_STAGES;
}
