/*
 * matmul_no_blas.c - weft_matmul's host reference in a build that found no
 * BLAS: the call is refused with the reason, so that the rest of the
 * library (and weft_matmul on a GPU stream) still builds and works. The
 * build takes matmul_host.c instead when it finds OpenBLAS.
 */
#include <assert.h>

#include "core/error.h"
#include "ops/matmul.h"

int weft__matmul_host_prepare(const char *op, weft__matmul_args *x)
{
    (void)x;
    return weft__fail(WEFT_EINVAL,
                      "%s: built without a host BLAS: install OpenBLAS (libopenblas-dev) and "
                      "configure again",
                      op);
}

void weft__matmul_host_run(weft__matmul_args *x)
{
    (void)x;
    assert(!"weft__matmul_host_run without a BLAS"); /* prepare refused the call */
}

void weft__matmul_host_compute(const weft__matmul_args *x)
{
    (void)x;
    assert(!"weft__matmul_host_compute without a BLAS"); /* prepare refused the call */
}
