/*
 * conv_no_cudnn.c - weft_conv2d's GPU path in a CUDA build that found no
 * cuDNN: the call is refused with the reason, so that the rest of the
 * library (weft_conv2d's host reference and weft_conv2d_fold_bn on either
 * backend) still builds and works. The build takes conv_cudnn.c instead
 * when it finds cuDNN.
 */
#include "core/error.h"
#include "ops/conv.h"

int weft__conv_cuda(void *stream, const weft__conv_args *a)
{
    (void)stream, (void)a;
    return weft__fail(WEFT_EINVAL,
                      "weft_conv2d: built without cuDNN: a stream needs cuDNN 9 (its header "
                      "cudnn.h and libcudnn); install it and configure again");
}

void weft__conv_cuda_plan_stats(unsigned long long *hits, unsigned long long *misses,
                                unsigned long long *split)
{
    *hits = 0, *misses = 0, *split = 0;
}

const char *weft__conv_cuda_last_split_why(void)
{
    return "";
}

void weft__conv_cuda_graph_stats(unsigned long long *calls, unsigned long long *plans)
{
    *calls = 0, *plans = 0;
}

const char *weft__conv_cuda_graph_why(void)
{
    return "";
}

void weft__conv_cuda_use_graph(int on)
{
    (void)on;
}
