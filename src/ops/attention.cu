/*
 * attention.cu - weft_attention on the GPU: weft's own FlashAttention-2
 * style kernel (attention.c holds the checks, attention_host.c the host
 * reference).
 *
 * A block takes 128 query rows of one head of one sequence (grid: query
 * blocks x heads x sequences), in tiles of 16 rows: a warp takes two tiles
 * where its registers hold both without spilling (head_dim 64: 4 warps),
 * so each K and V fragment it reads from shared memory serves 32 rows, and
 * one tile otherwise (head_dim 128 and 256: 8 warps; two would spill). The
 * shared tiles of head_dim 256 (192 KiB) need a Hopper-sized SM. It copies its
 * Q tile into shared memory once, then walks the sequence's keys in tiles
 * of 64: K and V tiles come in by cp.async into two buffers, the next
 * tile's copy in flight while the current one is multiplied. Both
 * products run on the tensor cores (mma.sync m16n8k16, 16-bit operands,
 * fp32 accumulators): S = Q K^T from ldmatrix fragments of Q and K, then
 * O += P V with P taken straight from S's accumulators (the m16n8k16
 * accumulator of two key columns is the A fragment of the next product)
 * and V through ldmatrix.trans. The softmax is online, in registers: each
 * thread keeps its rows' running maxima and partial sums (in log2
 * units: the scores are multiplied by scale * log2(e) so exp2 gives the
 * exponentials), rescaling O when the maximum grows; the row sums meet
 * across the four threads of a row only at the end. O and the LSE are
 * written once.
 *
 * Masks: a tile wholly visible to every row of the block is multiplied
 * without a test; only the tiles a causal diagonal, a window's edge or the
 * sequence's end cross test each element. Tiles wholly masked are never
 * visited: a causal block stops at its last row's diagonal, a windowed one
 * starts at its first row's window. Causal blocks are launched last
 * query block first, so the longest ones start first.
 *
 * Shared tiles are attention.cuh's ROWS layout (whole rows, 16-byte
 * chunks swizzled so that an ldmatrix meets no bank twice).
 *
 * Paged (weft_attention_paged): the same kernel, its K and V tiles
 * gathered a row at a time from the pages the sequence's block table
 * names (page_size >= 16 rows apiece, so each 16-byte chunk is still one
 * cp.async); the keys are stored rotated, so RoPE turns Q only.
 *
 * RoPE, when asked, turns the Q tile once and each K tile as it arrives,
 * in shared memory (attention.cuh).
 *
 * On Hopper, head_dim 64 and 128 go to attention_wgmma.cu's kernel
 * instead where it is on (weft__attention_wgmma_on).
 */
#include "ops/attention.cuh"

namespace weft_ops
{
namespace
{

using namespace attention;

constexpr int BM = 128, BN = 64;

/* MI row tiles of 16 a warp: the block's threads. */
template <int MI> __host__ __device__ constexpr int threads_for()
{
    return BM / (16 * MI) * 32;
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&x)[4], const void *p)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                 : "r"(s));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&x)[4], const void *p)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                 : "r"(s));
}

