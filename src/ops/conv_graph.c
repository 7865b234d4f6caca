/*
 * conv_graph.c - weft_conv2d as one cuDNN operation graph:
 *   x, w -> convolution (fp32) -> + bias -> ReLU -> y
 * built with cuDNN's backend (graph) API, whose engines compile the three
 * operations into one kernel that adds the bias and clamps in its
 * epilogue. This is how cuDNN reaches its Hopper convolution kernels; the
 * legacy fused call (cudnnConvolutionBiasActivationForward, conv_cudnn.c)
 * runs older ones, at about a third of the speed on ResNet's 3x3 layers
 * (bench/RESULTS.md, "Convolution"). conv_cudnn.c tries this path first
 * and keeps the legacy one for the shapes no engine of the graph takes.
 *
 * Tensors as cuDNN's graph API describes them: dimensions in N, C, H, W
 * order with NHWC strides (the filter KRSC); the intermediate results are
 * virtual fp32 tensors that never reach memory.
 *
 * Engines: those cuDNN's heuristic (mode A, then its fallback list) ranks
 * first, less any whose numerical notes break weft_conv2d's promises:
 * reduced-precision (fp16) accumulation, Winograd and FFT transforms, and
 * for fp32 without allow_tf32 the tensor cores' TF32 (or inputs
 * converted down). The first few that finalize are kept, best first, with
 * the workspace each needs; a call takes the first its workspace holds
 * (inside a capture there is none, so a captured call takes one that
 * needs none, or declines).
 *
 * Plans belong to a thread: an execution plan is finalized against a
 * cuDNN handle, and handles are per thread (cudnn_context.c), so each
 * thread keeps its own list, which goes with the thread. Making one costs
 * the heuristic and a few finalizations (cuDNN may compile a kernel then);
 * the GPU test prints a first call's time.
 *
 * WEFT_CONV_GRAPH=0 in the environment turns this path off (every call
 * then runs the legacy way), for comparison.
 */
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "ops/conv.h"
#include "ops/conv_graph.h"

static const char OP[] = "weft_conv2d";

typedef cudnnBackendDescriptor_t dnn_desc;

enum {
    /* the tensors' unique ids in the graph */
    UID_X = 1,
    UID_W,
    UID_BIAS,
    UID_Y,
    UID_CONV, /* virtual: the convolution's fp32 sums */
    UID_SUM,  /* virtual: + bias, before the ReLU */
    MAX_PLANS = 4,
    MAX_CONFIGS = 16 /* engine configurations asked of the heuristic */
};

/* What the graph depends on: the convolution and its pointers' alignment;
 * compared bytewise, so zeroed before filled. */
typedef struct graph_key {
    weft__conv_key conv;
    int64_t align;
} graph_key;

/* A shape's execution plans, best first (none: the graph declines it). */
typedef struct graph_plan {
    graph_key key;
    int n;
    dnn_desc exec[MAX_PLANS];
    int64_t ws[MAX_PLANS]; /* INT64_MAX once cuDNN refused to run it */
    struct graph_plan *next;
} graph_plan;

static _Thread_local graph_plan *my_plans;
static pthread_key_t plans_key;
static pthread_once_t plans_once = PTHREAD_ONCE_INIT;
static int plans_key_rc;

static atomic_ullong graph_calls, graph_plans;
static atomic_int graph_on = -1; /* -1: not yet read from the environment */
static _Atomic(const char *) last_why;

void weft__conv_cuda_graph_stats(unsigned long long *calls, unsigned long long *plans)
{
    *calls = atomic_load(&graph_calls);
    *plans = atomic_load(&graph_plans);
}

void weft__conv_cuda_use_graph(int on)
{
    atomic_store(&graph_on, on != 0);
}

const char *weft__conv_cuda_graph_why(void)
{
    const char *w = atomic_load_explicit(&last_why, memory_order_acquire);
    return w ? w : "";
}

static int wanted(void)
{
    int on = atomic_load_explicit(&graph_on, memory_order_relaxed);
    if (on < 0) {
        const char *e = getenv("WEFT_CONV_GRAPH");
        on = !(e && !strcmp(e, "0"));
        atomic_store(&graph_on, on);
    }
    return on;
}

/* Why the graph declined a shape, kept for the process's life: one string
 * per shape a thread's graph declines, and a reader may hold the last. */
