/*
 * rope.cu - rotary position embedding of Q and K on the GPU (rope.c holds
 * the checks and the host reference).
 *
 * Design: a work item is (token, chunk of pairs, slice of heads). Its
 * thread computes the chunk's angles once - in double, as the host does, so
 * positions in the hundreds of thousands keep fp32 accuracy - and applies
 * them to every head of the slice, reading and writing each element once,
 * in place. The sine and cosine are paid once per (token, pair, slice) and
 * shared by the slice's heads; slices are as many as leave each angle
 * turning 24 bytes, or more where tokens are few (rope_tuning::slices says
 * why). Q's heads and then K's are dealt to the slices in turn, so that a
 * warp's slices of a token work on neighbouring heads at once. The inverse
 * frequencies (a pow each) depend on the pair alone: each block computes
 * them once into shared memory, for heads of up to 1024 (+15-19% on bf16
 * against computing them with each angle). Consecutive threads take
 * consecutive chunks of a head, so each access of a warp is contiguous. The
 * rotation is rounded as on the host (no fused multiply-adds), so results
 * match the host's bit for bit whenever the double sine and cosine round
 * alike.
 *
 * Chunks: with 16-byte access, V elements of a head (V/2 interleaved
 * pairs), or V pairs of the split-halves layout (a vector from each half);
 * otherwise one pair, element by element.
 */
#include "ops/rope.cuh"

namespace weft_ops
{
namespace
{

/* The launch for p's layout, 16-byte chunks where `vec`. */
template <typename T, int V, bool TABLE>
int by_layout(cudaStream_t stream, const rope_params<T> &p, size_t pairs, bool vec)
{
    if (vec && p.halves)
        return launch_rope_chunks<T, V, V, true, TABLE>(stream, p, pairs);
    if (vec)
        return launch_rope_chunks<T, V, V / 2, false, TABLE>(stream, p, pairs);
    if (p.halves)
        return launch_rope_chunks<T, 1, 1, true, TABLE>(stream, p, pairs);
    return launch_rope_chunks<T, 1, 1, false, TABLE>(stream, p, pairs);
}

template <typename T> int launch(cudaStream_t stream, const weft__rope_args *a)
{
    rope_params<T> p = {};
    p.q = (T *)a->q;
    p.k = (T *)a->k;
    p.q_heads = a->q_heads;
    p.q_stride = a->q_stride;
    p.k_heads = a->k_heads;
    p.k_stride = a->k_stride;
    p.tokens = a->tokens;
    p.head_dim = a->head_dim;
    p.positions = a->positions;
    p.freq = a->freq;
    p.halves = a->layout == WEFT_ROPE_HALVES;

    constexpr int V = vec16<T>();
    size_t pairs = a->head_dim / 2;
    /* every head's chunks 16-byte aligned: the pointers, both strides and
     * the head (or half-head) length */
    size_t span = p.halves ? pairs : a->head_dim;
    bool vec = aligned16(a->q) && aligned16(a->k) && a->q_stride % V == 0 &&
               (a->k == NULL || a->k_stride % V == 0) && a->head_dim % V == 0 && span % V == 0;

    if (pairs > ROPE_TABLE_PAIRS)
        return by_layout<T, V, false>(stream, p, pairs, vec);
    return by_layout<T, V, true>(stream, p, pairs, vec);
}

} // namespace
} // namespace weft_ops

extern "C" int weft__rope_cuda(void *stream, const weft__rope_args *a)
{
    return weft_ops::by_dtype(
        a->dtype, [&](auto t) { return weft_ops::launch<decltype(t)>((cudaStream_t)stream, a); });
}
