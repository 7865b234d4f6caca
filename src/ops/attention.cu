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
 * Shared tiles are rows of head_dim 16-bit elements in 16-byte chunks,
 * chunk c of row r stored at c ^ (r % 8): the eight rows one ldmatrix
 * reads fall in eight different bank groups. Rows past the sequence are
 * zero-filled by the copy (cp.async's source size 0), so they add nothing
 * and NaN padding beyond them is never read.
 *
 * Paged (weft_attention_paged): the same kernel, its K and V tiles
 * gathered a row at a time from the pages the sequence's block table
 * names (page_size >= 16 rows apiece, so each 16-byte chunk is still one
 * cp.async); the keys are stored rotated, so RoPE turns Q only.
 *
 * RoPE, when asked, turns the Q tile once and each K tile as it arrives,
 * in shared memory, rounding to the dtype as weft_rope stores. Angles are
 * formed in double (position times the inverse frequency, computed once a
 * block as the host does) and reduced modulo 2 pi in double; the sine and
 * cosine of the reduced angle are fp32 (sincosf, not the fast intrinsic),
 * within ~2.5e-7 of the host's correctly rounded double ones.
 */
#include <math.h>

#include "ops/attention.h"
#include "ops/ops_cuda.cuh"

namespace weft_ops
{
namespace
{

constexpr int BM = 128, BN = 64;

/* MI row tiles of 16 a warp: the block's threads. */
template <int MI> __host__ __device__ constexpr int threads_for()
{
    return BM / (16 * MI) * 32;
}

template <typename T> struct attention_params {
    const T *q, *k, *v;
    T *o;
    float *lse;
    const int32_t *cu_q, *cu_k, *pos_q, *pos_k;
    const int32_t *table, *k_lens; /* paged: the block table and the key lengths */
    int page_shift, pages, max_pages;
    long long q_stride, k_stride, v_stride, o_stride, lse_stride;
    int seq_q, seq_k, group; /* group: query heads per kv head */
    int causal, halves;
    long long window; /* 0: none */
    float scale_log2; /* scale * log2(e) */
    double rope_base;
};

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Element e of row r of a swizzled tile of D-element rows. */
template <int D> __device__ __forceinline__ int swz(int r, int e)
{
    return r * D + ((((e >> 3) ^ (r & 7))) << 3) + (e & 7);
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

/* Two floats as the 32-bit pair of T an mma operand takes (lo first). */
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi)
{
    unsigned u;
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        memcpy(&u, &v, sizeof u);
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        memcpy(&u, &v, sizeof u);
    }
    return u;
}

/* Rows [row0, row0 + R) of a head (D elements from src, rows stride
 * apart) into the swizzled tile dst; rows at or past `rows` zero-filled. */
template <typename T, int D, int R, int THREADS>
__device__ __forceinline__ void load_tile(T *dst, const T *src, long long stride, int row0,
                                          int rows)
{
    constexpr int CHUNKS = D / 8;
#pragma unroll
    for (int i = threadIdx.x; i < R * CHUNKS; i += THREADS) {
        const int r = i / CHUNKS, c = i % CHUNKS;
        const bool ok = row0 + r < rows;
        const T *from = ok ? src + (long long)(row0 + r) * stride + c * 8 : src;
        cp_async16(dst + r * D + ((c ^ (r & 7)) << 3), from, ok ? 16 : 0);
    }
}

/* Rows [row0, row0 + R) of a sequence's keys in a paged pool (base: the
 * pool plus the kv head's offset, rows stride apart; key t in slot t %
 * page_size of page table[t / page_size], clamped into the pool) into the
 * swizzled tile dst; rows at or past `rows` zero-filled. */
template <typename T, int D, int R, int THREADS>
__device__ __forceinline__ void load_paged_tile(T *dst, const T *base, long long stride, int row0,
                                                int rows, const int32_t *table, int shift,
                                                int pages)
{
    constexpr int CHUNKS = D / 8;
#pragma unroll
    for (int i = threadIdx.x; i < R * CHUNKS; i += THREADS) {
        const int r = i / CHUNKS, c = i % CHUNKS, t = row0 + r;
        const bool ok = t < rows;
        const T *from = base;
        if (ok) {
            int page = table[t >> shift];
            page = page < 0 ? 0 : page >= pages ? pages - 1 : page;
            const long long row = ((long long)page << shift) + (t & ((1 << shift) - 1));
            from = base + row * stride + c * 8;
        }
        cp_async16(dst + r * D + ((c ^ (r & 7)) << 3), from, ok ? 16 : 0);
    }
}

/* K and V tiles from rows n0 on, from dense rows or the pages. */
template <typename T, int D, bool PAGED, int THREADS>
__device__ __forceinline__ void load_kv(T *ks, T *vs, const attention_params<T> &p, const T *kh,
                                        const T *vh, const int32_t *table, int n0, int lk)
{
    if (PAGED) {
        load_paged_tile<T, D, BN, THREADS>(ks, kh, p.k_stride, n0, lk, table, p.page_shift,
                                           p.pages);
        load_paged_tile<T, D, BN, THREADS>(vs, vh, p.v_stride, n0, lk, table, p.page_shift,
                                           p.pages);
    } else {
        load_tile<T, D, BN, THREADS>(ks, kh, p.k_stride, n0, lk);
        load_tile<T, D, BN, THREADS>(vs, vh, p.v_stride, n0, lk);
    }
}

/* RoPE on rows [0, R) of a swizzled tile in place: row r is sequence row
 * row0 + r (below rows), at position pos[row0 + r]. */
template <typename T, int D, int R, int THREADS>
__device__ void rotate_tile(T *tile, const int32_t *pos, int row0, int rows, bool halves,
                            const double *inv_freq)
{
    constexpr int PAIRS = D / 2;
    for (int w = threadIdx.x; w < R * PAIRS; w += THREADS) {
        const int r = w / PAIRS, i = w % PAIRS;
        if (row0 + r >= rows)
            continue;
        const int lo = halves ? i : 2 * i, hi = halves ? i + PAIRS : 2 * i + 1;
        double a = (double)pos[row0 + r] * inv_freq[i];
        a -= rint(a * 0.15915494309189535) * 6.283185307179586; /* into [-pi, pi] */
        float sn, cs;
        sincosf((float)a, &sn, &cs);
        T *pl = tile + swz<D>(r, lo), *ph = tile + swz<D>(r, hi);
        const float u = to_f32(*pl), v = to_f32(*ph);
        *pl = from_f32<T>(__fsub_rn(__fmul_rn(u, cs), __fmul_rn(v, sn)));
        *ph = from_f32<T>(__fadd_rn(__fmul_rn(u, sn), __fmul_rn(v, cs)));
    }
}

/* MI: each warp takes MI tiles of 16 query rows, so that every K and V
 * fragment it reads from shared memory serves MI row tiles. Two blocks an
 * SM where the shared memory allows (head_dim 64). */
template <typename T, int D, int MI, bool ROPE, bool PAGED>
__global__ void __launch_bounds__(threads_for<MI>(), D == 64 ? 2 : 1)
    attention_kernel(attention_params<T> p)
{
    constexpr int THREADS = threads_for<MI>();
    extern __shared__ __align__(16) unsigned char smem[];
    T *sq = reinterpret_cast<T *>(smem);
    T *sk = sq + BM * D; /* two buffers of BN rows */
    T *sv = sk + 2 * BN * D;
    double *inv_freq = reinterpret_cast<double *>(sv + 2 * BN * D);

    const int b = blockIdx.z, h = blockIdx.y;
    const int mb = p.causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    long long q0, k0;
    int lq, lk;
    if (p.cu_q) {
        const long long qs = p.cu_q[b];
        long long nq = p.cu_q[b + 1] - qs;
        nq = nq < 0 ? 0 : nq > p.seq_q ? p.seq_q : nq;
        q0 = qs < 0 ? 0 : qs;
        lq = (int)nq;
    } else {
        q0 = (long long)b * p.seq_q;
        lq = p.seq_q;
    }
    const int32_t *table = nullptr;
    if (PAGED) { /* keys from position 0 of the sequence's pages */
        const long long nk = p.k_lens[b];
        k0 = 0;
        lk = (int)(nk < 0 ? 0 : nk > p.seq_k ? p.seq_k : nk);
        table = p.table + (long long)b * p.max_pages;
    } else if (p.cu_k) {
        const long long ks = p.cu_k[b];
        long long nk = p.cu_k[b + 1] - ks;
        nk = nk < 0 ? 0 : nk > p.seq_k ? p.seq_k : nk;
        k0 = ks < 0 ? 0 : ks;
        lk = (int)nk;
    } else {
        k0 = (long long)b * p.seq_k;
        lk = p.seq_k;
    }
    const int m0 = mb * BM;
    if (m0 >= lq)
        return;
    const int kvh = h / p.group;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;

    /* Query i sees keys [i + shift - window + 1, i + shift] (causal), all
     * below lk. The block's keys: [n_begin, n_end). */
    const long long shift = (long long)lk - lq;
    long long n_end = lk, n_begin = 0;
    if (p.causal) {
        const long long last = m0 + BM + shift; /* past the last row's diagonal */
        n_end = last < n_end ? last : n_end;
        if (p.window) {
            const long long first = m0 + shift - p.window + 1;
            n_begin = first > 0 ? first / BN * BN : 0;
        }
    }

    const T *qh = p.q + q0 * p.q_stride + (long long)h * D;
    const T *kh = p.k + k0 * p.k_stride + (long long)kvh * D;
    const T *vh = p.v + k0 * p.v_stride + (long long)kvh * D;
    load_tile<T, D, BM, THREADS>(sq, qh, p.q_stride, m0, lq);
    cp_async_commit();
    const bool any = n_begin < n_end;
    if (any) {
        load_kv<T, D, PAGED, THREADS>(sk, sv, p, kh, vh, table, (int)n_begin, lk);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    if (ROPE) {
        for (int i = tid; i < D / 2; i += THREADS)
            inv_freq[i] = pow(p.rope_base, -2.0 * (double)i / (double)D);
        __syncthreads();
        rotate_tile<T, D, BM, THREADS>(sq, p.pos_q + q0, m0, lq, p.halves, inv_freq);
    }
    __syncthreads();

    /* This thread's rows: g and g + 8 of each of its warp's MI tiles of 16,
     * and the keys each sees: [lo, hi), both within [0, lk]. */
    const int wrow = warp * 16 * MI;
    int row_lo[MI][2], row_hi[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const long long i = m0 + wrow + 16 * mi + g + 8 * r;
            const long long hi = p.causal && i + shift + 1 < lk ? i + shift + 1 : lk;
            const long long lo = p.window ? i + shift - p.window + 1 : 0;
            row_hi[mi][r] = (int)(hi < 0 ? 0 : hi);
            row_lo[mi][r] = (int)(lo < 0 ? 0 : lo > lk ? lk : lo);
        }

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
    for (long long n0 = n_begin; n0 < n_end; n0 += BN, stage ^= 1) {
        T *ks = sk + stage * BN * D, *vs = sv + stage * BN * D;
        if (n0 + BN < n_end) {
            load_kv<T, D, PAGED, THREADS>(sk + (stage ^ 1) * BN * D, sv + (stage ^ 1) * BN * D, p,
                                          kh, vh, table, (int)(n0 + BN), lk);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (ROPE && !PAGED) { /* paged keys are stored rotated */
            rotate_tile<T, D, BN, THREADS>(ks, p.pos_k + k0, (int)n0, lk, p.halves, inv_freq);
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

        /* scale into log2 units; mask where the tile is not wholly visible */
        const bool whole = n0 + BN <= lk && (!p.causal || n0 + BN - 1 <= m0 + shift) &&
                           (!p.window || n0 > m0 + BM - 1 + shift - p.window);
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int n = 0; n < BN / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = e / 2;
                    const int j = (int)n0 + n * 8 + 2 * t + e % 2;
                    float x = s[mi][n][e] * p.scale_log2;
                    if (!whole && (j < row_lo[mi][r] || j >= row_hi[mi][r]))
                        x = -INFINITY;
                    s[mi][n][e] = x;
                }

                /* online softmax: new maxima, the old sums and outputs rescaled */
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float m = row_max[mi][r];
#pragma unroll
                for (int n = 0; n < BN / 8; n++)
                    m = fmaxf(m, fmaxf(s[mi][n][2 * r], s[mi][n][2 * r + 1]));
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
                const float base = m == -INFINITY ? 0.0f : m; /* a row that has seen nothing */
                const float corr = exp2f(row_max[mi][r] - base);
                row_max[mi][r] = m;
                float sum = 0.0f;
#pragma unroll
                for (int n = 0; n < BN / 8; n++) {
                    s[mi][n][2 * r] = exp2f(s[mi][n][2 * r] - base);
                    s[mi][n][2 * r + 1] = exp2f(s[mi][n][2 * r + 1] - base);
                    sum += s[mi][n][2 * r] + s[mi][n][2 * r + 1];
                }
                row_sum[mi][r] = row_sum[mi][r] * corr + sum;
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    acc[mi][n][2 * r] *= corr;
                    acc[mi][n][2 * r + 1] *= corr;
                }
            }

            /* O += P V */
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            unsigned a[MI][4];
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                a[mi][0] = pack2<T>(s[mi][2 * kk][0], s[mi][2 * kk][1]);
                a[mi][1] = pack2<T>(s[mi][2 * kk][2], s[mi][2 * kk][3]);
                a[mi][2] = pack2<T>(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
                a[mi][3] = pack2<T>(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
            }
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

    /* the row sums across the row's four threads; O and the LSE */
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = row_sum[mi][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int i = m0 + wrow + 16 * mi + g + 8 * r;
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            if (i >= lq)
                continue;
            T *out = p.o + (q0 + i) * p.o_stride + (long long)h * D + 2 * t;
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                const unsigned v = pack2<T>(acc[mi][n][2 * r] * inv, acc[mi][n][2 * r + 1] * inv);
                *reinterpret_cast<unsigned *>(out + n * 8) = v;
            }
            if (p.lse && t == 0)
                p.lse[(long long)h * p.lse_stride + q0 + i] =
                    l > 0.0f ? row_max[mi][r] * 0.6931471805599453f + logf(l) : -INFINITY;
        }
}

template <typename T, int D, int MI, bool ROPE, bool PAGED = false>
int launch_one(cudaStream_t stream, const attention_params<T> &p, dim3 grid)
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
    attention_params<T> p = {};
    p.q = (const T *)a->q, p.k = (const T *)a->k, p.v = (const T *)a->v, p.o = (T *)a->o;
    p.lse = a->lse;
    p.cu_q = a->cu_seqlens_q, p.cu_k = a->cu_seqlens_k;
    p.pos_q = a->q_positions, p.pos_k = a->k_positions;
    p.q_stride = (long long)a->q_stride, p.k_stride = (long long)a->k_stride;
    p.v_stride = (long long)a->v_stride, p.o_stride = (long long)a->o_stride;
    p.lse_stride = (long long)a->lse_stride;
    p.seq_q = (int)a->seq_q, p.seq_k = (int)a->seq_k;
    p.group = (int)(a->heads / a->kv_heads);
    p.causal = a->causal;
    p.halves = a->rope_layout == WEFT_ROPE_HALVES;
    /* a window past every key is no window */
    p.window = a->window > a->seq_k ? 0 : (long long)a->window;
    p.scale_log2 = (float)((double)a->scale * 1.4426950408889634);
    p.rope_base = a->rope_base;
    dim3 grid((unsigned)((a->seq_q + BM - 1) / BM), (unsigned)a->heads, (unsigned)a->batch);
    const bool rope = a->q_positions != NULL;
    if (a->paged) { /* head_dim 64 or 128, as the cache allows */
        p.table = a->table, p.k_lens = a->k_lens;
        p.pages = (int)a->pages, p.max_pages = (int)a->max_pages;
        while ((1u << p.page_shift) < a->page_size)
            p.page_shift++;
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
    if (a->dtype == WEFT_DTYPE_BF16)
        return weft_ops::launch<__nv_bfloat16>((cudaStream_t)stream, a);
    return weft_ops::launch<__half>((cudaStream_t)stream, a);
}
