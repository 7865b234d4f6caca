/*
 * walks.cuh - how an elementwise kernel's threads cover a rows x cols
 * tensor of V-element chunks: chunk_walk and row_walk (grid-stride, the
 * offsets formed from the row and chunk), tensor_walk (grid-stride, the
 * offsets moved by constants), chunk_once (a thread a chunk). Each kernel
 * takes the walk as a template parameter; its launcher picks the walk.
 */
#ifndef WEFT_OPS_WALKS_CUH
#define WEFT_OPS_WALKS_CUH

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

namespace weft_ops
{

/* A grid-stride walk over the chunks of rows x chunks_per_row: each
 * thread starts at its global index and moves by the grid's size, which is
 * added as whole rows plus a remainder, so no division happens in the
 * loop. */
struct chunk_walk {
    size_t row, chunk, rows, per_row, step_rows, step_chunks;

    __device__ chunk_walk(size_t rows_, size_t per_row_) : rows(rows_), per_row(per_row_)
    {
        size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        size_t step = (size_t)gridDim.x * blockDim.x;
        row = g / per_row;
        chunk = g % per_row;
        step_rows = step / per_row;
        step_chunks = step % per_row;
    }

    __device__ __forceinline__ bool more() const
    {
        return row < rows;
    }

    __device__ __forceinline__ void next()
    {
        row += step_rows;
        chunk += step_chunks;
        if (chunk >= per_row) {
            chunk -= per_row;
            row++;
        }
    }
};

/*
 * chunk_walk over the V-element chunks of a rows x cols tensor (cols a
 * multiple of V) with tensor_walk's face: the chunk's column, and its
 * element offset in two tensors whose rows lie `stride` and `stride2`
 * elements apart, formed from the row and the chunk at each step - a
 * multiply where tensor_walk adds. Yet bias + GELU + residual is faster
 * in bf16 on it. In the SASS its bf16 loop is the longer, and only
 * tensor_walk's reloads pointers from constant memory at the top of each
 * step; SwiGLU's two loops differ in length alike, both reload a pointer,
 * and run at the same speed: the reloads may be what costs, the length is
 * not. Rows shorter than V have no chunks to walk.
 */
struct row_walk {
    chunk_walk w;
    size_t stride, stride2, at, at2, col;
    unsigned v;

    __device__ row_walk(size_t rows, size_t cols, size_t stride_, size_t stride2_, unsigned v_)
        : w(cols / v_ ? rows : 0, cols / v_ ? cols / v_ : 1), stride(stride_), stride2(stride2_),
          v(v_)
    {
        place();
    }
    __device__ __forceinline__ void place()
    {
        col = w.chunk * v;
        at = w.row * stride + col;
        at2 = w.row * stride2 + col;
    }
    __device__ __forceinline__ bool more() const
    {
        return w.more();
    }
    __device__ __forceinline__ void next()
    {
        w.next();
        place();
    }
};

/*
 * A grid-stride walk over the V-element chunks of a rows x cols tensor
 * (cols a multiple of V). It keeps the chunk's column and its element
 * offset in two tensors whose rows lie `stride` and `stride2` elements
 * apart (an op's output and input, say; the same stride twice costs
 * nothing, the compiler merges them), and moves them by constants worked
 * out once, so a step is a few adds and an address needs no multiply
 * (chunk_walk forms row * stride + chunk for each). I is the offset type:
 * uint32_t where fits32() allows, which makes each address one
 * instruction, else size_t.
 */
template <typename I> struct tensor_walk {
    I at, at2, end, col, cols, step_at, step_at2, step_col, wrap, wrap2;

    __device__ tensor_walk(size_t rows, size_t cols_, size_t stride, size_t stride2, unsigned v)
    {
        size_t per_row = cols_ / v;
        size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        size_t step = (size_t)gridDim.x * blockDim.x;
        end = (I)(rows * stride);
        cols = (I)cols_;
        wrap = (I)(stride - cols_);
        wrap2 = (I)(stride2 - cols_);
        if (per_row == 0) { /* nothing to walk */
            at = end, at2 = 0, col = 0, step_at = step_at2 = step_col = 0;
            return;
        }
        col = (I)(g % per_row * v);
        at = (I)(g / per_row * stride) + col;
        at2 = (I)(g / per_row * stride2) + col;
        step_col = (I)(step % per_row * v);
        step_at = (I)(step / per_row * stride) + step_col;
        step_at2 = (I)(step / per_row * stride2) + step_col;
    }

    __device__ __forceinline__ bool more() const
    {
        return at < end;
    }

    __device__ __forceinline__ void next()
    {
        at += step_at;
        at2 += step_at2;
        col += step_col;
        if (col >= cols) {
            col -= cols;
            at += wrap;
            at2 += wrap2;
        }
    }

    /* Whether every offset the walk forms with `threads` threads in all
     * fits 32 bits: at most (rows + threads / chunks per row + 2) rows of
     * `stride`, the larger of the two. */
    static bool fits32(size_t rows, size_t cols, size_t stride, unsigned v, size_t threads)
    {
        const size_t lim = (size_t)1 << 32;
        size_t per_row = cols / v ? cols / v : 1;
        return rows < lim && stride < lim && threads < lim &&
               (rows + threads / per_row + 3) * stride < lim;
    }
};

/*
 * A thread a chunk: the walk of a grid that covers the tensor, one thread
 * for each V-element chunk, with tensor_walk's face. Its row and column
 * come from one 32-bit division, and the loop over it runs once. It is
 * torch.compile's shape of grid, and on it SwiGLU and bias + GELU +
 * residual run faster than one wave of resident blocks walking the
 * tensor. The division matters: bf16's bias + GELU + residual, whose GELU
 * issues most of its instructions, is slower on row_walk run once a
 * thread, whose start takes four 64-bit divisions. Offsets are 32-bit:
 * fits() says where the walk applies.
 */
struct chunk_once {
    uint32_t at, at2, col;
    bool left;

    __device__ chunk_once(size_t rows, size_t cols, size_t stride, size_t stride2, unsigned v)
    {
        const uint32_t per_row = (uint32_t)(cols / v);
        const uint32_t g = blockIdx.x * blockDim.x + threadIdx.x;
        left = per_row != 0 && g < (uint32_t)rows * per_row;
        const uint32_t row = left ? g / per_row : 0;
        col = (g - row * per_row) * v;
        at = row * (uint32_t)stride + col;
        at2 = row * (uint32_t)stride2 + col;
    }

    __device__ __forceinline__ bool more() const
    {
        return left;
    }

    __device__ __forceinline__ void next()
    {
        left = false;
    }

    /* Whether the chunks, the grid of `threads` a block and every offset
     * fit: rows of `stride` elements, the larger of the two. */
    static bool fits(size_t rows, size_t cols, size_t stride, unsigned v, unsigned threads)
    {
        const size_t lim = (size_t)1 << 32, chunks = rows * (cols / v);
        return rows < lim && stride < lim && rows * stride < lim &&
               (chunks + threads - 1) / threads < ((size_t)1 << 31);
    }

    /* Blocks of `threads` for rows x cols. */
    static unsigned grid(size_t rows, size_t cols, unsigned v, unsigned threads)
    {
        const size_t blocks = (rows * (cols / v) + threads - 1) / threads;
        return blocks ? (unsigned)blocks : 1u;
    }
};

} // namespace weft_ops

#endif
