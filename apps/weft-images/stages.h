/*
 * stages.h - the per-image device work of weft-images, and its arithmetic.
 *
 * Five stages turn an RGB image into a 64-bit perceptual hash and a colour
 * histogram:
 *
 *   luma_hist   RGB -> 8-bit luminance; 64-bin colour histogram (4 levels
 *               per channel)
 *   blur_rows   5-tap binomial blur (1 4 6 4 1) along rows, edges clamped
 *   blur_cols   the same along columns: a Gaussian of sigma 1
 *   shrink      area average down to 32x32 (every source pixel counts once)
 *   dct_hash    2-D DCT-II of the 32x32 block, the 8x8 frequencies (1..8,
 *               1..8) compared with their median: one bit each; and the
 *               sum of their magnitudes (the detail), which the hash
 *               throws away: a faint pattern and a strong one with the
 *               same signs have the same hash, not the same detail
 *
 * Every stage is integer arithmetic (fixed-point weights, exact sums), and
 * the per-element functions below are the same code on both sides: the
 * CUDA kernels (stages.cu) and the host versions (stages_host.c) call them
 * in the same order. So the GPU and the host give bit-identical results by
 * construction, with no floating point to contract or reorder.
 *
 * Fixed-point scales: luminance 0..255; after the row pass x16 (<= 4080);
 * after the column pass x256 (<= 65280, fits 16 bits); the DCT basis is
 * cos() x 4096 in 16 bits; coefficients fit comfortably in 64 bits
 * (|C| < 32 * 4096 * 32 * 4096 * 65280 < 2^60).
 */
#ifndef WEFT_IMAGES_STAGES_H
#define WEFT_IMAGES_STAGES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define WI_HD __host__ __device__ static inline
#else
#define WI_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum {
    WI_SIDE = 32,        /* the shrunken image is WI_SIDE x WI_SIDE */
    WI_FREQS = 8,        /* frequencies 1..8 in each direction: 64 bits */
    WI_HIST_BINS = 64,   /* 4 x 4 x 4 colour levels */
    WI_BASIS_ONE = 4096, /* the fixed-point 1.0 of the DCT basis */
};

/* What the device work produces for one image; downloaded in one copy.
 * detail is sum |C(u, v)| over the hashed coefficients in the raw fixed
 * point (< 64 * 2^50: the bound above is loose by 2^10); wi_detail_levels
 * turns it into luminance levels. */
typedef struct wi_result {
    uint64_t hash;
    uint64_t detail;
    uint32_t histogram[WI_HIST_BINS];
} wi_result;

/* DCT-II basis rows for frequencies 1..WI_FREQS: row k-1 holds
 * round(4096 * cos((2x + 1) k pi / 64)) for x = 0..31. Built once by the
 * host and passed to the kernel by value. */
typedef struct wi_basis {
    int16_t c[WI_FREQS][WI_SIDE];
} wi_basis;

/* Exact quarter-wave symmetry, so that every row sums to exactly zero: a
 * flat image gives all-zero coefficients on any machine. */
void wi_basis_init(wi_basis *b);

/* The buffers of one image on the device (or, with the host backend, in
 * host memory), carved from one allocation by wi_frame_carve. */
typedef struct wi_frame {
    uint32_t width, height;
    const uint8_t *rgb;    /* width * height * 3, uploaded */
    uint8_t *luma;         /* width * height */
    uint16_t *rows;        /* after the row pass */
    uint16_t *blur;        /* after the column pass */
    uint32_t *small;       /* WI_SIDE * WI_SIDE */
    wi_result *result;     /* zeroed before luma_hist */
    const wi_basis *basis; /* host stages only: the kernels get it by value */
} wi_frame;

/* Bytes of device memory an image of w x h needs. */
size_t wi_frame_bytes(uint32_t w, uint32_t h);
/* Point f's buffers into base (wi_frame_bytes(w, h) bytes). */
void wi_frame_carve(wi_frame *f, void *base, uint32_t w, uint32_t h);

/* ---- the arithmetic, shared by kernels and host versions ---------------- */

WI_HD uint8_t wi_luma(uint8_t r, uint8_t g, uint8_t b)
{
    return (uint8_t)((77u * r + 150u * g + 29u * b + 128u) >> 8); /* BT.601, weights sum 256 */
}

WI_HD unsigned wi_hist_bin(uint8_t r, uint8_t g, uint8_t b)
{
    return (unsigned)(r >> 6) << 4 | (unsigned)(g >> 6) << 2 | (unsigned)(b >> 6);
}

WI_HD uint32_t wi_clamp_index(int64_t i, uint32_t n)
{
    return i < 0 ? 0u : i >= (int64_t)n ? n - 1 : (uint32_t)i;
}

/* The 5-tap binomial filter along a line of n samples, at i; stride
 * steps between samples (1 for rows, the width for columns). */
