/*
 * variants_norms.cu - the norms' tuning variants: LayerNorm, RMSNorm,
 * add+LayerNorm (variants_rows.cuh says what they are).
 */
#include "variants_rows.cuh"

namespace weft_ops::variants
{
namespace
{

template <typename T>
int layernorm_variant(cudaStream_t s, const char *variant, void *out, const void *in,
                      const void *weight, const void *bias, size_t rows, size_t cols)
{
    constexpr int V = vec16<T>();
    const norm_params<T> p = bench_norm<T>(out, in, weight, bias, rows, cols);
    row_plan plan;
    if (cols % V != 0)
        return WEFT_EINVAL;
    if (strcmp(variant, "staged") == 0)
        return plan_staged(cols, V, 1, &plan)
                   ? launch_rows("layernorm variant", s, plan, rows, norm_staged_kernel<T, false>,
                                 p, (size_t)plan.vpt)
                   : WEFT_EINVAL;
    /* the held and ring kernels that test for each input at run time,
     * as rows of any length take them */
    if (strcmp(variant, "ring2_checked") == 0)
        return run_ring("layernorm variant", s, cols, V, sizeof(T), 16, 2, p,
                        norm_ring_for<T, NORM_LAYER, NORM_IO_CHECKED>);
    if (strcmp(variant, "held_checked") == 0)
        return plan_held(cols, V, 16, &plan)
                   ? run_held("layernorm variant", s, plan, p,
                              norm_held_for<T, NORM_LAYER, NORM_IO_CHECKED>(plan.vpt))
                   : WEFT_EINVAL;
    int rc;
    if (run_norm_shared<T, NORM_LAYER, NORM_IO_WEIGHT | NORM_IO_BIAS>("layernorm variant", s,
                                                                      variant, p, &rc))
        return rc;
    if (strcmp(variant, "ring2_packed_quads") == 0) {
        if constexpr (sizeof(T) == 2)
            return run_ring_packed(
                "layernorm variant", s, cols, V, sizeof(T), p,
                norm_ring_packed_for<T, NORM_LAYER, NORM_IO_WEIGHT | NORM_IO_BIAS>);
        return WEFT_EINVAL;
    }
    unsigned slots, values;
    if (ring_variant(variant, 16, &slots, &values))
        return run_ring("layernorm variant", s, cols, V, sizeof(T), values, slots, p,
                        norm_ring_for<T, NORM_LAYER, NORM_IO_WEIGHT | NORM_IO_BIAS>);
    if (strcmp(variant, "held_push") == 0)
        return plan_held(cols, V, 16, &plan) && plan.cluster > 1
                   ? run_held(
                         "layernorm variant", s, plan, p,
                         norm_held_for<T, NORM_LAYER, NORM_IO_WEIGHT | NORM_IO_BIAS, EXCHANGE_PUSH>(
                             plan.vpt))
                   : WEFT_EINVAL;
    if (packed_variant(variant)) {
        if constexpr (sizeof(T) == 2)
            return run_packed<T>(
                "layernorm variant", s, variant, p,
                norm_packed_for<T, NORM_LAYER, NORM_IO_WEIGHT | NORM_IO_BIAS, EXCHANGE_PUSH>);
        return WEFT_EINVAL;
    }
    if (held_variant_plan(variant, cols, V, 16, &plan))
        return run_held("layernorm variant", s, plan, p,
                        norm_held_for<T, NORM_LAYER, NORM_IO_WEIGHT | NORM_IO_BIAS>(plan.vpt));
    if (!variant_plan(variant, cols, V, &plan))
        return WEFT_EINVAL;
    return run_plan<T, V, norm_params<T>, norm_k>("layernorm variant", s, plan, p);
}

/* RMSNorm with its weight: through the ring of 2 slots (ring2, the
 * library's until it measured 7-22% slower than held_push on rows of half
 * types a block of 512 holds at 32 values, and on fp32 rows that take a
 * cluster), held at 16 values a thread with a cluster's statistics met
 * at barriers (held) or pushed (held_push: the library's where it does
 * not pack), at 8 or 32 (held_narrow, held_wide: the library's on rows of
 * half types under 8192 until 16 measured faster), and in half types
 * packed at 64 values a thread in blocks of up to 1024, 512 or 256
 * threads (held_packed64, held_packed_pairs, held_packed_quads:
 * packed_plan; the library's are quads where held takes a cluster). */
template <typename T>
int rmsnorm_variant(cudaStream_t s, const char *variant, void *out, const void *in,
                    const void *weight, size_t rows, size_t cols)
{
    constexpr int V = vec16<T>();
    constexpr unsigned IO = NORM_IO_WEIGHT;
    norm_params<T> p = bench_norm<T>(out, in, weight, NULL, rows, cols);
    p.rms = true;
    row_plan plan;
    if (cols % V != 0)
        return WEFT_EINVAL;
    if (strcmp(variant, "ring2") == 0)
        return run_ring("rmsnorm variant", s, cols, V, sizeof(T), 16, 2, p,
                        norm_ring_for<T, NORM_RMS, IO>);
    int rc;
    if (run_norm_shared<T, NORM_RMS, IO>("rmsnorm variant", s, variant, p, &rc))
        return rc;
    if (strcmp(variant, "ring2_packed_quads") == 0) {
        if constexpr (sizeof(T) == 2)
            return run_ring_packed("rmsnorm variant", s, cols, V, sizeof(T), p,
                                   norm_ring_packed_for<T, NORM_RMS, IO>);
        return WEFT_EINVAL;
    }
    if (packed_variant(variant)) {
        if constexpr (sizeof(T) == 2)
            return run_packed<T>("rmsnorm variant", s, variant, p,
                                 norm_packed_for<T, NORM_RMS, IO, EXCHANGE_PUSH>);
        return WEFT_EINVAL;
    }
    if (held_variant_plan(variant, cols, V, 16, &plan))
        return run_held("rmsnorm variant", s, plan, p, norm_held_for<T, NORM_RMS, IO>(plan.vpt));
    if (!plan_held(cols, V, 16, &plan))
        return WEFT_EINVAL;
    if (strcmp(variant, "held_push") == 0)
        return run_held("rmsnorm variant", s, plan, p,
                        norm_held_for<T, NORM_RMS, IO, EXCHANGE_PUSH>(plan.vpt));
    return WEFT_EINVAL;
}

/* LayerNorm with the residual added in front and the sum written (the
 * bench's add_layernorm; sum_out NULL for the checked variants' calls
 * without it), weight and bias: held at 16 values a thread with
 * a cluster's statistics pushed (held_push: the library's where it does
 * not pack), and in half types packed at 64 values a thread in blocks of
 * up to 1024, 512 or 256 threads (held_packed64, held_packed_pairs,
 * held_packed_quads: packed_plan; quads is the library's where held
 * takes a cluster). */
template <typename T>
int add_layernorm_variant(cudaStream_t s, const char *variant, void *out, void *sum_out,
                          const void *in, const void *residual, const void *weight,
                          const void *bias, size_t rows, size_t cols)
{
    constexpr int V = vec16<T>();
    constexpr unsigned IO = NORM_IO_RESIDUAL | NORM_IO_WEIGHT | NORM_IO_BIAS | NORM_IO_SUM_OUT;
    norm_params<T> p = bench_norm<T>(out, in, weight, bias, rows, cols);
    p.residual = (const T *)residual;
    p.sum_out = (T *)sum_out;
    row_plan plan;
    if (cols % V != 0)
        return WEFT_EINVAL;
    int rc;
    if (run_norm_shared<T, NORM_LAYER, IO>("add_layernorm variant", s, variant, p, &rc))
        return rc;
    if (packed_variant(variant)) {
        if constexpr (sizeof(T) == 2)
            return run_packed<T>("add_layernorm variant", s, variant, p,
                                 norm_packed_for<T, NORM_LAYER, IO, EXCHANGE_PUSH>);
        return WEFT_EINVAL;
    }
    if (strcmp(variant, "held_push") == 0 && plan_held(cols, V, 16, &plan))
        return run_held("add_layernorm variant", s, plan, p,
                        norm_held_for<T, NORM_LAYER, IO, EXCHANGE_PUSH>(plan.vpt));
    return WEFT_EINVAL;
}

} // namespace
} // namespace weft_ops::variants