static void declined(const char *step, cudnnStatus_t s)
{
    char detail[256] = "", buf[512];
    cudnnGetLastErrorString(detail, sizeof detail);
    snprintf(buf, sizeof buf, "%s: %s (%d)%s%s", step, cudnnGetErrorString(s), (int)s,
             detail[0] ? ": " : "", detail);
    char *keep = strdup(buf);
    if (keep)
        atomic_store_explicit(&last_why, keep, memory_order_release);
}

static void drop_plans(void *p)
{
    for (graph_plan *g = p, *next; g; g = next) {
        next = g->next;
        for (int i = 0; i < g->n; i++)
            cudnnBackendDestroyDescriptor(g->exec[i]);
        free(g);
    }
}

static void make_key(void)
{
    plans_key_rc = pthread_key_create(&plans_key, drop_plans);
}

/* The largest power of two up to 16 that divides every pointer. */
static int64_t alignment(const weft__conv_args *a)
{
    uintptr_t bits = (uintptr_t)a->in | (uintptr_t)a->wt | (uintptr_t)a->bias | (uintptr_t)a->out;
    int64_t align = 16;
    while (align > 1 && (bits & (uintptr_t)(align - 1)))
        align >>= 1;
    return align;
}

static void fill_key(graph_key *k, const weft__conv_args *a, int device)
{
    memset(k, 0, sizeof *k);
    weft__conv_key_fill(&k->conv, a, device);
    k->align = alignment(a);
}

/* ---- building the graph ------------------------------------------------- */

/* The descriptors of one graph; each NULL until made. */
typedef struct graph_parts {
    dnn_desc x, w, bias, y, conv_out, sum, conv, op_conv, add, op_add, relu, op_relu, graph, heur;
} graph_parts;

static void parts_free(graph_parts *g)
{
    dnn_desc all[] = {g->heur, g->graph, g->op_relu,  g->relu, g->op_add, g->add, g->op_conv,
                      g->conv, g->sum,   g->conv_out, g->y,    g->bias,   g->w,   g->x};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i])
            cudnnBackendDestroyDescriptor(all[i]);
}

