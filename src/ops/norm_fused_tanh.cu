/*
 * norm_fused_tanh.cu - the held path of bias+GELU+residual+LayerNorm with
 * the tanh GELU (norm_launch.cuh's launch_held, which norm.cu calls).
 */
#include "ops/norm_launch.cuh"

namespace weft_ops
{

WEFT_NORM_HELD(, NORM_GELU_TANH_LAYER)

} // namespace weft_ops
