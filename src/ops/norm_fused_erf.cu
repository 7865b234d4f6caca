/*
 * norm_fused_erf.cu - the held path of bias+GELU+residual+LayerNorm with
 * the exact GELU (norm_launch.cuh's launch_held, which norm.cu calls); the
 * tanh form's is norm_fused_tanh.cu, so that the two compile in parallel.
 */
#include "ops/norm_launch.cuh"

namespace weft_ops
{

WEFT_NORM_HELD(, NORM_GELU_ERF_LAYER)

} // namespace weft_ops
