/*
 * norm_rms_fp8.cu - RMSNorm into FP8 (weft_rmsnorm_fp8) on the GPU: its
 * launch (norm_launch.cuh's launch_norm_rows, which norm.cu calls) with
 * every kernel it takes - held, staged and in register tiles - in a
 * translation unit of its own, so that norm.cu's kernels compile as they
 * would without it.
 */
#include "ops/norm_launch.cuh"

namespace weft_ops
{

WEFT_NORM_HELD(, NORM_RMS_FP8)
WEFT_NORM_FP8_ROWS()

} // namespace weft_ops
