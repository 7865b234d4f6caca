/*
 * conv_cudnn.c - weft_conv2d on the GPU through cuDNN (but for the 1x1
 * convolutions, conv.c's matrix products): first as one operation graph
 * (conv_graph.c), and for the shapes the graph declines through cuDNN's
 * legacy fused convolution-bias-activation
 * (cudnnConvolutionBiasActivationForward):
 *   y = act(alpha1 conv(x, w) + alpha2 z + bias)
 * with alpha1 = 1 and alpha2 = 0, z given as y itself (cuDNN skips the z
 * term at alpha2 = 0, as its other blends skip a zero beta; the GPU test
 * poisons y with NaN to hold it to that).
 *
 * Why this entry point: it is cuDNN's one call that fuses the bias and the
 * ReLU into the convolution, with a heuristic to pick its algorithm; cuDNN
 * 9 marks it legacy (the graph API is its successor) but keeps it, and
 * builds it on the same engines. Its rules, which the plan follows:
 *  - the activation is ReLU or identity, and identity only with
 *    IMPLICIT_PRECOMP_GEMM;
 *  - x, w, y, z and bias of one type, fp32 compute (cuDNN's
 *    FLOAT/PSEUDO_HALF/PSEUDO_BFLOAT16 configurations);
 *  - the bias a 1 x k x 1 x 1 tensor.
 * Layouts: x and y are NHWC tensors, w an NHWC filter (KRSC), so no
 * transposes run. fp16/bf16 use tensor-op math; fp32 FMA math unless
 * allow_tf32.
 *
 * What is kept, all of it for the process's life unless said (a handful
 * per shape and per stream; lookups take no lock, inserts do):
 *  - cuDNN handles (one per thread and device) and workspaces (one per
 *    stream; none inside graph capture): cudnn_context.c.
 *  - plans: per (device, shape, type, activation, TF32), the descriptors
 *    and the algorithms cuDNN's heuristic ranks usable within WORKSPACE,
 *    best first, with the workspace each needs. The heuristic is a first
 *    call's cost (the GPU test prints it). Whether the fused call accepts
 *    an algorithm is known only by calling: cuDNN returns NOT_SUPPORTED
 *    before it enqueues anything, so a call walks the list from the plan's
 *    current choice and moves the choice (an atomic index, only ever
 *    forward) past algorithms refused. A call without a workspace skips
 *    the algorithms that need one, so a shape captured into a graph runs
 *    the algorithm its uncaptured calls run whenever that one needs none.
 *    Descriptors are only read once published.
 *  - the split: where the fused call refuses every algorithm of a shape
 *    (cuDNN's fused kernels cover fewer shapes than its convolutions), the
 *    plan says so and its calls run cuDNN's convolution, then its bias add
 *    (cudnnAddTensor) and ReLU (cudnnActivationForward, in place): two or
 *    three passes instead of one, but the call works. Only when the
 *    convolution too is refused does the call return WEFT_EINVAL naming
 *    the shape. weft__conv_cuda_plan_stats counts split calls. (A fused
 *    call refused for one call's pointers - their alignment is not in the
 *    key - splits the shape's later calls too: slower, still right.)
 * Making a plan switches the thread to relaxed stream capture, so a first
 * call inside a captured region can make one (it enqueues nothing; cuDNN
 * may allocate).
 */
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/lock.h"
#include "cuda/status.h"
#include "ops/conv.h"
#include "ops/conv_graph.h"
#include "ops/cudnn_context.h"
#include "ops/ops_internal.h"
#include "ops/workspace.h"

static const char OP[] = "weft_conv2d";

enum { WORKSPACE = WEFT__WORKSPACE, BUCKETS = 256, MAX_ALGOS = CUDNN_CONVOLUTION_FWD_ALGO_COUNT };

/* Whether s is one of cuDNN 9's NOT_SUPPORTED codes (a category of them). */
static int not_supported(cudnnStatus_t s)
{
    return CUDNN_STATUS_CATEGORY(s) == CUDNN_STATUS_NOT_SUPPORTED;
}

