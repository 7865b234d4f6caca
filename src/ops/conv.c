/*
 * conv.c - weft_conv2d and weft_conv2d_fold_bn: their argument checks and
 * the choice of backend.
 *
 * The fusion: a framework runs a ResNet block's convolution, BatchNorm and
 * ReLU as three passes over the activations (in inference: a convolution,
 * a per-channel scale and shift, a clamp). Folding the BatchNorm's scale
 * into the weights and its shift into a bias, once, when the model is
 * loaded, leaves one convolution whose epilogue adds the bias and clamps
 * while the tile is still in registers: on the GPU a matrix product for
 * the 1x1 convolutions (weft_matmul's epilogue), cuDNN for the rest
 * (conv_cudnn.c); on the host the output element just summed.
 *
 * Every check runs here, before either backend sees the call, so a call
 * fails with WEFT_EINVAL and a reason or runs to the end, and a call valid
 * on the host is valid on the GPU as far as weft can tell (what cuDNN
 * refuses is known only by asking it: conv_cudnn.c names it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "ops/conv.h"
#include "ops/ops_internal.h"

static const char OP[] = "weft_conv2d";
static const char FOLD[] = "weft_conv2d_fold_bn";

/* a * b, or 0 with *overflow set when it does not fit. */
static size_t mul(size_t a, size_t b, int *overflow)
{
    if (b != 0 && a > SIZE_MAX / b) {
        *overflow = 1;
        return 0;
    }
    return a * b;
}

/* The descriptor's shape, resolved into x (sizes, defaults, output size);
 * op names the caller in messages. */
static int check_shape(const char *op, const weft_conv2d_desc *desc, weft__conv_args *x)
{
    int rc;

    if (!desc)
        return weft__fail(WEFT_EINVAL, "%s: desc is NULL", op);
    for (size_t i = 0; i < sizeof desc->reserved / sizeof desc->reserved[0]; i++)
        if (desc->reserved[i] != 0)
            return weft__fail(WEFT_EINVAL, "%s: desc->reserved[%zu] is not zero", op, i);
    *x = (weft__conv_args){0};
    x->n = desc->n, x->h = desc->h, x->w = desc->w, x->c = desc->c;
    x->k = desc->k, x->r = desc->r, x->s = desc->s;
    x->stride_h = desc->stride_h ? desc->stride_h : 1;
    x->stride_w = desc->stride_w ? desc->stride_w : 1;
    x->pad_h = desc->pad_h, x->pad_w = desc->pad_w;
    x->dil_h = desc->dilation_h ? desc->dilation_h : 1;
    x->dil_w = desc->dilation_w ? desc->dilation_w : 1;
    x->groups = desc->groups ? desc->groups : 1;
    x->dtype = desc->dtype, x->act = desc->act, x->allow_tf32 = desc->allow_tf32 != 0;

    if ((rc = weft__check_dtype(op, x->dtype)) != WEFT_OK)
        return rc;
    if ((unsigned)x->act > WEFT_CONV_ACT_RELU)
        return weft__fail(WEFT_EINVAL, "%s: unknown activation %d", op, (int)x->act);
    if (x->allow_tf32 && x->dtype != WEFT_DTYPE_F32)
        return weft__fail(WEFT_EINVAL, "%s: allow_tf32 is for fp32 convolutions, not dtype %d", op,
                          (int)x->dtype);
    if (!x->n || !x->h || !x->w || !x->c || !x->k || !x->r || !x->s)
        return weft__fail(WEFT_EINVAL,
                          "%s: n, h, w, c, k, r and s must be >= 1 (n %zu h %zu w %zu c %zu k "
                          "%zu r %zu s %zu)",
                          op, x->n, x->h, x->w, x->c, x->k, x->r, x->s);
    if (x->c % x->groups != 0 || x->k % x->groups != 0)
        return weft__fail(WEFT_EINVAL, "%s: groups (%zu) must divide c (%zu) and k (%zu)", op,
                          x->groups, x->c, x->k);

    /* No tensor has sizes this large; bounding them keeps the sums below
     * (the padded input, the dilated filter) from wrapping. */
    const size_t lim = SIZE_MAX / 8;
    if (x->n > lim || x->h > lim || x->w > lim || x->c > lim || x->k > lim || x->r > lim ||
        x->s > lim || x->stride_h > lim || x->stride_w > lim || x->pad_h > lim / 4 ||
        x->pad_w > lim / 4 || x->dil_h > lim || x->dil_w > lim)
        return weft__fail(WEFT_EINVAL, "%s: a size or stride is too large", op);
    int ovf = 0;
    size_t span_h = mul(x->dil_h, x->r - 1, &ovf) + 1, span_w = mul(x->dil_w, x->s - 1, &ovf) + 1;
    if (ovf || span_h > lim || span_w > lim)
        return weft__fail(WEFT_EINVAL, "%s: the dilated filter is too large", op);
    size_t ph = x->h + 2 * x->pad_h, pw = x->w + 2 * x->pad_w;
    if (ph < span_h || pw < span_w)
        return weft__fail(WEFT_EINVAL,
                          "%s: the output size is <= 0: the dilated filter (%zu x %zu) is larger "
                          "than the padded input (%zu x %zu)",
                          op, span_h, span_w, ph, pw);
    x->oh = (ph - span_h) / x->stride_h + 1;
    x->ow = (pw - span_w) / x->stride_w + 1;

    /* Each tensor's bytes must be addressable. */
    size_t es = weft__dtype_size(x->dtype);
    mul(mul(mul(mul(x->n, x->h, &ovf), x->w, &ovf), x->c, &ovf), es, &ovf);
    mul(mul(mul(mul(x->n, x->oh, &ovf), x->ow, &ovf), x->k, &ovf), es, &ovf);
    mul(mul(mul(mul(x->k, x->r, &ovf), x->s, &ovf), x->c / x->groups, &ovf), es, &ovf);
    if (ovf)
        return weft__fail(WEFT_EINVAL, "%s: the tensors' sizes overflow", op);
    return WEFT_OK;
}

