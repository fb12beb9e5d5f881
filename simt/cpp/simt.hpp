// The CUDA names plait's kernels use, for g++: each thread block's threads run as fibers
// (ucontext) on the calling host thread, switching at __syncthreads(). Blocks run one after
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

namespace simt {
extern thread_local dim3 thread_idx, block_idx, block_dim, grid_dim;
void sync_threads();
}  // namespace simt

#define threadIdx (::simt::thread_idx)
#define blockIdx (::simt::block_idx)
#define blockDim (::simt::block_dim)
#define gridDim (::simt::grid_dim)
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static thread_local
#define __syncthreads() ::simt::sync_threads()

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