static int dnn_fail(const char *what, cudnnStatus_t s)
{
    int rc = WEFT_EDEVICE;
    if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
        s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
        rc = WEFT_ENOMEM;
    else if (CUDNN_STATUS_CATEGORY(s) == CUDNN_STATUS_BAD_PARAM || not_supported(s))
        rc = WEFT_EINVAL;
    char detail[256] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    return weft__fail(rc, "%s: %s failed: %s (%d)%s%s", OP, what, cudnnGetErrorString(s), (int)s,
                      detail[0] ? ": " : "", detail);
}

/* A failure after the split path's convolution was enqueued: the output
 * is not what was asked, and the cause is cuDNN's or the device's, not
 * the arguments' (they passed the convolution). */
static int dnn_fail_after(const char *what, cudnnStatus_t s)
{
    int rc = s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED ||
                     s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED
                 ? WEFT_ENOMEM
                 : WEFT_EDEVICE;
    char detail[256] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    return weft__fail(rc, "%s: %s failed after the convolution was enqueued: %s (%d)%s%s", OP, what,
                      cudnnGetErrorString(s), (int)s, detail[0] ? ": " : "", detail);
}

static int cuda_fail(const char *what, cudaError_t e)
{
    cudaGetLastError(); /* a refused call is not sticky: clear it */
    return weft__fail(weft__cuda_status(e), "%s: %s failed: %s (%s)", OP, what, cudaGetErrorName(e),
                      cudaGetErrorString(e));
}

static const char *type_name(weft_dtype t)
{
    return t == WEFT_DTYPE_BF16 ? "bf16" : t == WEFT_DTYPE_F16 ? "fp16" : "fp32";
}

/* "n 32 h 56 w 56 c 64 -> k 64, 3x3 stride 1x1 pad 1x1 dilation 1x1
 * groups 1, bf16, relu": the shape and types a refusal names. */
static void describe(char *buf, size_t size, const weft__conv_args *a)
{
    snprintf(buf, size,
             "n %zu h %zu w %zu c %zu -> k %zu, %zux%zu stride %zux%zu pad %zux%zu dilation "
             "%zux%zu groups %zu, %s%s, act %s",
             a->n, a->h, a->w, a->c, a->k, a->r, a->s, a->stride_h, a->stride_w, a->pad_h, a->pad_w,
             a->dil_h, a->dil_w, a->groups, type_name(a->dtype), a->allow_tf32 ? " (tf32)" : "",
             a->act == WEFT_CONV_ACT_RELU ? "relu" : "none");
}

/* ---- plans ---------------------------------------------------------------- */

/* Everything the descriptors and the heuristic depend on. */
typedef weft__conv_key plan_key;

/* Algorithms, best first, with the workspace each needs; choice is the
 * first not known to be refused. */
typedef struct algo_list {
    int n;
    cudnnConvolutionFwdAlgo_t algo[MAX_ALGOS];
    size_t ws[MAX_ALGOS];
    atomic_int choice;
} algo_list;

typedef struct plan {
    plan_key key;
    cudnnTensorDescriptor_t x, y, bias;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    cudnnActivationDescriptor_t act;
    algo_list fused;     /* for cudnnConvolutionBiasActivationForward */
    algo_list plain;     /* for cudnnConvolutionForward, the split path */
    atomic_int split;    /* the fused call refused every algorithm: split from now on */
    char split_why[256]; /* cuDNN's last refusal then: written once, before split */
    struct plan *next;
} plan;

static _Atomic(plan *) plan_buckets[BUCKETS];
static weft__lock plan_lock = WEFT__LOCK_INIT;
static atomic_ullong plan_hits, plan_misses, split_calls;
static _Atomic(const char *) last_split_why;

const char *weft__conv_cuda_last_split_why(void)
{
    const char *w = atomic_load_explicit(&last_split_why, memory_order_acquire);
    return w ? w : "";
}

void weft__conv_cuda_plan_stats(unsigned long long *hits, unsigned long long *misses,
                                unsigned long long *split)
{
    *hits = atomic_load(&plan_hits);
    *misses = atomic_load(&plan_misses);
    *split = atomic_load(&split_calls);
}

