/*
 * attention_wgmma.cu - weft_attention on Hopper: head_dim 64 and 128 with
 * the warpgroup tensor-core products (wgmma), built for sm_90a alone
 * (CMakeLists.txt); attention.cu's kernel takes every other call.
 *
 * It is opt-in (WEFT_ATTENTION_WGMMA=1) until it has passed on a GPU.
 *
 * A block of two warpgroups takes 128 query rows of one head of one
 * sequence, 64 a warpgroup, and walks the keys in tiles of 128:
 *  - K and V tiles come in by cp.async into two buffers, the next tile's
 *    copy in flight while the current one is multiplied (as attention.cu);
 *    the tiles are attention.cuh's PANELS layout, the 128-byte swizzle
 *    wgmma reads through a shared-memory descriptor.
 *  - S = Q K^T: Q and K both from shared memory, K-major (head_dim
 *    contiguous), one m64n128k16 product a 16 of head_dim.
 *  - The online softmax in registers (attention.cuh's softmax_tile): a
 *    wgmma accumulator is laid out as the m16n8 ones of mma.sync, warp w of
 *    a warpgroup holding its rows 16w .. 16w + 15.
 *  - O += P V: P from registers (the accumulator of two key columns is the
 *    A fragment of the next product, as with mma.sync), V from shared
 *    memory read transposed (N-major: head_dim contiguous), one m64n64k16
 *    product a 16 keys and 64 of head_dim.
 * The two warpgroups run apart: while one waits on its product the other
 * computes its softmax. Masks, RoPE, paged K/V, the order of causal blocks
 * and the writing of O and the LSE are attention.cu's.
 */
#include <stdlib.h>
#include <string.h>

#include "ops/attention.cuh"