void weft__conv_key_fill(weft__conv_key *k, const weft__conv_args *a, int device)
{
    memset(k, 0, sizeof *k);
    k->device = device, k->dtype = (int)a->dtype, k->act = (int)a->act, k->tf32 = a->allow_tf32;
    k->n = a->n, k->h = a->h, k->w = a->w, k->c = a->c, k->k = a->k, k->r = a->r, k->s = a->s;
    k->stride_h = a->stride_h, k->stride_w = a->stride_w, k->pad_h = a->pad_h, k->pad_w = a->pad_w;
    k->dil_h = a->dil_h, k->dil_w = a->dil_w, k->groups = a->groups;
}

int weft_conv2d_output_size(const weft_conv2d_desc *desc, size_t *oh, size_t *ow)
{
    weft__conv_args x;
    int rc = check_shape("weft_conv2d_output_size", desc, &x);
    if (rc != WEFT_OK)
        return rc;
    if (!oh || !ow)
        return weft__fail(WEFT_EINVAL, "weft_conv2d_output_size: oh or ow is NULL");
    *oh = x.oh, *ow = x.ow;
    return WEFT_OK;
}

/* Whether [a, a + na) and [b, b + nb) (bytes) meet. */
static int overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return a && b && x < y + nb && y < x + na;
}

static int check_conv(const weft_conv2d_desc *desc, void *out, const void *in, const void *w,
                      const void *bias, weft__conv_args *x)
{
    int rc;
    if ((rc = check_shape(OP, desc, x)) != WEFT_OK)
        return rc;
    if ((rc = weft__check_ptr(OP, "out", out, 0, x->dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "in", in, 0, x->dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "w", w, 0, x->dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "bias", bias, 0, x->dtype)) != WEFT_OK)
        return rc;
    size_t es = weft__dtype_size(x->dtype);
    size_t out_b = x->n * x->oh * x->ow * x->k * es;
    if (overlap(out, out_b, in, x->n * x->h * x->w * x->c * es) ||
        overlap(out, out_b, w, x->k * x->r * x->s * (x->c / x->groups) * es) ||
        overlap(out, out_b, bias, x->k * es))
        return weft__fail(WEFT_EINVAL, "%s: out overlaps in, w or bias", OP);
    x->out = out, x->in = in, x->wt = w, x->bias = bias;
    return WEFT_OK;
}

static void run_conv_host(const void *args)
{
    weft__conv_host(args);
}

