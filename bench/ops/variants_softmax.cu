/*
 * variants_softmax.cu - softmax's tuning variants (variants_rows.cuh says
 * what they are).
 */
#include "variants_rows.cuh"

namespace weft_ops::variants
{
namespace
{

template <typename T>
int softmax_variant(cudaStream_t s, const char *variant, void *out, const void *in, size_t rows,
                    size_t cols)
{
    constexpr int V = vec16<T>();
    softmax_params<T> p = {(T *)out, (const T *)in, rows, cols, cols, 0, 1.0f, 0.0f, 1.0f, 0, 0};
    row_plan plan;
    if (cols % V != 0 || stats_variant(variant) != STATS_TUNED) /* those are LayerNorm's */
        return WEFT_EINVAL;
    if (strcmp(variant, "staged") == 0)
        return plan_staged(cols, V, 1, &plan)
                   ? launch_rows("softmax variant", s, plan, rows, softmax_staged_kernel<T, false>,
                                 p, (size_t)plan.vpt)
                   : WEFT_EINVAL;
    size_t window = 0, shortest = AHEAD_SHORTEST;
    unsigned split = 0; /* values a thread of lib_splitN */
    bool split_ahead = false;
    const bool pairs = strcmp(variant, "lib_pairs") == 0;
    if (strcmp(variant, "lib_no_ahead") == 0 || ahead_variant(variant, &window) ||
        strcmp(variant, "lib_short_ahead") == 0 || split_variant(variant, &split, &split_ahead) ||
        pairs) {
        /* the library's plan and kernel for these rows, asking L2 for as
         * many rows on as fill the window (softmax.cu), on short rows too
         * (lib_short_ahead), or for none: the kernel without the prefetch
         * (lib_no_ahead); or with rows a warp holds spread over more
         * warps (lib_splitN), asking on short rows too (lib_splitN_ahead);
         * or asking as the library does, in half types, with the max and
         * sum merged pairwise at every step of the reduction, as the
         * library's were before (lib_pairs) */
        constexpr softmax_stats STATS = sizeof(T) == 2 ? SOFTMAX_ONLINE : SOFTMAX_MAX_THEN_SUM;
        constexpr softmax_stats PAIRS = sizeof(T) == 2 ? SOFTMAX_ONLINE_PAIRS : STATS;
        if (pairs && sizeof(T) != 2)
            return WEFT_EINVAL;
        row_plan held;
        if (!plan_held(cols, V, 32, &held))
            return WEFT_EINVAL;
        plan = held;
        if (strcmp(variant, "lib_short_ahead") == 0) {
            if (cols >= AHEAD_SHORTEST)
                return WEFT_EINVAL;
            window = AHEAD_WINDOW;
            shortest = 0;
        } else if (split) {
            if (!split_plan(split, held, V, &plan))
                return WEFT_EINVAL;
            window = AHEAD_WINDOW;
            shortest = split_ahead ? 0 : AHEAD_SHORTEST;
        } else if (pairs) {
            window = AHEAD_WINDOW;
        } else if (!window && strcmp(variant, "lib_no_ahead") != 0) {
            return WEFT_EINVAL;
        }
        if (!window) {
            auto kernel = softmax_held_for<T, SOFTMAX_PLAIN, STATS, EXCHANGE_PUSH>(plan.vpt);
            return kernel ? launch_rows("softmax variant", s, plan, rows, kernel, p, 0)
                          : WEFT_EINVAL;
        }
        auto kernel =
            pairs ? softmax_held_for<T, SOFTMAX_PLAIN, PAIRS, EXCHANGE_PUSH, true>(plan.vpt)
                  : softmax_held_for<T, SOFTMAX_PLAIN, STATS, EXCHANGE_PUSH, true>(plan.vpt);
        const size_t lead = held_lead(plan, rows, cols, cols * sizeof(T), window, shortest);
        return kernel ? launch_rows("softmax variant", s, plan, rows, kernel, p, lead)
                      : WEFT_EINVAL;
    }
    if (strcmp(variant, "ring2_checked") == 0)
        return run_ring("softmax variant", s, cols, V, sizeof(T), 32, 2, p,
                        softmax_ring_for<T, SOFTMAX_CHECKED>);
    if (strcmp(variant, "held_checked") == 0)
        return plan_held(cols, V, 32, &plan)
                   ? run_held("softmax variant", s, plan, p,
                              softmax_held_for<T, SOFTMAX_CHECKED>(plan.vpt))
                   : WEFT_EINVAL;
    if (strcmp(variant, "held_online") == 0)
        return plan_held(cols, V, 32, &plan)
                   ? run_held("softmax variant", s, plan, p,
                              softmax_held_for<T, SOFTMAX_PLAIN, SOFTMAX_ONLINE>(plan.vpt))
                   : WEFT_EINVAL;
    if (strcmp(variant, "ring2_online") == 0)
        return run_ring("softmax variant", s, cols, V, sizeof(T), 32, 2, p,
                        softmax_ring_for<T, SOFTMAX_PLAIN, SOFTMAX_ONLINE>);
    if (strncmp(variant, "held_push", 9) == 0 || strncmp(variant, "held_online_push", 16) == 0) {
        const unsigned values = strcmp(variant, "held_online_push16") == 0 ? 16 : 32;
        const bool two = strncmp(variant, "held_push", 9) == 0;
        if (!plan_held(cols, V, values, &plan) || plan.cluster == 1)
            return WEFT_EINVAL;
        auto kernel = [&](auto x) {
            constexpr cluster_exchange X = decltype(x)::value;
            return two ? softmax_held_for<T, SOFTMAX_PLAIN, SOFTMAX_MAX_THEN_SUM, X>(plan.vpt)
                       : softmax_held_for<T, SOFTMAX_PLAIN, SOFTMAX_ONLINE, X>(plan.vpt);
        };
        using polled = std::integral_constant<cluster_exchange, EXCHANGE_PUSH_POLLED>;
        using push = std::integral_constant<cluster_exchange, EXCHANGE_PUSH>;
        return run_held("softmax variant", s, plan, p,
                        polled_variant(variant) ? kernel(polled()) : kernel(push()));
    }
    if (packed_variant(variant)) {
        if constexpr (sizeof(T) == 2)
            return run_packed<T>(
                "softmax variant", s, variant, p,
                lab::lab_softmax_packed_for<T, SOFTMAX_PLAIN, SOFTMAX_ONLINE, EXCHANGE_PUSH>);
        return WEFT_EINVAL;
    }
    unsigned slots, values;
    if (ring_variant(variant, 32, &slots, &values))
        return run_ring("softmax variant", s, cols, V, sizeof(T), values, slots, p,
                        softmax_ring_for<T, SOFTMAX_PLAIN>);
    if (held_variant_plan(variant, cols, V, 32, &plan))
        return run_held("softmax variant", s, plan, p,
                        softmax_held_for<T, SOFTMAX_PLAIN>(plan.vpt));
    if (!variant_plan(variant, cols, V, &plan))
        return WEFT_EINVAL;
    return run_plan<T, V, softmax_params<T>, softmax_k>("softmax variant", s, plan, p);
}

} // namespace
} // namespace weft_ops::variants

using namespace weft_ops;
using namespace weft_ops::variants;

extern "C" {

int weft_bench_softmax_variant(void *stream, int dtype, const char *variant, void *out,
                               const void *in, size_t rows, size_t cols)
{
    return by_dtype((weft_dtype)dtype, [&](auto t) {
        return softmax_variant<decltype(t)>((cudaStream_t)stream, variant, out, in, rows, cols);
    });
}
}