namespace weft_ops
{
namespace
{

using namespace attention;

constexpr int BM = 128, BN = 128, THREADS = 256;
constexpr layout L = layout::PANELS;

/* A shared-memory matrix descriptor: the address, the byte stride between
 * 8-row groups (1024: eight 128-byte rows), the 128-byte swizzle. The
 * leading-dimension offset is unused: no product here reaches past one
 * 64-wide panel along its contiguous dimension. */
__device__ __forceinline__ uint64_t descriptor(const void *p)
{
    const uint64_t a = (uint64_t)__cvta_generic_to_shared(p);
    return ((a & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

/* Shared memory written by threads (cp.async, RoPE) made visible to the
 * tensor cores' reads; a barrier follows. */
__device__ __forceinline__ void fence_to_tensor_cores()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* The operands of accumulators d[O + i], a product's registers. */
#define WEFT_ACC4(i) "+f"(d[O + i][0]), "+f"(d[O + i][1]), "+f"(d[O + i][2]), "+f"(d[O + i][3])

/* s (+)= A B for 64 rows x 128 keys x 16 of head_dim: A and B both
 * described in shared memory, K-major; `add` 0 overwrites s. */
template <typename T>
__device__ __forceinline__ void product_s(float (&d)[16][4], uint64_t a, uint64_t b, int add)
{
    constexpr int O = 0;
#define WEFT_WGMMA_SS(types)                                                                       \
    asm volatile(                                                                                  \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                               \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." types " "                                   \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                  \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "         \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "         \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},"         \
        " %64, %65, p, 1, 1, 0, 0;\n}\n"                                                           \
        : WEFT_ACC4(0), WEFT_ACC4(1), WEFT_ACC4(2), WEFT_ACC4(3), WEFT_ACC4(4), WEFT_ACC4(5),      \
          WEFT_ACC4(6), WEFT_ACC4(7), WEFT_ACC4(8), WEFT_ACC4(9), WEFT_ACC4(10), WEFT_ACC4(11),    \
          WEFT_ACC4(12), WEFT_ACC4(13), WEFT_ACC4(14), WEFT_ACC4(15)                               \
        : "l"(a), "l"(b), "r"(add))
    if constexpr (std::is_same<T, __nv_bfloat16>::value)
        WEFT_WGMMA_SS("bf16.bf16");
    else
        WEFT_WGMMA_SS("f16.f16");
#undef WEFT_WGMMA_SS
}

/* O's head_dim columns 64 J .. 64 J + 63 (accumulators d[8 J ..]) += A B
 * for 64 rows x 16 keys: A (P) in registers, B (V) described in shared
 * memory, N-major (read transposed). */
template <typename T, int D, int J>
__device__ __forceinline__ void product_o(float (&d)[D / 8][4], const unsigned (&a)[4], uint64_t b)
{
    constexpr int O = 8 * J;
#define WEFT_WGMMA_RS(types)                                                                       \
    asm volatile(                                                                                  \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                               \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." types " "                                    \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                  \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},"         \
        " {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                             \
        : WEFT_ACC4(0), WEFT_ACC4(1), WEFT_ACC4(2), WEFT_ACC4(3), WEFT_ACC4(4), WEFT_ACC4(5),      \
          WEFT_ACC4(6), WEFT_ACC4(7)                                                               \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
    if constexpr (std::is_same<T, __nv_bfloat16>::value)
        WEFT_WGMMA_RS("bf16.bf16");
    else
        WEFT_WGMMA_RS("f16.f16");
#undef WEFT_WGMMA_RS
}

#undef WEFT_ACC4

template <typename T, int D, bool ROPE, bool PAGED>
__global__ void __launch_bounds__(THREADS, 1) attention_wgmma_kernel(params<T> p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int TILE = BN * D; /* elements of a K or V tile */
    extern __shared__ unsigned char smem_raw[];
    /* the swizzle's 8-row groups on 1024-byte boundaries */
    unsigned char *smem =
        reinterpret_cast<unsigned char *>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    T *sq = reinterpret_cast<T *>(smem);
    T *sk = sq + BM * D; /* two buffers of BN rows */
    T *sv = sk + 2 * TILE;
    double *inv_freq = reinterpret_cast<double *>(sv + 2 * TILE);

    const int b = blockIdx.z, h = blockIdx.y;
    const int mb = p.causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const span sp = span_of<T, PAGED, BM, BN>(p, b, mb);
    if (sp.m0 >= sp.lq)
        return;
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
    const int group = warp / 4; /* the warpgroup: Q rows 64 group .. */
    const T *kh, *vh;
    open_block<L, T, D, BM, BN, ROPE, PAGED, THREADS>(p, sp, h, sq, sk, sv, inv_freq, kh, vh);

    /* This thread's rows: g and g + 8 of its warp's 16, and the keys each
     * sees. */
    const int i0 = sp.m0 + 16 * warp + g;
    int row_lo[2], row_hi[2];
#pragma unroll
    for (int r = 0; r < 2; r++)
        row_keys(p, sp, i0 + 8 * r, row_lo[r], row_hi[r]);

    float acc[D / 8][4];
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < D / 8; n++)
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    /* this warpgroup's Q rows, panel 0 */
    const T *q_rows = sq + at<L, D, BM>(64 * group, 0);

    int stage = 0;
    for (long long n0 = sp.n_begin; n0 < sp.n_end; n0 += BN, stage ^= 1) {
        T *ks = sk + stage * TILE, *vs = sv + stage * TILE;
        if (n0 + BN < sp.n_end) {
            load_kv<L, T, D, BN, PAGED, THREADS>(sk + (stage ^ 1) * TILE, sv + (stage ^ 1) * TILE,
                                                 p, kh, vh, sp.table, (int)(n0 + BN), sp.lk);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        if (ROPE && !PAGED) { /* paged keys are stored rotated */
            __syncthreads();
            rotate_tile<L, T, D, BN, THREADS>(ks, p.pos_k + sp.k0, (int)n0, sp.lk, p.halves,
                                              inv_freq);
        }
        fence_to_tensor_cores();
        __syncthreads();

        /* S = Q K^T: 64 rows x BN keys; a 16 of head_dim is 32 bytes into
         * its panel's rows */
        float s[BN / 8][4];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            product_s<T>(s, descriptor(q_rows + at<L, D, BM>(0, 16 * kk)),
                         descriptor(ks + at<L, D, BN>(0, 16 * kk)), kk);
        wgmma_commit();
        wgmma_wait();

        softmax_tile<BN, D>(s, acc, row_max, row_sum, row_lo, row_hi,
                            tile_whole<T, BM, BN>(p, sp, n0), n0, p.scale_log2);

        /* O += P V: 16 keys are 16 rows of V, two of its 8-row groups. P
         * is packed whole before the products, which then read no register
         * written between them. */
        unsigned pa[BN / 16][4];
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            p_fragment<T, BN>(pa[kk], s, kk);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            const unsigned(&a)[4] = pa[kk];
            product_o<T, D, 0>(acc, a, descriptor(vs + at<L, D, BN>(16 * kk, 0)));
            if constexpr (D == 128)
                product_o<T, D, 1>(acc, a, descriptor(vs + at<L, D, BN>(16 * kk, 64)));
        }
        wgmma_commit();
        wgmma_wait();
        __syncthreads(); /* this stage's buffers are refilled next */
    }

    store_rows<T, D>(p, sp, h, i0, acc, row_max, row_sum);
#endif
}

template <typename T, int D, bool ROPE, bool PAGED>
int launch_one(cudaStream_t stream, const params<T> &p, dim3 grid)
{
    auto kernel = attention_wgmma_kernel<T, D, ROPE, PAGED>;
    const size_t bytes = 1024 /* for the alignment */ + (size_t)(BM + 4 * BN) * D * sizeof(T) +
                         (ROPE ? D / 2 * sizeof(double) : 0);
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess)
        return launch_status("weft_attention", e);
    kernel<<<grid, THREADS, bytes, stream>>>(p);
    return launched("weft_attention");
}

template <typename T, int D> int launch_d(cudaStream_t stream, const weft__attention_args *a)
{
    const params<T> p = params_of<T>(a);
    dim3 grid((unsigned)((a->seq_q + BM - 1) / BM), (unsigned)a->heads, (unsigned)a->batch);
    const bool rope = a->q_positions != NULL;
    if (a->paged)
        return rope ? launch_one<T, D, true, true>(stream, p, grid)
                    : launch_one<T, D, false, true>(stream, p, grid);
    return rope ? launch_one<T, D, true, false>(stream, p, grid)
                : launch_one<T, D, false, false>(stream, p, grid);
}

template <typename T> int launch(cudaStream_t stream, const weft__attention_args *a)
{
    return a->head_dim == 64 ? launch_d<T, 64>(stream, a) : launch_d<T, 128>(stream, a);
}

/* Whether this device runs sm_90a code: compute capability 9.0 and the
 * kernel's image loaded (asked once per device). */
bool device_runs_sm90a()
{
    if (device_attribute<cudaDevAttrComputeCapabilityMajor>(0) != 9 ||
        device_attribute<cudaDevAttrComputeCapabilityMinor>(-1) != 0)
        return false;
    static std::atomic<int> loaded[64]; /* 0: not asked, 1: yes, 2: no */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return false;
    int k = loaded[dev].load(std::memory_order_relaxed);
    if (k == 0) {
        cudaFuncAttributes attr;
        k = cudaFuncGetAttributes(
                &attr, attention_wgmma_kernel<__nv_bfloat16, 128, false, false>) == cudaSuccess
                ? 1
                : 2;
        cudaGetLastError(); /* a missing image is an answer, not an error to keep */
        loaded[dev].store(k, std::memory_order_relaxed);
    }
    return k == 1;
}

} // namespace
} // namespace weft_ops

/* Opt-in until it has passed the GPU suite (gpu.attention.wgmma runs the
 * attention tests with it): WEFT_ATTENTION_WGMMA=1, read once, turns it on
 * where the device can run it. */
extern "C" int weft__attention_wgmma_on(void)
{
    static const bool asked = [] {
        const char *v = getenv("WEFT_ATTENTION_WGMMA");
        return v && strcmp(v, "1") == 0;
    }();
    return asked && weft_ops::device_runs_sm90a();
}

extern "C" int weft__attention_wgmma_takes(const weft__attention_args *a)
{
    return (a->head_dim == 64 || a->head_dim == 128) && weft__attention_wgmma_on();
}

extern "C" int weft__attention_wgmma_cuda(void *stream, const weft__attention_args *a)
{
    if (a->dtype == WEFT_DTYPE_BF16)
        return weft_ops::launch<__nv_bfloat16>((cudaStream_t)stream, a);
    return weft_ops::launch<__half>((cudaStream_t)stream, a);
}
