/*
 * cudnn_context.c - the cuDNN handles weft's cuDNN calls share
 * (weft_conv2d's, conv_cudnn.c); their workspaces are workspace.c's, one
 * per stream, shared with cuBLASLt.
 *
 * Kept for the process's life (a handful per thread and per stream);
 * lookups take no lock:
 *  - handles: one per thread and device. A handle carries its stream
 *    (cudnnSetStream), so one shared by threads would race between setting
 *    the stream and the call; a task's call runs on one worker thread from
 *    start to end, so a thread's own handle is never shared. They go with
 *    their thread (a key's destructor). Creating one switches the thread
 *    to relaxed stream capture, so a first call inside a captured region
 *    can make it.
 */
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <pthread.h>
#include <stdlib.h>

#include "core/error.h"
#include "ops/cudnn_context.h"

enum { MAX_DEVICES = 64 };

/* ---- handles, one per thread and device -------------------------------- */

typedef struct thread_handles {
    cudnnHandle_t h[MAX_DEVICES];
} thread_handles;

static pthread_key_t handles_key;
static pthread_once_t handles_once = PTHREAD_ONCE_INIT;
static int handles_key_rc;
static _Thread_local thread_handles *my_handles;

static void drop_handles(void *p)
{
    thread_handles *t = p;
    for (int d = 0; d < MAX_DEVICES; d++)
        if (t->h[d]) {
            /* its last stream may be gone already (a pooled one, at the
             * runtime's end): off it, then away */
            cudaSetDevice(d);
            cudnnSetStream(t->h[d], NULL);
            cudnnDestroy(t->h[d]);
        }
    free(t);
}

static void make_key(void)
{
    handles_key_rc = pthread_key_create(&handles_key, drop_handles);
}

int weft__cudnn_handle(const char *op, int device, cudnnHandle_t *out)
{
    if (device < 0 || device >= MAX_DEVICES)
        return weft__fail(WEFT_EINVAL, "%s: device %d is beyond the %d this build knows", op,
                          device, MAX_DEVICES);
    if (my_handles && my_handles->h[device]) {
        *out = my_handles->h[device];
        return WEFT_OK;
    }
    pthread_once(&handles_once, make_key);
    if (handles_key_rc != 0)
        return weft__fail(WEFT_EDEVICE, "%s: pthread_key_create failed", op);
    if (!my_handles) {
        thread_handles *t = calloc(1, sizeof *t);
        if (!t)
            return weft__fail(WEFT_ENOMEM, "%s: out of memory for cuDNN handles", op);
        if (pthread_setspecific(handles_key, t) != 0) {
            free(t);
            return weft__fail(WEFT_EDEVICE, "%s: pthread_setspecific failed", op);
        }
        my_handles = t;
    }
    cudnnHandle_t h = NULL;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudnnStatus_t s = cudnnCreate(&h);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (s != CUDNN_STATUS_SUCCESS)
        return weft__fail(s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                                  s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
                              ? WEFT_ENOMEM
                              : WEFT_EDEVICE,
                          "%s: cudnnCreate failed: %s (%d)", op, cudnnGetErrorString(s), (int)s);
    my_handles->h[device] = h;
    *out = h;
    return WEFT_OK;
}
