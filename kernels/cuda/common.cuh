// Helpers shared by plait's device kernels.
//
// Every file here is compiled twice: by NVRTC for the GPU (runtime/src/backend/cuda), and by
// g++ under the `simt` crate's emulator, which runs each thread block's threads as fibers on
// one host thread so that the kernels are tested against the `kernels` crate on machines
// without a GPU. Hence the rules: no dynamic shared memory, every block-wide exchange goes
// through `__shared__` memory and `__syncthreads()`, and of the warp-wide operations only those
// the emulator provides (`__shfl_xor_sync` with a full mask, and attention_mma.cu's
// `mma.sync.m16n8k16` bf16 products, which it emulates by their PTX fragment layouts).
//
// Conventions: tensors are dense row-major f32; element counts and offsets are `long long`;
// blockDim.x is a power of two no larger than PLAIT_MAX_BLOCK (the launcher picks it); a
// "row" kernel runs one block per row and strides its threads over the row.

#define PLAIT_MAX_BLOCK 1024
#define PLAIT_MAX_RANK 8

typedef long long i64;

// NVRTC has no <math.h>; the emulator's shim includes <cmath>, which defines these.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

// Block reductions. With the block in whole warps (blockDim.x a multiple of 32, what the
// launchers pick on a GPU) each warp reduces by shuffles and the warps' partials meet once in
// shared memory: two barriers, where a shared-memory tree over the threads takes one per level
// (ten for 256 threads), which made the row kernels (LayerNorm: 1.1 TB/s on an H200) wait on
// barriers rather than memory. Smaller blocks (the emulator's tests run blocks of 1 to 16)
// take the tree. Every thread sums the partials in the same order, so all get the same value.
#define FULL_WARP 0xffffffffu

__device__ double warp_sum(double v) {
    for (int m = 16; m > 0; m /= 2) v += __shfl_xor_sync(FULL_WARP, v, m);
    return v;
}

__device__ float warp_max(float v) {
    for (int m = 16; m > 0; m /= 2) v = fmaxf(v, __shfl_xor_sync(FULL_WARP, v, m));
    return v;
}

// The sum of `v` over the block's threads, in f64 (as the CPU kernels accumulate); every
// thread gets the total.
__device__ double block_sum(double v) {
    if (blockDim.x % 32 == 0) {
        __shared__ double warp_part[PLAIT_MAX_BLOCK / 32];
        v = warp_sum(v);
        if (threadIdx.x % 32 == 0) warp_part[threadIdx.x / 32] = v;
        __syncthreads();
        double total = 0.0;
        for (unsigned w = 0; w < blockDim.x / 32; ++w) total += warp_part[w];
        __syncthreads();  // the next call reuses `warp_part`
        return total;
    }
    __shared__ double partial[PLAIT_MAX_BLOCK];
    partial[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    double total = partial[0];
    __syncthreads();  // the next call reuses `partial`
    return total;
}

// The maximum of `v` over the block's threads; every thread gets it.
__device__ float block_max(float v) {
    if (blockDim.x % 32 == 0) {
        __shared__ float warp_part[PLAIT_MAX_BLOCK / 32];
        v = warp_max(v);
        if (threadIdx.x % 32 == 0) warp_part[threadIdx.x / 32] = v;
        __syncthreads();
        float m = -INFINITY;
        for (unsigned w = 0; w < blockDim.x / 32; ++w) m = fmaxf(m, warp_part[w]);
        __syncthreads();
        return m;
    }
    __shared__ float partial[PLAIT_MAX_BLOCK];
    partial[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + s]);
        __syncthreads();
    }
    float m = partial[0];
    __syncthreads();
    return m;
}

