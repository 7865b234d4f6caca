/*
 * norm_rms.cu - the held path of RMSNorm (norm_launch.cuh's launch_held,
 * which norm.cu calls).
 */
#include "ops/norm_launch.cuh"

namespace weft_ops
{

WEFT_NORM_HELD(, NORM_RMS)

} // namespace weft_ops
