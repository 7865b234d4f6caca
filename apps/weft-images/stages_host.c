/*
 * stages_host.c - the host versions of the kernels, and the frame layout.
 *
 * Each function runs one stage over a whole image with the same
 * per-element arithmetic as its kernel (stages.h), so results are
 * bit-identical. They are plain loops: the host backend runs them on its
 * executor threads, in stream order, through weft_host_async.
 */
#include <math.h>
#include <string.h>

#include "stages.h"

enum { ALIGN = 256 }; /* every buffer starts on a fresh 256-byte boundary */

static size_t aligned(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

size_t wi_frame_bytes(uint32_t w, uint32_t h)
{
    size_t n = (size_t)w * h;
    return aligned(sizeof(wi_result)) + aligned(3 * n) + aligned(n) + 2 * aligned(2 * n) +
           aligned(sizeof(uint32_t) * WI_SIDE * WI_SIDE);
}

void wi_frame_carve(wi_frame *f, void *base, uint32_t w, uint32_t h)
{
    size_t n = (size_t)w * h;
    char *p = base;
    f->width = w;
    f->height = h;
    f->result = (wi_result *)p, p += aligned(sizeof(wi_result));
    f->rgb = (const uint8_t *)p, p += aligned(3 * n);
    f->luma = (uint8_t *)p, p += aligned(n);
    f->rows = (uint16_t *)p, p += aligned(2 * n);
    f->blur = (uint16_t *)p, p += aligned(2 * n);
    f->small = (uint32_t *)p;
}

/* cos(m pi / 64) for m = 0..32 in fixed point; every other angle the basis
 * needs folds onto these with a sign, so symmetric entries are equal to the
 * bit and each row sums to exactly zero. */
void wi_basis_init(wi_basis *b)
{
    int16_t quarter[33];
    for (int m = 0; m <= 32; m++)
        quarter[m] = (int16_t)lround(WI_BASIS_ONE * cos(m * M_PI / 64.0));
    for (int k = 1; k <= WI_FREQS; k++)
        for (int x = 0; x < WI_SIDE; x++) {
            int a = ((2 * x + 1) * k) % 128; /* angle a pi / 64, one full turn is 128 */
            if (a > 64)
                a = 128 - a; /* cos(2 pi - t) = cos t */
            b->c[k - 1][x] =
                a > 32 ? (int16_t)-quarter[64 - a] : quarter[a]; /* cos(pi - t) = -cos t */
        }
}

void wi_host_luma_hist(void *arg)
{
    const wi_frame *f = arg;
    size_t n = (size_t)f->width * f->height;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *px = f->rgb + 3 * i;
        f->luma[i] = wi_luma(px[0], px[1], px[2]);
        f->result->histogram[wi_hist_bin(px[0], px[1], px[2])]++;
    }
}

void wi_host_blur_rows(void *arg)
{
    const wi_frame *f = arg;
    for (uint32_t y = 0; y < f->height; y++)
        for (uint32_t x = 0; x < f->width; x++)
            f->rows[(size_t)y * f->width + x] = wi_blur_row_at(f->luma, f->width, x, y);
}

void wi_host_blur_cols(void *arg)
{
    const wi_frame *f = arg;
    for (uint32_t y = 0; y < f->height; y++)
        for (uint32_t x = 0; x < f->width; x++)
            f->blur[(size_t)y * f->width + x] = wi_blur_col_at(f->rows, f->width, f->height, x, y);
}

void wi_host_shrink(void *arg)
{
    const wi_frame *f = arg;
    for (uint32_t cy = 0; cy < WI_SIDE; cy++) {
        uint32_t y0, y1;
        wi_cell_span(cy, f->height, &y0, &y1);
        for (uint32_t cx = 0; cx < WI_SIDE; cx++) {
            uint32_t x0, x1;
            wi_cell_span(cx, f->width, &x0, &x1);
            uint64_t sum = 0;
            for (uint32_t y = y0; y < y1; y++)
                for (uint32_t x = x0; x < x1; x++)
                    sum += f->blur[(size_t)y * f->width + x];
            f->small[cy * WI_SIDE + cx] = wi_cell_mean(sum, (uint64_t)(y1 - y0) * (x1 - x0));
        }
    }
}

void wi_host_dct_hash(void *arg)
{
    const wi_frame *f = arg;
    int64_t rowpass[WI_FREQS * WI_SIDE], coef[WI_FREQS * WI_FREQS];
    for (unsigned k = 0; k < WI_FREQS; k++)
        for (unsigned y = 0; y < WI_SIDE; y++)
            rowpass[k * WI_SIDE + y] = wi_dct_row(f->basis, f->small, k, y);
    for (unsigned u = 0; u < WI_FREQS; u++)
        for (unsigned v = 0; v < WI_FREQS; v++)
            coef[u * WI_FREQS + v] = wi_dct_coef(f->basis, rowpass, u, v);
    int64_t mid2 = 0;
    for (unsigned i = 0; i < WI_FREQS * WI_FREQS; i++) {
        unsigned r = wi_rank(coef, i);
        if (r == WI_FREQS * WI_FREQS / 2 - 1 || r == WI_FREQS * WI_FREQS / 2)
            mid2 += coef[i];
    }
    uint64_t hash = 0, detail = 0;
    for (unsigned i = 0; i < WI_FREQS * WI_FREQS; i++) {
        hash |= wi_hash_bit(coef[i], mid2, i);
        detail += wi_detail_term(coef[i]);
    }
    f->result->hash = hash;
    f->result->detail = detail;
}

#ifndef WI_HAVE_KERNELS
unsigned wi_cuda_plan(const wi_frame *f, const wi_basis *basis, wi_launch out[WI_STAGES])
{
    (void)f, (void)basis, (void)out;
    return 0; /* built without CUDA: the host versions serve */
}
#endif