#define TRY(step, call)                                                                            \
    do {                                                                                           \
        cudnnStatus_t s_ = (call);                                                                 \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                          \
            *why = step, *status = s_;                                                             \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

/* Sets attribute a of d to the descriptor v. */
static cudnnStatus_t set_desc(dnn_desc d, cudnnBackendAttributeName_t a, dnn_desc v)
{
    return cudnnBackendSetAttribute(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

static int tensor(dnn_desc *t, int64_t uid, cudnnDataType_t type, const int64_t dims[4],
                  const int64_t strides[4], int64_t align, bool is_virtual, const char **why,
                  cudnnStatus_t *status)
{
    TRY("tensor", cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, t));
    TRY("tensor",
        cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
    TRY("tensor",
        cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
    TRY("tensor",
        cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides));
    TRY("tensor",
        cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    TRY("tensor", cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64,
                                           1, &align));
    TRY("tensor", cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1,
                                           &is_virtual));
    TRY("tensor", cudnnBackendFinalize(*t));
    return 0;
}

/* A pointwise operation y = mode(x[, b]) in fp32. */
static int pointwise(dnn_desc *pw, dnn_desc *op, cudnnPointwiseMode_t mode, dnn_desc x, dnn_desc b,
                     dnn_desc y, const char **why, cudnnStatus_t *status)
{
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    TRY("pointwise", cudnnBackendCreateDescriptor(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, pw));
    TRY("pointwise", cudnnBackendSetAttribute(*pw, CUDNN_ATTR_POINTWISE_MODE,
                                              CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
    TRY("pointwise", cudnnBackendSetAttribute(*pw, CUDNN_ATTR_POINTWISE_MATH_PREC,
                                              CUDNN_TYPE_DATA_TYPE, 1, &prec));
    TRY("pointwise", cudnnBackendFinalize(*pw));
    TRY("pointwise",
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, op));
    TRY("pointwise", set_desc(*op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *pw));
    TRY("pointwise", set_desc(*op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x));
    if (b)
        TRY("pointwise", set_desc(*op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b));
    TRY("pointwise", set_desc(*op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y));
    TRY("pointwise", cudnnBackendFinalize(*op));
    return 0;
}

/* The operation graph of a, and the heuristic's verdict on it (mode). */
static int build(graph_parts *g, cudnnHandle_t h, const weft__conv_args *a, int64_t align,
                 cudnnBackendHeurMode_t mode, const char **why, cudnnStatus_t *status)
{
    cudnnDataType_t io = a->dtype == WEFT_DTYPE_BF16  ? CUDNN_DATA_BFLOAT16
                         : a->dtype == WEFT_DTYPE_F16 ? CUDNN_DATA_HALF
                                                      : CUDNN_DATA_FLOAT;
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    int64_t n = (int64_t)a->n, c = (int64_t)a->c, k = (int64_t)a->k, cg = c / (int64_t)a->groups;
    int64_t h_ = (int64_t)a->h, w_ = (int64_t)a->w, r = (int64_t)a->r, s = (int64_t)a->s;
    int64_t oh = (int64_t)a->oh, ow = (int64_t)a->ow;
    const int64_t x_dims[4] = {n, c, h_, w_}, x_str[4] = {h_ * w_ * c, 1, w_ * c, c};
    const int64_t w_dims[4] = {k, cg, r, s}, w_str[4] = {r * s * cg, 1, s * cg, cg};
    const int64_t y_dims[4] = {n, k, oh, ow}, y_str[4] = {oh * ow * k, 1, ow * k, k};
    const int64_t b_dims[4] = {1, k, 1, 1}, b_str[4] = {k, 1, k, k};
    int relu = a->act == WEFT_CONV_ACT_RELU;

    if (tensor(&g->x, UID_X, io, x_dims, x_str, align, false, why, status) ||
        tensor(&g->w, UID_W, io, w_dims, w_str, align, false, why, status) ||
        tensor(&g->bias, UID_BIAS, io, b_dims, b_str, align, false, why, status) ||
        tensor(&g->y, UID_Y, io, y_dims, y_str, align, false, why, status) ||
        tensor(&g->conv_out, UID_CONV, f32, y_dims, y_str, 16, true, why, status) ||
        (relu && tensor(&g->sum, UID_SUM, f32, y_dims, y_str, 16, true, why, status)))
        return -1;

    int64_t dims = 2, dil[2] = {(int64_t)a->dil_h, (int64_t)a->dil_w};
    int64_t stride[2] = {(int64_t)a->stride_h, (int64_t)a->stride_w};
    int64_t pad[2] = {(int64_t)a->pad_h, (int64_t)a->pad_w};
    cudnnConvolutionMode_t cmode = CUDNN_CROSS_CORRELATION;
    TRY("convolution",
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &g->conv));
    TRY("convolution", cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
                                                CUDNN_TYPE_DATA_TYPE, 1, &f32));
    TRY("convolution", cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                                                CUDNN_TYPE_CONVOLUTION_MODE, 1, &cmode));
    TRY("convolution", cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS,
                                                CUDNN_TYPE_INT64, 1, &dims));
    TRY("convolution", cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_DILATIONS,
                                                CUDNN_TYPE_INT64, 2, dil));
    TRY("convolution", cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
                                                CUDNN_TYPE_INT64, 2, stride));
    TRY("convolution", cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
                                                CUDNN_TYPE_INT64, 2, pad));
    TRY("convolution", cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
                                                CUDNN_TYPE_INT64, 2, pad));
    TRY("convolution", cudnnBackendFinalize(g->conv));

    float one = 1.0f, zero = 0.0f;
    TRY("convolution", cudnnBackendCreateDescriptor(
                           CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, &g->op_conv));
    TRY("convolution", set_desc(g->op_conv, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, g->x));
    TRY("convolution", set_desc(g->op_conv, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, g->w));
    TRY("convolution",
        set_desc(g->op_conv, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, g->conv_out));
    TRY("convolution",
        set_desc(g->op_conv, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, g->conv));
    TRY("convolution",
        cudnnBackendSetAttribute(g->op_conv, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                 CUDNN_TYPE_FLOAT, 1, &one));
    TRY("convolution",
        cudnnBackendSetAttribute(g->op_conv, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                                 CUDNN_TYPE_FLOAT, 1, &zero));
    TRY("convolution", cudnnBackendFinalize(g->op_conv));

    if (pointwise(&g->add, &g->op_add, CUDNN_POINTWISE_ADD, g->conv_out, g->bias,
                  relu ? g->sum : g->y, why, status) ||
        (relu && pointwise(&g->relu, &g->op_relu, CUDNN_POINTWISE_RELU_FWD, g->sum, NULL, g->y, why,
                           status)))
        return -1;

    dnn_desc ops[3] = {g->op_conv, g->op_add, g->op_relu};
    TRY("operation graph",
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &g->graph));
    TRY("operation graph", cudnnBackendSetAttribute(g->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
                                                    CUDNN_TYPE_HANDLE, 1, &h));
    TRY("operation graph",
        cudnnBackendSetAttribute(g->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, relu ? 3 : 2, ops));
    TRY("operation graph", cudnnBackendFinalize(g->graph));

    TRY("heuristic", cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &g->heur));
    TRY("heuristic", set_desc(g->heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g->graph));
    TRY("heuristic", cudnnBackendSetAttribute(g->heur, CUDNN_ATTR_ENGINEHEUR_MODE,
                                              CUDNN_TYPE_HEUR_MODE, 1, &mode));
    TRY("heuristic", cudnnBackendFinalize(g->heur));
    return 0;
}

