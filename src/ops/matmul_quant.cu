/*
 * matmul_quant.cu - the epilogue of weft_matmul's dequantized INT8 product
 * on the GPU (matmul_cublaslt_quant.c runs cuBLASLt's int8 GEMM into an
 * int32 buffer first; matmul.c holds the checks, matmul_host.c the
 * reference).
 *
 * cuBLASLt's int8 kernels end in int32 or int8; none applies per-row and
 * per-column fp32 scales with a bias and an activation, so this pass reads
 * the exact int32 product once and writes
 *   P = alpha * float(acc) * sa_i * sb_j + beta C + bias,   D = act(P)
 * (aux = P when asked) in the host reference's order of fp32 roundings:
 * __fmul_rn/__fadd_rn, which nvcc never contracts into fused multiply-adds.
 * One thread an element, a grid-stride walk over batch x m x n in row
 * order, so neighbouring threads touch neighbouring elements of a row. In
 * place (C = D), each element of C is read by the thread that then writes
 * it.
 */
#include "ops/activations.cuh"
#include "ops/launch.cuh"

#include "ops/matmul.h"

namespace weft_ops
{
namespace
{

template <typename T> struct dequant_params {
    T *d, *aux;
    const T *c, *bias;
    const int32_t *acc;
    const float *sa, *sb;
    int sa_outer, sb_outer;
    weft_matmul_act act;
    float alpha, beta;
    size_t batch, m, n;
    size_t ldw, ldd, ldc, ldaux;
    size_t stride_d, stride_c, stride_aux;
};

template <typename T> __device__ __forceinline__ float activate(weft_matmul_act act, float x)
{
    switch (act) {
    case WEFT_MATMUL_ACT_RELU:
        return x > 0.0f || isnan(x) ? x : 0.0f;
    case WEFT_MATMUL_ACT_GELU_TANH:
        return gelu<T>(WEFT_GELU_TANH, x);
    case WEFT_MATMUL_ACT_GELU_ERF:
        return gelu<T>(WEFT_GELU_ERF, x);
    default:
        return x;
    }
}

template <typename T> __global__ void dequant_kernel(const dequant_params<T> p)
{
    const size_t total = p.batch * p.m * p.n;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t j = e % p.n, row = e / p.n, i = row % p.m, bt = row / p.m;
        const float sa = p.sa[p.sa_outer ? i : 0], sb = p.sb[p.sb_outer ? j : 0];
        float v = __fmul_rn(p.alpha, (float)p.acc[row * p.ldw + j]);
        v = __fmul_rn(__fmul_rn(v, sa), sb);
        if (p.c)
            v = __fadd_rn(v, __fmul_rn(p.beta, to_f32(p.c[bt * p.stride_c + i * p.ldc + j])));
        if (p.bias)
            v = __fadd_rn(v, to_f32(p.bias[j]));
        if (p.aux)
            p.aux[bt * p.stride_aux + i * p.ldaux + j] = from_f32<T>(v);
        p.d[bt * p.stride_d + i * p.ldd + j] = from_f32<T>(activate<T>(p.act, v));
    }
}

template <typename T>
int launch_dequant(cudaStream_t stream, const weft__matmul_args *a, const int32_t *acc, size_t ldw)
{
    dequant_params<T> p;
    p.d = (T *)a->d, p.aux = (T *)a->aux;
    p.c = (const T *)a->c, p.bias = (const T *)a->bias;
    p.acc = acc;
    p.sa = a->scale_a, p.sb = a->scale_b;
    p.sa_outer = a->scale_a_mode == WEFT_MATMUL_SCALE_OUTER;
    p.sb_outer = a->scale_b_mode == WEFT_MATMUL_SCALE_OUTER;
    p.act = a->act, p.alpha = a->alpha, p.beta = a->beta;
    p.batch = a->batch, p.m = a->m, p.n = a->n;
    p.ldw = ldw, p.ldd = a->ldd, p.ldc = a->ldc, p.ldaux = a->ldaux;
    p.stride_d = a->stride_d, p.stride_c = a->stride_c, p.stride_aux = a->stride_aux;
    const unsigned threads = 256;
    auto kernel = dequant_kernel<T>;
    kernel<<<grid_for(kernel, a->batch * a->m * a->n, threads), threads, 0, stream>>>(p);
    return launched("weft_matmul");
}

} // namespace
} // namespace weft_ops

/* The int32 product acc holds batch x m rows of ldw, packed. */
extern "C" int weft__matmul_dequant_cuda(void *stream, const weft__matmul_args *a,
                                         const int32_t *acc, size_t ldw)
{
    return weft_ops::by_dtype(a->type, [&](auto t) {
        return weft_ops::launch_dequant<decltype(t)>((cudaStream_t)stream, a, acc, ldw);
    });
}