#ifdef WEFT_HAVE_CUDA
/* A 1x1 convolution of stride 1 without padding or groups: over NHWC
 * tensors, out[p][o] = act(sum_c in[p][c] w[o][c] + bias[o]) for each of
 * the n h w pixels p, a matrix product with the weights transposed. */
static int is_pointwise(const weft__conv_args *x)
{
    return x->r == 1 && x->s == 1 && x->stride_h == 1 && x->stride_w == 1 && x->pad_h == 0 &&
           x->pad_w == 0 && x->groups == 1;
}

/* That product as weft_matmul runs it, bias and ReLU in its epilogue:
 * cuBLASLt's kernels (or weft's own for a few rows), where cuDNN's legacy
 * fused call ran ResNet's 1x1 layers at 12 TFLOP/s (bench/RESULTS.md,
 * "Convolution", 2026-12-04). */
static int conv_as_matmul(void *stream, const weft__conv_args *x)
{
    weft_matmul_desc m = {.m = x->n * x->h * x->w,
                          .n = x->k,
                          .k = x->c,
                          .type = x->dtype,
                          .trans_b = 1,
                          .act = x->act == WEFT_CONV_ACT_RELU ? WEFT_MATMUL_ACT_RELU
                                                              : WEFT_MATMUL_ACT_NONE,
                          .bias = x->bias,
                          .allow_tf32 = x->allow_tf32};
    int rc = weft_matmul(stream, &m, x->out, x->in, x->wt, NULL);
    if (rc != WEFT_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", weft_last_error());
        return weft__fail(rc, "%s: a 1x1 convolution, run as a matrix product: %s", OP, why);
    }
    return WEFT_OK;
}
#endif

int weft_conv2d(void *stream, const weft_conv2d_desc *desc, void *out, const void *in,
                const void *w, const void *bias)
{
    weft__conv_args x;
    int rc;

    if ((rc = check_conv(desc, out, in, w, bias, &x)) != WEFT_OK ||
        (rc = weft__check_stream(OP, stream)) != WEFT_OK)
        return rc;
    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op(OP, &stream, run_conv_host, &x, sizeof x)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return is_pointwise(&x) ? conv_as_matmul(stream, &x) : weft__conv_cuda(stream, &x);
#endif
    weft__conv_host(&x);
    return WEFT_OK;
}

/* ---- the BatchNorm fold ---------------------------------------------------- */

static void run_fold_host(const void *args)
{
    weft__conv_fold_host(args);
}

int weft_conv2d_fold_bn(void *stream, const weft_conv2d_desc *desc, weft_dtype bn_dtype,
                        void *w_out, void *bias_out, const void *w, const void *conv_bias,
                        const void *gamma, const void *beta, const void *mean, const void *var,
                        float eps)
{
    weft__conv_args x;
    int rc;

    if ((rc = check_shape(FOLD, desc, &x)) != WEFT_OK ||
        (rc = weft__check_dtype(FOLD, bn_dtype)) != WEFT_OK)
        return rc;
    if (!(eps > 0.0f) || !isfinite(eps))
        return weft__fail(WEFT_EINVAL, "%s: eps must be > 0 and finite (%g)", FOLD, (double)eps);
    if ((rc = weft__check_ptr(FOLD, "w_out", w_out, 0, x.dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(FOLD, "bias_out", bias_out, 0, x.dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(FOLD, "w", w, 0, x.dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(FOLD, "conv_bias", conv_bias, 1, x.dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(FOLD, "gamma", gamma, 0, bn_dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(FOLD, "beta", beta, 0, bn_dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(FOLD, "mean", mean, 0, bn_dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(FOLD, "var", var, 0, bn_dtype)) != WEFT_OK ||
        (rc = weft__check_stream(FOLD, stream)) != WEFT_OK)
        return rc;
    weft__conv_fold_args f = {.dtype = x.dtype,
                              .bn_dtype = bn_dtype,
                              .k = x.k,
                              .per_k = x.r * x.s * (x.c / x.groups),
                              .eps = eps,
                              .w_out = w_out,
                              .bias_out = bias_out,
                              .w = w,
                              .conv_bias = conv_bias,
                              .gamma = gamma,
                              .beta = beta,
                              .mean = mean,
                              .var = var};
    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op(FOLD, &stream, run_fold_host, &f, sizeof f)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__conv_fold_cuda(stream, &f);
#endif
    weft__conv_fold_host(&f);
    return WEFT_OK;
}
