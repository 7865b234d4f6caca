/*
 * raw_latency.cuh - the raw CUDA peers of bench/gpu/latency.cu: the same
 * loops written against the CUDA runtime API on a plain thread, no weft.
 * They are compiled into the weft program so that both sides are measured
 * in the same process, interleaved, on the same GPU state.
 *
 *   raw_await_loop   launch an empty kernel, record an event, spin on
 *                    cudaEventQuery until it completes: the fastest way a
 *                    thread can see a launch finish (DESIGN.md: 9.4 us)
 *   raw_launch_loop  n empty-kernel launches with cudaLaunchKernel on one
 *                    stream; the time of the enqueue loop alone (then sync)
 */
#ifndef WEFT_BENCH_RAW_LATENCY_CUH
#define WEFT_BENCH_RAW_LATENCY_CUH

#include "gpu_common.cuh"

struct raw_peer {
    cudaStream_t stream;
    cudaEvent_t done;
};

static inline void raw_peer_create(struct raw_peer *p)
{
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming));
}

static inline void raw_peer_destroy(struct raw_peer *p)
{
    CK(cudaEventDestroy(p->done));
    CK(cudaStreamDestroy(p->stream));
}

/* n round trips; ns[i] receives the i-th in nanoseconds. */
static inline void raw_await_loop(struct raw_peer *p, double *ns, unsigned n)
{
    void *noargs[1] = {NULL};
    for (unsigned i = 0; i < n; i++) {
        uint64_t t0 = now_ns();
        CK(cudaLaunchKernel((const void *)k_empty, dim3(1), dim3(1), noargs, 0, p->stream));
        CK(cudaEventRecord(p->done, p->stream));
        cudaError_t e;
        while ((e = cudaEventQuery(p->done)) == cudaErrorNotReady) {
        }
        CK(e);
        ns[i] = (double)(now_ns() - t0);
    }
}

/* Launches are timed in batches small enough for the launch queue, which
 * drains (untimed) between batches: what is measured is the CPU's cost of
 * an enqueue, not the GPU's rate of running empty kernels. */
#define LAUNCH_BATCH 512u

/* n launches, rounded up to whole batches; returns the nanoseconds of the
 * enqueue loops per launch. */
static inline double raw_launch_loop(struct raw_peer *p, unsigned n)
{
    void *noargs[1] = {NULL};
    uint64_t t = 0;
    for (unsigned done = 0; done < n; done += LAUNCH_BATCH) {
        uint64_t t0 = now_ns();
        for (unsigned i = 0; i < LAUNCH_BATCH; i++)
            CK(cudaLaunchKernel((const void *)k_empty, dim3(1), dim3(1), noargs, 0, p->stream));
        t += now_ns() - t0;
        CK(cudaStreamSynchronize(p->stream));
    }
    return (double)t / ((n + LAUNCH_BATCH - 1) / LAUNCH_BATCH * LAUNCH_BATCH);
}

#endif
