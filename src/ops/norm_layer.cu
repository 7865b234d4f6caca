/*
 * norm_layer.cu - the held path of LayerNorm, with or without the
 * residual add in front (norm_launch.cuh's launch_held, which norm.cu
 * calls).
 */
#include "ops/norm_launch.cuh"

namespace weft_ops
{

WEFT_NORM_HELD(, NORM_LAYER)

} // namespace weft_ops