/* Whether an engine keeps weft_conv2d's promises about its arithmetic. */
static int engine_allowed(dnn_desc cfg, const weft__conv_args *a)
{
    dnn_desc engine = NULL;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t n = 0;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) !=
        CUDNN_STATUS_SUCCESS)
        return 0;
    int ok =
        cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                 &n, &engine) == CUDNN_STATUS_SUCCESS &&
        cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                 CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n,
                                 notes) == CUDNN_STATUS_SUCCESS;
    int strict_fp32 = a->dtype == WEFT_DTYPE_F32 && !a->allow_tf32;
    for (int64_t i = 0; ok && i < n; i++)
        switch (notes[i]) {
        case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:
        case CUDNN_NUMERICAL_NOTE_FFT:
        case CUDNN_NUMERICAL_NOTE_WINOGRAD:
        case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4:
        case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6:
        case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13:
            ok = 0;
            break;
        case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
        case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
            ok = !strict_fp32;
            break;
        default:
            break;
        }
    cudnnBackendDestroyDescriptor(engine);
    return ok;
}

/* Finalizes the heuristic's configurations, best first, into p until it
 * holds MAX_PLANS. Returns the last refusal's step in *why. */
static void take_plans(graph_plan *p, cudnnHandle_t h, dnn_desc heur, const weft__conv_args *a,
                       const char **why, cudnnStatus_t *status)
{
    dnn_desc cfg[MAX_CONFIGS] = {0};
    int64_t count = 0;
    int made = 0;
    for (; made < MAX_CONFIGS; made++)
        if ((*status = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                                                    &cfg[made])) != CUDNN_STATUS_SUCCESS) {
            *why = "engine configuration";
            goto out;
        }
    if ((*status = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, MAX_CONFIGS, &count,
                                            cfg)) != CUDNN_STATUS_SUCCESS) {
        *why = "heuristic results";
        goto out;
    }
    if (count == 0)
        *why = "heuristic (no engine)", *status = CUDNN_STATUS_NOT_SUPPORTED;
    for (int64_t i = 0; i < count && p->n < MAX_PLANS; i++) {
        if (!engine_allowed(cfg[i], a)) {
            *why = "heuristic (no engine with fp32 sums and no transform)";
            *status = CUDNN_STATUS_NOT_SUPPORTED;
            continue;
        }
        dnn_desc exec = NULL;
        int64_t ws = 0, got = 0;
        cudnnStatus_t s =
            cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &exec);
        if (s == CUDNN_STATUS_SUCCESS)
            s = cudnnBackendSetAttribute(exec, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE,
                                         1, &h);
        if (s == CUDNN_STATUS_SUCCESS)
            s = set_desc(exec, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg[i]);
        if (s == CUDNN_STATUS_SUCCESS)
            s = cudnnBackendFinalize(exec);
        if (s == CUDNN_STATUS_SUCCESS)
            s = cudnnBackendGetAttribute(exec, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, &got, &ws);
        if (s != CUDNN_STATUS_SUCCESS) {
            *why = "execution plan", *status = s;
            if (exec)
                cudnnBackendDestroyDescriptor(exec);
            continue;
        }
        p->exec[p->n] = exec;
        p->ws[p->n++] = ws;
    }
out:
    for (int i = 0; i < made; i++)
        cudnnBackendDestroyDescriptor(cfg[i]);
}