/* c += a b for one m16n8k16 tile: a the 16x16 A fragment, b0 b1 the 16x8
 * B fragment, c the 16x8 fp32 accumulator. */
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1)
{
    if constexpr (std::is_same<T, __nv_bfloat16>::value)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* MI: each warp takes MI tiles of 16 query rows, so that every K and V
 * fragment it reads from shared memory serves MI row tiles. Two blocks an
 * SM where the shared memory allows (head_dim 64). */
template <typename T, int D, int MI, bool ROPE, bool PAGED>
__global__ void __launch_bounds__(threads_for<MI>(), D == 64 ? 2 : 1) attention_kernel(params<T> p)
{
    constexpr int THREADS = threads_for<MI>();
    constexpr layout L = layout::ROWS;
    extern __shared__ __align__(16) unsigned char smem[];
    T *sq = reinterpret_cast<T *>(smem);
    T *sk = sq + BM * D; /* two buffers of BN rows */
    T *sv = sk + 2 * BN * D;
    double *inv_freq = reinterpret_cast<double *>(sv + 2 * BN * D);

    const int b = blockIdx.z, h = blockIdx.y;
    const int mb = p.causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const span sp = span_of<T, PAGED, BM, BN>(p, b, mb);
    if (sp.m0 >= sp.lq)
        return;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4;
    const T *kh, *vh;
    open_block<L, T, D, BM, BN, ROPE, PAGED, THREADS>(p, sp, h, sq, sk, sv, inv_freq, kh, vh);
    __syncthreads();

    /* This thread's rows: g and g + 8 of each of its warp's MI tiles of 16,
     * and the keys each sees. */
    const int wrow = warp * 16 * MI;
    int row_lo[MI][2], row_hi[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int r = 0; r < 2; r++)
            row_keys(p, sp, sp.m0 + wrow + 16 * mi + g + 8 * r, row_lo[mi][r], row_hi[mi][r]);

    float acc[MI][D / 8][4];
    float row_max[MI][2], row_sum[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            acc[mi][n][0] = acc[mi][n][1] = acc[mi][n][2] = acc[mi][n][3] = 0.0f;
        row_max[mi][0] = row_max[mi][1] = -INFINITY;
        row_sum[mi][0] = row_sum[mi][1] = 0.0f;
    }

    int stage = 0;
    for (long long n0 = sp.n_begin; n0 < sp.n_end; n0 += BN, stage ^= 1) {
        T *ks = sk + stage * BN * D, *vs = sv + stage * BN * D;
        if (n0 + BN < sp.n_end) {
            load_kv<L, T, D, BN, PAGED, THREADS>(sk + (stage ^ 1) * BN * D,
                                                 sv + (stage ^ 1) * BN * D, p, kh, vh, sp.table,
                                                 (int)(n0 + BN), sp.lk);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (ROPE && !PAGED) { /* paged keys are stored rotated */
            rotate_tile<L, T, D, BN, THREADS>(ks, p.pos_k + sp.k0, (int)n0, sp.lk, p.halves,
                                              inv_freq);
            __syncthreads();
        }

        /* S = Q K^T: this warp's MI x 16 rows x BN keys */
        float s[MI][BN / 8][4];
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int n = 0; n < BN / 8; n++)
                s[mi][n][0] = s[mi][n][1] = s[mi][n][2] = s[mi][n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            unsigned a[MI][4];
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
                ldmatrix_x4(a[mi], sq + (wrow + 16 * mi + lane % 16) * D +
                                       (((2 * kk + lane / 16) ^ (lane % 8)) << 3));
#pragma unroll
            for (int jj = 0; jj < BN / 16; jj++) {
                unsigned bk[4];
                const int i = lane / 8, key = 16 * jj + (i / 2) * 8 + lane % 8;
                ldmatrix_x4(bk, ks + key * D + (((2 * kk + i % 2) ^ (key & 7)) << 3));
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    mma16816<T>(s[mi][2 * jj], a[mi], bk[0], bk[1]);
                    mma16816<T>(s[mi][2 * jj + 1], a[mi], bk[2], bk[3]);
                }
            }
        }

        const bool whole = tile_whole<T, BM, BN>(p, sp, n0);
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
            softmax_tile<BN, D>(s[mi], acc[mi], row_max[mi], row_sum[mi], row_lo[mi], row_hi[mi],
                                whole, n0, p.scale_log2);

            /* O += P V */
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            unsigned a[MI][4];
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
                p_fragment<T, BN>(a[mi], s[mi], kk);
#pragma unroll
            for (int jj = 0; jj < D / 16; jj++) {
                unsigned bv[4];
                const int i = lane / 8, key = 16 * kk + (i % 2) * 8 + lane % 8;
                ldmatrix_x4_trans(bv, vs + key * D + (((2 * jj + i / 2) ^ (key & 7)) << 3));
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    mma16816<T>(acc[mi][2 * jj], a[mi], bv[0], bv[1]);
                    mma16816<T>(acc[mi][2 * jj + 1], a[mi], bv[2], bv[3]);
                }
            }
        }
        __syncthreads(); /* this stage's buffers are refilled next */
    }

#pragma unroll
    for (int mi = 0; mi < MI; mi++)
        store_rows<T, D>(p, sp, h, sp.m0 + wrow + 16 * mi + g, acc[mi], row_max[mi], row_sum[mi]);
}

template <typename T, int D, int MI, bool ROPE, bool PAGED = false>
int launch_one(cudaStream_t stream, const params<T> &p, dim3 grid)
{
    auto kernel = attention_kernel<T, D, MI, ROPE, PAGED>;
    const size_t bytes =
        (size_t)(BM + 4 * BN) * D * sizeof(T) + (ROPE ? D / 2 * sizeof(double) : 0);
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess)
        return launch_status("weft_attention", e);
    kernel<<<grid, threads_for<MI>(), bytes, stream>>>(p);
    return launched("weft_attention");
}

template <typename T> int launch(cudaStream_t stream, const weft__attention_args *a)
{
    const params<T> p = params_of<T>(a);
    dim3 grid((unsigned)((a->seq_q + BM - 1) / BM), (unsigned)a->heads, (unsigned)a->batch);
    const bool rope = a->q_positions != NULL;
    if (a->paged) { /* head_dim 64 or 128, as the cache allows */
        if (a->head_dim == 64)
            return rope ? launch_one<T, 64, 2, true, true>(stream, p, grid)
                        : launch_one<T, 64, 2, false, true>(stream, p, grid);
        return rope ? launch_one<T, 128, 1, true, true>(stream, p, grid)
                    : launch_one<T, 128, 1, false, true>(stream, p, grid);
    }
    if (a->head_dim == 256)
        return rope ? launch_one<T, 256, 1, true>(stream, p, grid)
                    : launch_one<T, 256, 1, false>(stream, p, grid);
    if (a->head_dim == 64)
        return rope ? launch_one<T, 64, 2, true>(stream, p, grid)
                    : launch_one<T, 64, 2, false>(stream, p, grid);
    return rope ? launch_one<T, 128, 1, true>(stream, p, grid)
                : launch_one<T, 128, 1, false>(stream, p, grid);
}

} // namespace
} // namespace weft_ops

extern "C" int weft__attention_cuda(void *stream, const weft__attention_args *a)
{
    if (weft__attention_wgmma_takes(a))
        return weft__attention_wgmma_cuda(stream, a);
    if (a->dtype == WEFT_DTYPE_BF16)
        return weft_ops::launch<__nv_bfloat16>((cudaStream_t)stream, a);
    return weft_ops::launch<__half>((cudaStream_t)stream, a);
}
