/*
 * status.h - the weft status a CUDA error becomes: one list for the
 * CUDA backend (src/cuda/) and the operators (src/ops/), so that the same
 * error reads the same from both. Built with CUDA only.
 */
#ifndef WEFT_CUDA_STATUS_H
#define WEFT_CUDA_STATUS_H

#include <cuda_runtime_api.h>

#include "weft.h"

static inline int weft__cuda_status(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return WEFT_OK;
    case cudaErrorMemoryAllocation:
        return WEFT_ENOMEM;
    /* the caller's arguments: sizes, a launch shape, a handle, a function */
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDeviceFunction:
        return WEFT_EINVAL;
    default:
        return WEFT_EDEVICE;
    }
}

#endif