static unsigned key_hash(const plan_key *k)
{
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return (unsigned)(h % BUCKETS);
}

static plan *plan_find(plan *p, const plan_key *k)
{
    for (; p; p = p->next)
        if (memcmp(&p->key, k, sizeof *k) == 0)
            return p;
    return NULL;
}

static cudnnDataType_t dnn_type(weft_dtype t)
{
    return t == WEFT_DTYPE_BF16  ? CUDNN_DATA_BFLOAT16
           : t == WEFT_DTYPE_F16 ? CUDNN_DATA_HALF
                                 : CUDNN_DATA_FLOAT;
}

static void plan_free(plan *p)
{
    if (!p)
        return;
    if (p->x)
        cudnnDestroyTensorDescriptor(p->x);
    if (p->y)
        cudnnDestroyTensorDescriptor(p->y);
    if (p->bias)
        cudnnDestroyTensorDescriptor(p->bias);
    if (p->w)
        cudnnDestroyFilterDescriptor(p->w);
    if (p->conv)
        cudnnDestroyConvolutionDescriptor(p->conv);
    if (p->act)
        cudnnDestroyActivationDescriptor(p->act);
    free(p);
}

#define DNN(call)                                                                                  \
    do {                                                                                           \
        cudnnStatus_t s_ = (call);                                                                 \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                          \
            rc = dnn_fail(#call, s_);                                                              \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* The descriptors of a call (cuDNN counts in int: conv.c's checks do not
 * bound sizes that far, so weft__conv_cuda has). */
static int make_descriptors(plan *p, const weft__conv_args *a)
{
    int rc = WEFT_OK;
    cudnnDataType_t t = dnn_type(a->dtype);
    DNN(cudnnCreateTensorDescriptor(&p->x));
    DNN(cudnnCreateTensorDescriptor(&p->y));
    DNN(cudnnCreateTensorDescriptor(&p->bias));
    DNN(cudnnCreateFilterDescriptor(&p->w));
    DNN(cudnnCreateConvolutionDescriptor(&p->conv));
    DNN(cudnnCreateActivationDescriptor(&p->act));
    DNN(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NHWC, t, (int)a->n, (int)a->c, (int)a->h,
                                   (int)a->w));
    DNN(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NHWC, t, (int)a->n, (int)a->k, (int)a->oh,
                                   (int)a->ow));
    DNN(cudnnSetTensor4dDescriptor(p->bias, CUDNN_TENSOR_NCHW, t, 1, (int)a->k, 1, 1));
    DNN(cudnnSetFilter4dDescriptor(p->w, t, CUDNN_TENSOR_NHWC, (int)a->k, (int)(a->c / a->groups),
                                   (int)a->r, (int)a->s));
    DNN(cudnnSetConvolution2dDescriptor(p->conv, (int)a->pad_h, (int)a->pad_w, (int)a->stride_h,
                                        (int)a->stride_w, (int)a->dil_h, (int)a->dil_w,
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DNN(cudnnSetConvolutionGroupCount(p->conv, (int)a->groups));
    cudnnMathType_t math = a->dtype != WEFT_DTYPE_F32 ? CUDNN_TENSOR_OP_MATH
                           : a->allow_tf32            ? CUDNN_DEFAULT_MATH
                                                      : CUDNN_FMA_MATH;
    DNN(cudnnSetConvolutionMathType(p->conv, math));
    DNN(cudnnSetActivationDescriptor(
        p->act, a->act == WEFT_CONV_ACT_RELU ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
        CUDNN_PROPAGATE_NAN, 0.0));
    /* cuDNN's output size must be ours (conv.c's, the host's). */
    int dims[4];
    DNN(cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &dims[0], &dims[1], &dims[2],
                                              &dims[3]));
    if ((size_t)dims[0] != a->n || (size_t)dims[1] != a->k || (size_t)dims[2] != a->oh ||
        (size_t)dims[3] != a->ow)
        return weft__fail(WEFT_EDEVICE,
                          "%s: cuDNN's output is %d x %d x %d x %d (n k oh ow), weft's %zu x %zu x "
                          "%zu x %zu",
                          OP, dims[0], dims[1], dims[2], dims[3], a->n, a->k, a->oh, a->ow);
fail:
    return rc;
}