// The logistic function without overflow (kernels/src/elementwise.rs's `sigmoid`).
__device__ double sigmoid64(double x) {
    if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

// The logistic function with an f32 exponential (the activation kernels' SiLU: see
// pointwise.cu), without overflow.
__device__ double sigmoid32(double x) {
    if (x >= 0.0) return 1.0 / (1.0 + (double)expf((float)-x));
    double e = (double)expf((float)x);
    return e / (1.0 + e);
}

// The flat index of this thread in a 1-D grid, and the grid's thread count (for grid-stride
// loops over `n` elements).
// x rounded to bf16 (to nearest, ties to even; kernels::device::round_bf16), as its 16 bits.
__device__ __forceinline__ unsigned bf16_bits(float x) {
    unsigned u = __float_as_uint(x);
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// Two floats rounded to bf16 in one word, `lo` in the lower half: the stash's layout.
__device__ __forceinline__ unsigned bf16_pair(float lo, float hi) { return bf16_bits(lo) | (bf16_bits(hi) << 16); }

// How a kernel reads an input given either way: f32, or a stash's bf16 words (two to a word,
// in order) read as they are (the `_bf16x` kernels: a bf16 plan's value back from its stash,
// with no f32 expansion first).
struct XF32 {
    const float* p;
    __device__ float operator[](i64 i) const { return p[i]; }
};
struct XBf16 {
    const unsigned* w;
    __device__ float operator[](i64 i) const {
        unsigned v = w[i >> 1];
        return __uint_as_float((i & 1) ? (v & 0xffff0000u) : (v << 16));
    }
};

__device__ i64 global_thread() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ i64 grid_threads() { return (i64)gridDim.x * blockDim.x; }

// Loads each thread of a streaming kernel keeps in flight: it issues ILP loads before using
// any. A memory-bound kernel runs at (bytes in flight per SM) / (memory latency) (Little's
// law): one 4-byte load per thread at a time, 2048 threads per SM, sustained 1.5 TB/s of an
// H200's 4.2 (unary_forward and unpad_rows, bench/device/results/check-h200-2026-12-04b.json);
// four reach the bandwidth. Grid-stride kernels written so are launched on n / (ILP · block)
// blocks (`stream_grid` in runtime/src/backend/device/ops/mod.rs).
#define ILP 4

// A broadcast of two operands to one output shape (numpy rules, aligned on the right by the
// launcher): the output's dims, and each operand's element strides (0 on a broadcast axis).
struct Broadcast {
    int rank;
    i64 dims[PLAIT_MAX_RANK];
    i64 stride_a[PLAIT_MAX_RANK];
    i64 stride_b[PLAIT_MAX_RANK];
};

// Whether both operands are laid out as the output (no dim broadcast): then element i is at
// offset i in each, and the kernels skip `broadcast_offsets`' divisions (a 64-bit division
// per dim per element costs more than the memory traffic of a same-shape add).
__device__ bool broadcast_is_dense(const Broadcast& s) {
    i64 expect = 1;
    for (int d = s.rank - 1; d >= 0; --d) {
        if (s.dims[d] != 1 && (s.stride_a[d] != expect || s.stride_b[d] != expect)) return false;
        expect *= s.dims[d];
    }
    return true;
}

// The offsets in `a` and `b` of output element `i`.
__device__ void broadcast_offsets(const Broadcast& s, i64 i, i64* oa, i64* ob) {
    i64 a = 0, b = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
        i64 c = i % s.dims[d];
        i /= s.dims[d];
        a += c * s.stride_a[d];
        b += c * s.stride_b[d];
    }
    *oa = a;
    *ob = b;
}

// A box of elements copied between two strided tensors: the box's dims, each side's element
// strides and first element (a transpose, a split part, a concat input, a slice, an expand).
struct Strided {
    int rank;
    i64 dims[PLAIT_MAX_RANK];
    i64 src_stride[PLAIT_MAX_RANK];
    i64 dst_stride[PLAIT_MAX_RANK];
    i64 src_offset;
    i64 dst_offset;
};

// How many leading keys query `i` (of `sq`, given as any row index whose remainder by `sq` is
// the query) sees among `sk` keys: the causal mask hides key j > i + sk − sq (queries aligned
// with the last keys, kernels/src/softmax.rs).
__device__ i64 visible_keys(i64 row, i64 sq, i64 sk, int causal) {
    if (!causal) return sk;
    i64 i = row % sq;
    i64 v = i + sk + 1 - sq;
    return v < 0 ? 0 : (v > sk ? sk : v);
}

// Scaled dot-product attention's sizes (kernels/src/attention.rs): q [batch, sq, heads·d],
// k [batch, sk, kv·d], v [batch, sk, kv·dv], output [batch, sq, heads·dv]; query head h reads
// kv head h / (heads / kv). `softcap` 0: no cap.
struct Attention {
    i64 batch, sq, sk, heads, kv, d, dv;
    double scale;
    double softcap;
    // The tensor-core kernels' q, k and v rows (`attention_mma.cu`, `mma_operand`): elements
    // from one token's row to the next (0: dense, heads·d or kv·d wide), and where in the row
    // each operand's columns start: q, k and v read in place as column blocks of one fused
    // projection's output [batch, n, q + k + v], with no split copying them out.
    i64 ld_q, ld_k, ld_v, off_q, off_k, off_v;
    int causal;
    // The gradients dq, dk and dv written in the operands' layout too (one buffer: dq's;
    // dk and dv in it where dv is null), so that no concatenation joins them afterwards.
    int grads_packed;
    // A sliding window: each causal query sees only its `window` most recent keys, itself
    // included (0: every earlier key).
    i64 window;
    // Chunked attention (Llama 4): each causal query sees only the keys of its own chunk of
    // `chunk` positions (0: none). ir::KeyMask says the same.
    i64 chunk;
};

// The first key a query that sees keys [0, vis) reads: the later of its sliding window's first
// and its chunk's first (0 without either).
__device__ i64 mask_first(const Attention& a, i64 vis) {
    i64 first = a.window > 0 && vis > a.window ? vis - a.window : 0;
    if (a.chunk > 0 && vis > 0) {
        i64 last = vis - 1, chunked = last - last % a.chunk;
        first = chunked > first ? chunked : first;
    }
    return first;
}

// One past the last query that sees key `j` (queries aligned with the last keys): the nearer of
// its window's reach and its chunk's end; else the last query.
__device__ i64 window_last_query(const Attention& a, i64 j) {
    if ((a.window <= 0 && a.chunk <= 0) || !a.causal) return a.sq;
    i64 reach = a.window > 0 ? j + a.window : j + a.sk;  // one past the last position seeing j
    if (a.chunk > 0) {
        i64 chunk_end = (j / a.chunk + 1) * a.chunk;
        reach = chunk_end < reach ? chunk_end : reach;
    }
    i64 end = reach - (a.sk - a.sq);
    return end < 0 ? 0 : (end < a.sq ? end : a.sq);
}
