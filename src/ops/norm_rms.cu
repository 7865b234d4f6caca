/*
 * norm_rms.cu - the held path of RMSNorm (norm_held.cuh's launch_held,
 * which norm.cu calls).
 */
#include "ops/norm_held.cuh"

namespace weft_ops
{

WEFT_NORM_HELD(, NORM_RMS)

} // namespace weft_ops
