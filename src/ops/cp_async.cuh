/*
 * cp_async.cuh - Ampere's asynchronous copies from global into shared
 * memory (cp.async), as the tiled kernels use them: 16 bytes a copy,
 * zero-filled past src_bytes, committed in groups and waited for by count.
 */
#ifndef WEFT_OPS_CP_ASYNC_CUH
#define WEFT_OPS_CP_ASYNC_CUH

namespace weft_ops
{

/* 16 bytes from gmem into smem; of them src_bytes (0 or 16) are read, the
 * rest zero-filled. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_bytes));
}

/* The copies issued since the last commit, as one group. */
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

/* Until at most N of this thread's groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

} // namespace weft_ops

#endif