using namespace weft_ops;
using namespace weft_ops::variants;

extern "C" {

int weft_bench_layernorm_variant(void *stream, int dtype, const char *variant, void *out,
                                 const void *in, const void *weight, const void *bias, size_t rows,
                                 size_t cols)
{
    return by_dtype((weft_dtype)dtype, [&](auto t) {
        return layernorm_variant<decltype(t)>((cudaStream_t)stream, variant, out, in, weight, bias,
                                              rows, cols);
    });
}

int weft_bench_add_layernorm_variant(void *stream, int dtype, const char *variant, void *out,
                                     void *sum_out, const void *in, const void *residual,
                                     const void *weight, const void *bias, size_t rows, size_t cols)
{
    return by_dtype((weft_dtype)dtype, [&](auto t) {
        return add_layernorm_variant<decltype(t)>((cudaStream_t)stream, variant, out, sum_out, in,
                                                  residual, weight, bias, rows, cols);
    });
}

int weft_bench_rmsnorm_variant(void *stream, int dtype, const char *variant, void *out,
                               const void *in, const void *weight, size_t rows, size_t cols)
{
    return by_dtype((weft_dtype)dtype, [&](auto t) {
        return rmsnorm_variant<decltype(t)>((cudaStream_t)stream, variant, out, in, weight, rows,
                                            cols);
    });
}
}