static int has_algo(const algo_list *l, cudnnConvolutionFwdAlgo_t algo)
{
    for (int i = 0; i < l->n; i++)
        if (l->algo[i] == algo)
            return 1;
    return 0;
}

static void add_algo(algo_list *l, cudnnConvolutionFwdAlgo_t algo, size_t ws)
{
    if (l->n < MAX_ALGOS && !has_algo(l, algo)) {
        l->algo[l->n] = algo;
        l->ws[l->n++] = ws;
    }
}

/* A new plan: descriptors and the algorithms the fused call may take, best
 * first, each fitting the workspace. */
static int make_plan(cudnnHandle_t h, const weft__conv_args *a, const plan_key *k, plan **out)
{
    char shape[256];
    plan *p = calloc(1, sizeof *p);
    int rc = WEFT_OK;
    if (!p)
        return weft__fail(WEFT_ENOMEM, "%s: out of memory for a plan", OP);
    p->key = *k;
    if ((rc = make_descriptors(p, a)) != WEFT_OK)
        goto fail;

    cudnnConvolutionFwdAlgoPerf_t perf[MAX_ALGOS];
    int returned = 0;
    DNN(cudnnGetConvolutionForwardAlgorithm_v7(h, p->x, p->w, p->conv, p->y, MAX_ALGOS, &returned,
                                               perf));
    const cudnnConvolutionFwdAlgo_t precomp = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    for (int i = 0; i < returned; i++) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > WORKSPACE)
            continue;
        add_algo(&p->plain, perf[i].algo, perf[i].memory);
        /* The identity activation is fused with IMPLICIT_PRECOMP_GEMM only. */
        if (a->act == WEFT_CONV_ACT_RELU || perf[i].algo == precomp)
            add_algo(&p->fused, perf[i].algo, perf[i].memory);
    }
    /* The heuristic may leave IMPLICIT_PRECOMP_GEMM out where it would
     * work: ask for it by name, last. */
    size_t need = 0;
    if (!has_algo(&p->fused, precomp) &&
        cudnnGetConvolutionForwardWorkspaceSize(h, p->x, p->w, p->conv, p->y, precomp, &need) ==
            CUDNN_STATUS_SUCCESS &&
        need <= WORKSPACE) {
        add_algo(&p->fused, precomp, need);
        add_algo(&p->plain, precomp, need);
    }
    if (p->fused.n == 0 && p->plain.n == 0) {
        describe(shape, sizeof shape, a);
        rc = weft__fail(WEFT_EINVAL,
                        "%s: cuDNN has no algorithm for %s within a workspace of %d MiB "
                        "(CUDNN_STATUS_NOT_SUPPORTED)",
                        OP, shape, WORKSPACE >> 20);
        goto fail;
    }
    atomic_init(&p->fused.choice, 0);
    atomic_init(&p->plain.choice, 0);
    atomic_init(&p->split, p->fused.n == 0);
    *out = p;
    return WEFT_OK;
fail:
    plan_free(p);
    return rc;
}

static int get_plan(cudnnHandle_t h, const weft__conv_args *a, const plan_key *k, plan **out)
{
    _Atomic(plan *) *bucket = &plan_buckets[key_hash(k)];
    plan *p = plan_find(atomic_load_explicit(bucket, memory_order_acquire), k);
    if (p) {
        atomic_fetch_add_explicit(&plan_hits, 1, memory_order_relaxed);
        *out = p;
        return WEFT_OK;
    }
    /* The heuristic runs outside the lock; two threads asking for the same
     * new plan both ask, and the first to publish wins. */
    plan *np = NULL;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode); /* the heuristic enqueues nothing */
    int rc = make_plan(h, a, k, &np);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (rc == WEFT_EINVAL && !strstr(weft_last_error(), "cuDNN has no algorithm")) {
        /* A descriptor or the heuristic refused the shape: say which. */
        char why[512], shape[256];
        snprintf(why, sizeof why, "%s", weft_last_error());
        describe(shape, sizeof shape, a);
        return weft__fail(rc, "%s: cuDNN does not support %s: %s", OP, shape, why);
    }
    if (rc != WEFT_OK)
        return rc;
    atomic_fetch_add_explicit(&plan_misses, 1, memory_order_relaxed);
    weft__lock_acquire(&plan_lock);
    p = plan_find(atomic_load_explicit(bucket, memory_order_relaxed), k);
    if (!p) {
        np->next = atomic_load_explicit(bucket, memory_order_relaxed);
        atomic_store_explicit(bucket, np, memory_order_release);
        p = np, np = NULL;
    }
    weft__lock_release(&plan_lock);
    plan_free(np);
    *out = p;
    return WEFT_OK;
}

