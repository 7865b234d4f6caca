/*
 * sparse_no_cusparselt.c - the sparse weight's GPU path in a CUDA build
 * that found no cuSPARSELt: a weight made for a GPU is refused with the
 * reason, so that the rest (weft_prune_2_4 on either backend, sparse
 * weights and products on the host) still builds and works. The build
 * takes sparse_cusparselt.cu instead when it finds cuSPARSELt.
 */
#include "core/error.h"
#include "ops/sparse.h"

int weft__sparse_gpu_create(void *stream, weft_dtype type, const void *w, size_t n, size_t k,
                            size_t ldw, void **out)
{
    (void)stream, (void)type, (void)w, (void)n, (void)k, (void)ldw;
    *out = NULL;
    return weft__fail(WEFT_EINVAL,
                      "weft_sparse_weight_create: built without cuSPARSELt: a GPU's sparse "
                      "weight needs it (its header cusparseLt.h and libcusparseLt); install it "
                      "and configure again with CUSPARSELT_ROOT, or make the weight for the host");
}

void weft__sparse_gpu_destroy(void *gpu)
{
    (void)gpu;
}

int weft__sparse_gpu_device(const void *gpu)
{
    (void)gpu;
    return -1;
}

size_t weft__sparse_gpu_bytes(const void *gpu)
{
    (void)gpu;
    return 0;
}

int weft__sparse_gpu_matmul(void *stream, void *gpu, const weft__matmul_args *a)
{
    (void)stream, (void)gpu, (void)a;
    return weft__fail(WEFT_EINVAL, "weft_matmul_sparse: built without cuSPARSELt");
}