#define WI_TAP5(src, n, i, stride)                                                                 \
    ((uint32_t)(src)[(size_t)wi_clamp_index((int64_t)(i)-2, n) * (stride)] +                       \
     4u * (src)[(size_t)wi_clamp_index((int64_t)(i)-1, n) * (stride)] +                            \
     6u * (src)[(size_t)(i) * (stride)] +                                                          \
     4u * (src)[(size_t)wi_clamp_index((int64_t)(i) + 1, n) * (stride)] +                          \
     (src)[(size_t)wi_clamp_index((int64_t)(i) + 2, n) * (stride)])

WI_HD uint16_t wi_blur_row_at(const uint8_t *luma, uint32_t w, uint32_t x, uint32_t y)
{
    const uint8_t *line = luma + (size_t)y * w;
    return (uint16_t)WI_TAP5(line, w, x, 1);
}

WI_HD uint16_t wi_blur_col_at(const uint16_t *rows, uint32_t w, uint32_t h, uint32_t x, uint32_t y)
{
    const uint16_t *col = rows + x;
    return (uint16_t)WI_TAP5(col, h, y, w);
}

/* The source span [*lo, *hi) of output cell i of WI_SIDE over n samples:
 * never empty, so images smaller than WI_SIDE repeat samples. */
WI_HD void wi_cell_span(uint32_t i, uint32_t n, uint32_t *lo, uint32_t *hi)
{
    *lo = (uint32_t)((uint64_t)i * n / WI_SIDE);
    *hi = (uint32_t)((uint64_t)(i + 1) * n / WI_SIDE);
    if (*hi <= *lo)
        *hi = *lo + 1;
}

/* The rounded mean of a cell, given its sum and pixel count. */
WI_HD uint32_t wi_cell_mean(uint64_t sum, uint64_t count)
{
    return (uint32_t)((sum + count / 2) / count);
}

/* Row pass of the DCT: R[k][y] = sum_x basis[k][x] * small[y][x]. */
WI_HD int64_t wi_dct_row(const wi_basis *b, const uint32_t *small, unsigned k, unsigned y)
{
    int64_t sum = 0;
    for (unsigned x = 0; x < WI_SIDE; x++)
        sum += (int64_t)b->c[k][x] * small[y * WI_SIDE + x];
    return sum;
}

/* Column pass: C[u][v] = sum_y basis[u][y] * R[v][y]; rowpass is
 * WI_FREQS x WI_SIDE. */
WI_HD int64_t wi_dct_coef(const wi_basis *b, const int64_t *rowpass, unsigned u, unsigned v)
{
    int64_t sum = 0;
    for (unsigned y = 0; y < WI_SIDE; y++)
        sum += (int64_t)b->c[u][y] * rowpass[v * WI_SIDE + y];
    return sum;
}

/* Position of coefficient i among the 64 in ascending order (ties broken by
 * index): a total order, so ranks 31 and 32 are the two middle values. */
WI_HD unsigned wi_rank(const int64_t *coef, unsigned i)
{
    unsigned r = 0;
    for (unsigned j = 0; j < WI_FREQS * WI_FREQS; j++)
        r += coef[j] < coef[i] || (coef[j] == coef[i] && j < i);
    return r;
}

/* Bit of coefficient i (row-major over u, v): set when above the median,
 * mid2 being the sum of the two middle values. The first coefficient is
 * the hash's most significant bit, so its hex reads in coefficient order. */
WI_HD uint64_t wi_hash_bit(int64_t c, int64_t mid2, unsigned i)
{
    return 2 * c > mid2 ? (uint64_t)1 << (WI_FREQS * WI_FREQS - 1 - i) : 0;
}

/* What coefficient c adds to the detail: its magnitude. */
WI_HD uint64_t wi_detail_term(int64_t c)
{
    return c < 0 ? (uint64_t)0 - (uint64_t)c : (uint64_t)c;
}

/* A raw coefficient is 4096^2 (basis) x 256 (blur) x 16 (the orthonormal
 * DCT's 2/32 per direction) = 2^36 times its orthonormal value in
 * luminance levels; over 64 of them the mean magnitude is detail / 2^42. */
static inline double wi_detail_levels(uint64_t detail)
{
    return (double)detail / 4398046511104.0; /* 2^42 */
}

/* ---- running the stages ------------------------------------------------- */

/* Host versions, in stream order (weft_host_async takes them as they are):
 * arg is a wi_frame. */
void wi_host_luma_hist(void *frame);
void wi_host_blur_rows(void *frame);
void wi_host_blur_cols(void *frame);
void wi_host_shrink(void *frame);
void wi_host_dct_hash(void *frame);

/* One kernel launch: what weft_launch and cudaLaunchKernel both take. */
typedef struct wi_launch {
    const void *kernel;
    unsigned grid[3], block[3];
    size_t shared_bytes;
    void *args[2];
} wi_launch;

enum { WI_STAGES = 5 };

/* The launches of the five stages for f, in order. Every kernel takes the
 * frame by value (and the last one the basis too): args point at *f and
 * *basis, which must stay put until the launches are enqueued. Returns 0
 * when this build has no kernels (no CUDA), else WI_STAGES. */
unsigned wi_cuda_plan(const wi_frame *f, const wi_basis *basis, wi_launch out[WI_STAGES]);

#ifdef __cplusplus
}
#endif

#endif
