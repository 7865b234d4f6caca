/*
 * weft_check.cuh - WCK, the weft side's counterpart of gpu_common.cuh's CK:
 * a failed weft call ends the benchmark, naming the call and weft's
 * message.
 */
#ifndef WEFT_BENCH_GPU_WEFT_CHECK_CUH
#define WEFT_BENCH_GPU_WEFT_CHECK_CUH

#include "weft.h"

#include "gpu_common.cuh"

static inline void wck_at(int status, const char *what, int line)
{
    if (status == WEFT_OK)
        return;
    fprintf(stderr, "%s: line %d: %s: %s (%s)\n", bench_prog, line, what, weft_strerror(status),
            weft_last_error());
    bench_die();
}
#define WCK(call) wck_at((call), #call, __LINE__)

#endif