/* A new plan for a's shape: its execution plans, or none (then *why and
 * *status say why the graph declines it). NULL only when out of memory. */
static graph_plan *make_plan(cudnnHandle_t h, const weft__conv_args *a, const graph_key *k,
                             const char **why, cudnnStatus_t *status)
{
    graph_plan *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->key = *k;
    const cudnnBackendHeurMode_t modes[] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0] && p->n == 0; m++) {
        graph_parts g = {0};
        if (build(&g, h, a, k->align, modes[m], why, status) == 0)
            take_plans(p, h, g.heur, a, why, status);
        parts_free(&g);
    }
    return p;
}

/* ---- the call ------------------------------------------------------------ */

static graph_plan *find_plan(const graph_key *k)
{
    for (graph_plan *p = my_plans; p; p = p->next)
        if (memcmp(&p->key, k, sizeof *k) == 0)
            return p;
    return NULL;
}

static int get_plan(cudnnHandle_t h, const weft__conv_args *a, const graph_key *k, graph_plan **out)
{
    graph_plan *p = find_plan(k);
    if (p) {
        *out = p;
        return WEFT_OK;
    }
    pthread_once(&plans_once, make_key);
    if (plans_key_rc != 0)
        return weft__fail(WEFT_EDEVICE, "%s: pthread_key_create failed", OP);
    const char *why = "";
    cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
    /* Making a plan enqueues nothing, but cuDNN may allocate: inside a
     * capture the thread relaxes it meanwhile. */
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    p = make_plan(h, a, k, &why, &status);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (!p)
        return weft__fail(WEFT_ENOMEM, "%s: out of memory for a plan", OP);
    if (p->n == 0)
        declined(why, status);
    p->next = my_plans;
    my_plans = p;
    if (pthread_setspecific(plans_key, my_plans) != 0)
        return weft__fail(WEFT_EDEVICE, "%s: pthread_setspecific failed", OP);
    atomic_fetch_add_explicit(&graph_plans, 1, memory_order_relaxed);
    *out = p;
    return WEFT_OK;
}

/* Runs exec over a's tensors. */
static cudnnStatus_t execute(cudnnHandle_t h, dnn_desc exec, const weft__conv_args *a, void *ws)
{
    int64_t uids[4] = {UID_X, UID_W, UID_BIAS, UID_Y};
    void *ptrs[4] = {(void *)a->in, (void *)a->wt, (void *)a->bias, a->out};
    dnn_desc pack = NULL;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 4,
                                     uids);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                     CUDNN_TYPE_VOID_PTR, 4, ptrs);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                     1, &ws);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendFinalize(pack);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendExecute(h, exec, pack);
    if (pack)
        cudnnBackendDestroyDescriptor(pack);
    return s;
}

int weft__conv_graph(cudnnHandle_t h, int device, const weft__conv_args *a, void *ws,
                     size_t ws_size)
{
    if (!wanted())
        return WEFT__CONV_GRAPH_DECLINED;
    graph_key k;
    graph_plan *p = NULL;
    int rc;
    fill_key(&k, a, device);
    if ((rc = get_plan(h, a, &k, &p)) != WEFT_OK)
        return rc;
    for (int i = 0; i < p->n; i++) {
        if ((uint64_t)p->ws[i] > ws_size)
            continue;
        cudnnStatus_t s = execute(h, p->exec[i], a, ws);
        if (s == CUDNN_STATUS_SUCCESS) {
            atomic_fetch_add_explicit(&graph_calls, 1, memory_order_relaxed);
            return WEFT_OK;
        }
        if (CUDNN_STATUS_CATEGORY(s) != CUDNN_STATUS_NOT_SUPPORTED &&
            CUDNN_STATUS_CATEGORY(s) != CUDNN_STATUS_BAD_PARAM) {
            char detail[256] = "";
            cudnnGetLastErrorString(detail, sizeof detail);
            return weft__fail(s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED ||
                                      s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED
                                  ? WEFT_ENOMEM
                                  : WEFT_EDEVICE,
                              "%s: cudnnBackendExecute failed: %s (%d)%s%s", OP,
                              cudnnGetErrorString(s), (int)s, detail[0] ? ": " : "", detail);
        }
        /* Refused before anything was enqueued: never this engine again. */
        declined("execute", s);
        p->ws[i] = INT64_MAX;
    }
    return WEFT__CONV_GRAPH_DECLINED;
}