/* ---- the call ------------------------------------------------------------ */

enum { REFUSED = 1 }; /* walk: every algorithm tried was NOT_SUPPORTED (or none fit) */

/* Runs the convolution through list (fused: the fused call; else the plain
 * convolution into out) with the first algorithm, from the list's choice
 * on, that this call's workspace holds and cuDNN accepts. The choice moves
 * past algorithms cuDNN refuses, but not past those skipped for want of a
 * workspace (another call may have one); when the fused call refuses every
 * algorithm with the full workspace, the plan splits from then on. cuDNN
 * refuses before it enqueues anything. WEFT_OK, REFUSED (with *tried, the
 * last refusal and its text), or the error. */
static int walk(cudnnHandle_t h, plan *p, algo_list *l, int fused, const weft__conv_args *a,
                void *ws, size_t ws_size, int *tried, cudnnStatus_t *refusal, char *why,
                size_t why_size)
{
    const float one = 1.0f, zero = 0.0f;
    int first = atomic_load_explicit(&l->choice, memory_order_relaxed);
    int only_refused = 1;
    for (int i = first; i < l->n; i++) {
        if (l->ws[i] > ws_size) {
            only_refused = 0;
            continue;
        }
        (*tried)++;
        cudnnStatus_t s =
            fused ? cudnnConvolutionBiasActivationForward(
                        h, &one, p->x, a->in, p->w, a->wt, p->conv, l->algo[i], ws, ws_size, &zero,
                        p->y, a->out, p->bias, a->bias, p->act, p->y, a->out)
                  : cudnnConvolutionForward(h, &one, p->x, a->in, p->w, a->wt, p->conv, l->algo[i],
                                            ws, ws_size, &zero, p->y, a->out);
        if (s == CUDNN_STATUS_SUCCESS) {
            /* A racing call may have moved the choice already. */
            int seen = first;
            while (only_refused && seen < i && !atomic_compare_exchange_weak(&l->choice, &seen, i))
                ;
            return WEFT_OK;
        }
        /* The fused call's BAD_PARAM counts as a refusal too: its rules
         * (types, layouts) are narrower than the convolution's, which
         * checks the same arguments again on the split path. */
        if (!not_supported(s) && !(fused && CUDNN_STATUS_CATEGORY(s) == CUDNN_STATUS_BAD_PARAM))
            return dnn_fail(
                fused ? "cudnnConvolutionBiasActivationForward" : "cudnnConvolutionForward", s);
        *refusal = s;
        cudnnGetLastErrorString(why, why_size);
    }
    if (fused && only_refused && *tried > 0) {
        weft__lock_acquire(&plan_lock);
        if (!atomic_load_explicit(&p->split, memory_order_acquire)) {
            snprintf(p->split_why, sizeof p->split_why, "%s (%d)%s%s",
                     cudnnGetErrorString(*refusal), (int)*refusal, why[0] ? ": " : "", why);
            atomic_store_explicit(&p->split, 1, memory_order_release);
            atomic_store_explicit(&last_split_why, p->split_why, memory_order_release);
        }
        weft__lock_release(&plan_lock);
    }
    return REFUSED;
}

