/*
 * filter.cu - the pipeline's kernel (pipeline.c), the one file nvcc
 * compiles. It exports the kernel's address through a C function, so that
 * the rest of the program stays C: weft_launch takes that address, as
 * cudaLaunchKernel does. The kernel is registered with the CUDA runtime
 * this file is linked with, which must be the one weft launches through
 * (see README.md here: -cudart shared with libweft.so).
 */

/* data[i] = data[i] * 0.5 + 1: pipeline.c's filter_host does the same on
 * the host backend, and checks the result against it. */
__global__ void filter(float *data, unsigned n)
{
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] = data[i] * 0.5f + 1.0f;
}

extern "C" const void *filter_kernel(void)
{
    return reinterpret_cast<const void *>(filter);
}
