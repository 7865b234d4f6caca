/*
 * conv_host.c - the host references of weft_conv2d and
 * weft_conv2d_fold_bn: the plain loops of their definitions (ops.h).
 *
 * The convolution is direct: each output element's products, over the
 * filter rows, columns and the group's input channels in that order, are
 * summed in fp32 (weft__sum's blocks, so long windows lose no more than a
 * tree would), then the bias is added, the activation applied and the
 * element rounded once. Padding is skipped, not read: it contributes zero.
 *
 * The fold computes each channel's scale as gamma / sqrt(var + eps), each
 * operation rounded to fp32 (NaN where var + eps is not > 0), which the kernel (conv_fold.cu)
 * repeats with explicitly rounded intrinsics, so both give the same bits.
 */
#include "ops/conv.h"
#include "ops/ops_internal.h"

static float act_of(weft_conv_act act, float v)
{
    return act == WEFT_CONV_ACT_RELU && !(v > 0.0f) && !isnan(v) ? 0.0f : v;
}

void weft__conv_host(const weft__conv_args *a)
{
    const size_t cg = a->c / a->groups, kg = a->k / a->groups;
    const weft_dtype t = a->dtype;

    for (size_t b = 0; b < a->n; b++)
        for (size_t y = 0; y < a->oh; y++)
            for (size_t x = 0; x < a->ow; x++)
                for (size_t o = 0; o < a->k; o++) {
                    const size_t g = o / kg;
                    weft__sum acc = {0};
                    for (size_t i = 0; i < a->r; i++) {
                        /* The input row, unsigned: the padding above wraps past h. */
                        size_t iy = y * a->stride_h + i * a->dil_h - a->pad_h;
                        if (iy >= a->h)
                            continue;
                        for (size_t j = 0; j < a->s; j++) {
                            size_t ix = x * a->stride_w + j * a->dil_w - a->pad_w;
                            if (ix >= a->w)
                                continue;
                            size_t at_in = ((b * a->h + iy) * a->w + ix) * a->c + g * cg;
                            size_t at_w = ((o * a->r + i) * a->s + j) * cg;
                            for (size_t ci = 0; ci < cg; ci++)
                                weft__sum_add(&acc, weft__load(t, a->in, at_in + ci) *
                                                        weft__load(t, a->wt, at_w + ci));
                        }
                    }
                    float v = weft__sum_get(&acc) + weft__load(t, a->bias, o);
                    size_t at_out = ((b * a->oh + y) * a->ow + x) * a->k + o;
                    weft__store(t, a->out, at_out, act_of(a->act, v));
                }
}

void weft__conv_fold_host(const weft__conv_fold_args *a)
{
    for (size_t o = 0; o < a->k; o++) {
        float d = weft__load(a->bn_dtype, a->var, o) + a->eps;
        float scale = d > 0.0f ? weft__load(a->bn_dtype, a->gamma, o) / sqrtf(d) : NAN;
        for (size_t e = 0; e < a->per_k; e++) {
            size_t i = o * a->per_k + e;
            weft__store(a->dtype, a->w_out, i, weft__load(a->dtype, a->w, i) * scale);
        }
        float b = a->conv_bias ? weft__load(a->dtype, a->conv_bias, o) : 0.0f;
        float shift = (b - weft__load(a->bn_dtype, a->mean, o)) * scale;
        weft__store(a->dtype, a->bias_out, o, weft__load(a->bn_dtype, a->beta, o) + shift);
    }
}
