// The CUDA names plait's kernels use, for g++: each thread block's threads run as fibers
// (ucontext) on the calling host thread, switching at __syncthreads() and at the warp-wide
// operations (__shfl_xor_sync, the tensor cores' mma.sync), each a barrier of the threads it
// joins: the block, or the warp's 32 lanes (threads 32·w .. 32·w + 31). Blocks run one after
// another, so a block's __shared__ arrays are function statics (thread_local, so launches on
// different host threads stay apart), and atomics are plain read-modify-writes.
#pragma once

#include <math.h>  // the C names (expf, fmaxf, erf) in the global namespace, as in CUDA
#include <cstddef>
#include <cstring>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

// CUDA's two-float vector (8-byte aligned loads and stores).
struct alignas(8) float2 {
    float x, y;
};

// CUDA's four-float vector (16-byte aligned loads and stores).
struct alignas(16) float4 {
    float x, y, z, w;
};

// CUDA's four-word vector (16-byte aligned loads and stores).
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};

namespace simt {
extern thread_local dim3 thread_idx, block_idx, block_dim, grid_dim;
void sync_threads();
// `v` of the lane `lane_mask` away (XOR) in the calling thread's warp; every lane of the warp
// must call it (as `__shfl_xor_sync` with a full mask).
float shfl_xor(float v, int lane_mask);
double shfl_xor(double v, int lane_mask);
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 of the calling warp: d += a · b, each
// lane holding its fragments in the PTX ISA's layout (attention_mma.cu's header).
void mma_m16n8k16_bf16(float* d, const unsigned* a, unsigned b0, unsigned b1);
// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16 of the calling warp: lane l names row l % 8
// of matrix l / 8 (eight bf16, 16 bytes at `row`) and receives, of each matrix i, the word
// (row l / 4, columns 2(l % 4), +1) into r[i], or with `trans` the two bf16 of column l / 4 in
// rows 2(l % 4) and 2(l % 4) + 1 (the lower row in the lower half).
void ldmatrix_x4(unsigned* r, const void* row, bool trans);
// cp.async of the calling thread: `len` bytes (up to 16) to `dst`, the first `src_len` from
// `src` and zeros after; it lands at once or at the thread's next `async_wait`
// (cp.async.wait_all), as the emulator's coin says, since a GPU promises no more.
void async_copy(void* dst, const void* src, unsigned len, unsigned src_len);
void async_wait();
}  // namespace simt

inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
    (void)mask;
    return ::simt::shfl_xor(v, lane_mask);
}

inline double __shfl_xor_sync(unsigned mask, double v, int lane_mask) {
    (void)mask;
    return ::simt::shfl_xor(v, lane_mask);
}

#define threadIdx (::simt::thread_idx)
#define blockIdx (::simt::block_idx)
#define blockDim (::simt::block_dim)
#define gridDim (::simt::grid_dim)
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static thread_local
#define __syncthreads() ::simt::sync_threads()
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)  // a register budget for the GPU's compiler

inline unsigned __float_as_uint(float x) {
    unsigned u;
    std::memcpy(&u, &x, sizeof u);
    return u;
}

inline float __uint_as_float(unsigned u) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
}

inline float atomicAdd(float* address, float value) {
    float old = *address;
    *address = old + value;
    return old;
}

