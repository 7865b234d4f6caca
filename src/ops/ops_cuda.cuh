/*
 * ops_cuda.cuh - what every operator kernel includes: its element types
 * and vector access (elements.cuh), the activations (activations.cuh),
 * Philox for dropout (philox.cuh), the walks of the elementwise ops
 * (walks.cuh), the asynchronous copies into shared memory (cp_async.cuh)
 * and what the launchers share (launch.cuh). The row operators'
 * reductions are reduce.cuh's, their plans and row access rows.cuh's.
 *
 * The library keeps the kernels it dispatches, and its comments the rule
 * each choice follows; the forms it does not dispatch, and the
 * measurements behind the rules, are bench/ops/'s (its README's table).
 */
#ifndef WEFT_OPS_CUDA_CUH
#define WEFT_OPS_CUDA_CUH

#include <type_traits>

#include "ops/activations.cuh"
#include "ops/cp_async.cuh"
#include "ops/elements.cuh"
#include "ops/launch.cuh"
#include "ops/philox.cuh"
#include "ops/walks.cuh"

#endif
