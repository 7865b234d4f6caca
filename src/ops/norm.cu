/*
 * norm.cu - LayerNorm, RMSNorm and bias+GELU+residual+LayerNorm on the GPU
 * (norm.c holds the checks and the host reference).
 *
 * The three share their kernels: they differ only in how the row sum s is
 * formed (in + residual, or GELU(in + gelu_bias) + residual) and whether
 * it is centred. The row is read once and kept on chip (rows.cuh says
 * how: for 16-byte aligned tensors in registers, loaded straight from
 * global memory, or for aligned rows too long to hold staged in shared
 * memory; otherwise in register tiles), s is formed and rounded to the
 * dtype there, and the statistics are taken on the kept row: in registers,
 * one reduction of moments - each thread's or each warp's count, mean and
 * squared deviations - or of RMSNorm's sum of squares (norm_held.cuh);
 * staged and in tiles, the host's corrected two-pass algorithm, the mean,
 * then the sums of the deviations and of their squares, which correct the
 * mean and the variance. Then s and the normalized row are written: two
 * or three reads an element (in, residual; the biases once per column)
 * and one or two writes, nothing else. For the fused op that is 2 reads
 * + 1 write where a framework's GELU kernel, residual add and LayerNorm
 * move 7 row-sized tensors.
 *
 * RMSNorm into FP8 (weft_rmsnorm_fp8) takes RMSNorm's path and plan -
 * planned as for an aligned out, which its FP8 out stands in for - so
 * that its statistics are those of the weft_rmsnorm call it replaces, and
 * then writes the row as weft_quantize_fp8 would from that call's output:
 * each value rounded to the dtype, the largest magnitude (one more
 * reduction), the scale, the codes (quantize.cuh). 1 byte written an
 * element where the two calls write the dtype's and read it back.
 */
#include "ops/norm_launch.cuh"

namespace weft_ops
{

/* the held path, each mode compiled in a file of its own (norm_launch.cuh),
 * and RMSNorm into FP8 with all its kernels in norm_rms_fp8.cu */
WEFT_NORM_HELD(extern, NORM_LAYER)
WEFT_NORM_HELD(extern, NORM_RMS)
WEFT_NORM_HELD(extern, NORM_GELU_ERF_LAYER)
WEFT_NORM_HELD(extern, NORM_GELU_TANH_LAYER)
WEFT_NORM_FP8_ROWS(extern)

namespace
{

template <typename T> int launch(cudaStream_t stream, const char *op, const weft__norm_args *a)
{
    norm_params<T> p = {a->fp8 ? nullptr : (T *)a->out,
                        (T *)a->sum_out,
                        (const T *)a->in,
                        (const T *)a->gelu_bias,
                        (const T *)a->residual,
                        (const T *)a->weight,
                        (const T *)a->bias,
                        a->rows,
                        a->cols,
                        a->stride,
                        a->eps,
                        a->rms != 0,
                        a->gelu != 0,
                        a->form};
    if (!a->fp8)
        return launch_norm_rows<T>(stream, op, a, p, a->out);
    constexpr int V = vec16<T>();
    auto *q = (__nv_fp8_storage_t *)a->out;
    const norm_fp8_params<T> f = {p,
                                  q,
                                  a->scales,
                                  a->out_stride,
                                  fp8_type_of(a->out_type),
                                  (uintptr_t)q % V == 0 && a->out_stride % V == 0};
    return launch_norm_rows<T>(stream, op, a, f, nullptr);
}

} // namespace
} // namespace weft_ops

extern "C" int weft__norm_cuda(void *stream, const char *op, const weft__norm_args *a)
{
    return weft_ops::by_dtype(a->dtype, [&](auto t) {
        return weft_ops::launch<decltype(t)>((cudaStream_t)stream, op, a);
    });
}