int weft__conv_cuda(void *stream_arg, const weft__conv_args *a)
{
    cudaStream_t stream = stream_arg;
    cudnnHandle_t h = NULL;
    void *ws = NULL;
    size_t ws_size = 0;
    int device, rc;
    cudaError_t e;
    char shape[256];

    /* cuDNN's descriptors take int sizes and its tensors int strides. */
    const size_t imax = 0x7fffffff;
    if (a->n * a->h * a->w * a->c > imax || a->n * a->oh * a->ow * a->k > imax ||
        a->k * a->r * a->s * (a->c / a->groups) > imax || a->pad_h > imax || a->pad_w > imax ||
        a->stride_h > imax || a->stride_w > imax || a->dil_h > imax || a->dil_w > imax) {
        describe(shape, sizeof shape, a);
        return weft__fail(WEFT_EINVAL,
                          "%s: cuDNN counts elements and sizes in int: %s is too large", OP, shape);
    }
    if ((e = cudaGetDevice(&device)) != cudaSuccess)
        return cuda_fail("cudaGetDevice", e);
    if ((rc = weft__cudnn_handle(OP, device, &h)) != WEFT_OK)
        return rc;
    enum cudaStreamCaptureStatus capture;
    if ((e = cudaStreamIsCapturing(stream, &capture)) != cudaSuccess)
        return cuda_fail("cudaStreamIsCapturing", e);
    if (capture == cudaStreamCaptureStatusNone &&
        (rc = weft__stream_workspace(OP, stream, device, &ws, &ws_size)) != WEFT_OK)
        return rc;

    cudnnStatus_t s = cudnnSetStream(h, stream);
    if (s != CUDNN_STATUS_SUCCESS)
        return dnn_fail("cudnnSetStream", s);
    /* The operation graph first (conv_graph.c); the legacy calls below
     * for the shapes it declines. */
    if ((rc = weft__conv_graph(h, device, a, ws, ws_size)) != WEFT__CONV_GRAPH_DECLINED)
        return rc;

    plan_key k;
    plan *p = NULL;
    weft__conv_key_fill(&k, a, device);
    if ((rc = get_plan(h, a, &k, &p)) != WEFT_OK)
        return rc;

    cudnnStatus_t refusal = CUDNN_STATUS_NOT_SUPPORTED;
    char why[256] = "";
    int tried = 0;
    if (!atomic_load_explicit(&p->split, memory_order_acquire)) {
        rc = walk(h, p, &p->fused, 1, a, ws, ws_size, &tried, &refusal, why, sizeof why);
        if (rc != REFUSED)
            return rc;
    }
    /* The fused call refused this shape: cuDNN's convolution, then its bias
     * add and ReLU, as separate passes over the output. */
    int tried_plain = 0;
    rc = walk(h, p, &p->plain, 0, a, ws, ws_size, &tried_plain, &refusal, why, sizeof why);
    if (rc == WEFT_OK) {
        atomic_fetch_add_explicit(&split_calls, 1, memory_order_relaxed);
        const float one = 1.0f, zero = 0.0f;
        /* Past this point the convolution is enqueued: a failure is the
         * device's, not the arguments'. */
        s = cudnnAddTensor(h, &one, p->bias, a->bias, &one, p->y, a->out);
        if (s != CUDNN_STATUS_SUCCESS)
            return dnn_fail_after("cudnnAddTensor (the bias)", s);
        if (a->act == WEFT_CONV_ACT_RELU &&
            (s = cudnnActivationForward(h, p->act, &one, p->y, a->out, &zero, p->y, a->out)) !=
                CUDNN_STATUS_SUCCESS)
            return dnn_fail_after("cudnnActivationForward (the ReLU)", s);
        return WEFT_OK;
    }
    if (rc != REFUSED)
        return rc;
    describe(shape, sizeof shape, a);
    if (tried + tried_plain == 0)
        return weft__fail(WEFT_EINVAL,
                          "%s: cuDNN has no algorithm for %s that runs without a workspace "
                          "(inside graph capture, or past %d streams with one)",
                          OP, shape, WEFT__MAX_WORKSPACES);
    return weft__fail(WEFT_EINVAL,
                      "%s: cuDNN does not support %s: its fused convolution-bias-activation "
                      "refused %d algorithms and its convolution %d (last: %s (%d)%s%s)",
                      OP, shape, tried, tried_plain, cudnnGetErrorString(refusal), (int)refusal,
                      why[0] ? ": " : "", why);
}
