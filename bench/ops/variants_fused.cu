/*
 * variants_fused.cu - the fused bias+GELU+residual+LayerNorm's tuning
 * variants (variants_rows.cuh says what they are).
 */
#include "variants_rows.cuh"

namespace weft_ops::variants
{
namespace
{

/* The fused op (erf GELU with its bias - or without, where gelu_bias is
 * NULL - the residual, weight and bias, no sum written) in its held kernel
 * under the library's plan, with those inputs fixed at compile time (held,
 * the library's) or tested at run time (held_checked; lib_checked: the
 * library's plans, packed or not, in the checked kernels, as the library
 * took calls without the GELU bias before they were fixed too;
 * lib_moments and lib_passes: the library's plans and kernels with each
 * thread's moments merged or each warp's two passes, where the library
 * picks by dtype and values a thread (norm_held.cuh's held_stats;
 * variants_rows.cuh's run_lib); on rows
 * over a cluster held_push, and held_push_polled with every thread polling
 * the exchange's mbarrier); fixed at 8 and at 32 values a thread (held_narrow,
 * held_wide); and with rows of up to a warp's 32 values a thread held by
 * one warp, not split over warps at 16 as the library does (held_warp:
 * those of 1024); and packed at 32 values a thread (the library's on rows
 * of up to 8192) in blocks of up to 256 threads with 6 or 5 of them
 * resident an SM (packed_b6, packed_b5: 40 or 48 registers, not 64); and
 * in bf16 under the library's packed plan with fp16's GELU fit, which bf16
 * took before its shorter one (half_fit: GELU_FIT_HALF, three instructions
 * an element more). */
template <typename T>
int gelu_layernorm_variant(cudaStream_t s, const char *variant, void *out, const void *in,
                           const void *gelu_bias, const void *residual, const void *weight,
                           const void *bias, size_t rows, size_t cols)
{
    constexpr int V = vec16<T>();
    constexpr norm_mode M = NORM_GELU_ERF_LAYER;
    constexpr unsigned IO = NORM_IO_GELU_BIAS | NORM_IO_RESIDUAL | NORM_IO_WEIGHT | NORM_IO_BIAS;
    norm_params<T> p = bench_norm<T>(out, in, weight, bias, rows, cols);
    p.gelu_bias = (const T *)gelu_bias;
    p.residual = (const T *)residual;
    p.gelu = true;
    row_plan warp, plan;
    if (cols % V != 0 || !plan_held(cols, V, 16, &warp))
        return WEFT_EINVAL;
    plan = warp;
    plan_held_split_warp_rows(&plan, V, 16);
    if (strcmp(variant, "lib_checked") == 0)
        return launch_held_io<T, M, NORM_IO_CHECKED>(s, "gelu_layernorm variant", p, warp);
    if (!gelu_bias)
        return WEFT_EINVAL; /* the other variants are of the call with it */
    if (strncmp(variant, "lib_", 4) == 0)
        return run_lib<T, M, IO>("gelu_layernorm variant", s, variant, p);
    if (strcmp(variant, "held") == 0)
        return run_held("gelu_layernorm variant", s, plan, p, norm_held_for<T, M, IO>(plan.vpt));
    if (strcmp(variant, "held_checked") == 0)
        return run_held("gelu_layernorm variant", s, plan, p,
                        norm_held_for<T, M, NORM_IO_CHECKED>(plan.vpt));
    if (strcmp(variant, "held_push") == 0)
        return plan.cluster > 1 ? run_held("gelu_layernorm variant", s, plan, p,
                                           norm_held_for<T, M, IO, EXCHANGE_PUSH>(plan.vpt))
                                : WEFT_EINVAL;
    if (strcmp(variant, "held_push_polled") == 0)
        return plan.cluster > 1 ? run_held("gelu_layernorm variant", s, plan, p,
                                           norm_held_for<T, M, IO, EXCHANGE_PUSH_POLLED>(plan.vpt))
                                : WEFT_EINVAL;
    if (packed_variant(variant)) {
        if constexpr (sizeof(T) == 2)
            return run_packed<T>("gelu_layernorm variant", s, variant, p,
                                 norm_packed_for<T, M, IO, EXCHANGE_PUSH>);
        return WEFT_EINVAL;
    }
    if (strcmp(variant, "packed_b6") == 0 || strcmp(variant, "packed_b5") == 0) {
        if constexpr (sizeof(T) == 2) {
            row_plan packed;
            if (!plan_packed(cols, V, 32, &packed) || packed.tpr * packed.rpb > 256)
                return WEFT_EINVAL;
            auto kernel = variant[8] == '6'
                              ? lab::lab_packed_for<T, M, IO, EXCHANGE_PUSH, 1, 6>(packed.vpt)
                              : lab::lab_packed_for<T, M, IO, EXCHANGE_PUSH, 1, 5>(packed.vpt);
            return run_held("gelu_layernorm variant", s, packed, p, kernel);
        }
        return WEFT_EINVAL;
    }
    if (strcmp(variant, "half_fit") == 0) {
        if constexpr (std::is_same<T, __nv_bfloat16>::value) {
            row_plan packed;
            if (!norm_packed_plan<T, M>(rows, cols, true, false, &packed))
                return WEFT_EINVAL;
            return run_held(
                "gelu_layernorm variant", s, packed, p,
                lab::lab_packed_for<T, M, IO, EXCHANGE_PUSH, 1, 0, GELU_FIT_HALF>(packed.vpt));
        }
        return WEFT_EINVAL;
    }
    if (strcmp(variant, "held_warp") == 0) {
        if (warp.tpr == plan.tpr)
            return WEFT_EINVAL; /* nothing split: the same as held */
        return run_held("gelu_layernorm variant", s, warp, p, norm_held_for<T, M, IO>(warp.vpt));
    }
    if (!held_variant_plan(variant, cols, V, 16, &plan))
        return WEFT_EINVAL;
    return run_held("gelu_layernorm variant", s, plan, p, norm_held_for<T, M, IO>(plan.vpt));
}

} // namespace
} // namespace weft_ops::variants

using namespace weft_ops;
using namespace weft_ops::variants;

extern "C" {

int weft_bench_gelu_layernorm_variant(void *stream, int dtype, const char *variant, void *out,
                                      const void *in, const void *gelu_bias, const void *residual,
                                      const void *weight, const void *bias, size_t rows,
                                      size_t cols)
{
    return by_dtype((weft_dtype)dtype, [&](auto t) {
        return gelu_layernorm_variant<decltype(t)>((cudaStream_t)stream, variant, out, in,
                                                   gelu_bias, residual, weight, bias, rows, cols);
    });
}
}
