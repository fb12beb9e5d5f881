// Kernels that test the emulator itself (not part of plait's NVRTC program).

// Thread t reads what thread t − 1 wrote without a barrier between: a race on a GPU. Run in
// thread order it would look right; the emulator's shuffled phases must show it.
extern "C" __global__ void simt_selftest_race(float* out) {
    __shared__ float s[PLAIT_MAX_BLOCK];
    s[threadIdx.x] = (float)(blockIdx.x * 1000 + threadIdx.x + 1);
    unsigned prev = (threadIdx.x + blockDim.x - 1) % blockDim.x;
    out[blockIdx.x * blockDim.x + threadIdx.x] = s[prev];
}

// Each lane's value summed over its warp by a butterfly of shuffles; odd warps run the
// butterfly twice (warps need not meet as often as each other), so they hold 32 × the sum.
extern "C" __global__ void simt_selftest_shuffle(float* out) {
    float v = (float)(threadIdx.x % 32 + 1);
    int rounds = (threadIdx.x / 32) % 2 == 1 ? 2 : 1;
    for (int r = 0; r < rounds; ++r)
        for (int m = 1; m < 32; m *= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
    out[threadIdx.x] = v;
}

// One warp's mma.sync m16n8k16 of A[r][k] = r − k and B[k][n] = k + 2n (small integers, exact
// in bf16), each lane loading its fragments by the PTX ISA's layout; out[16 × 8] is D.
extern "C" __global__ void simt_selftest_mma(float* out) {
    unsigned lane = threadIdx.x % 32, group = lane / 4, t = lane % 4;
    auto bits = [](float x) { return __float_as_uint(x) >> 16; };
    auto a_word = [&](unsigned r, unsigned k) {
        return bits((float)r - (float)k) | (bits((float)r - (float)(k + 1)) << 16);
    };
    auto b_word = [&](unsigned k, unsigned n) {
        return bits((float)(k + 2 * n)) | (bits((float)(k + 1 + 2 * n)) << 16);
    };
    unsigned a[4] = {a_word(group, 2 * t), a_word(group + 8, 2 * t), a_word(group, 2 * t + 8),
                     a_word(group + 8, 2 * t + 8)};
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    ::simt::mma_m16n8k16_bf16(d, a, b_word(2 * t, group), b_word(2 * t + 8, group));
    for (int e = 0; e < 4; ++e) out[(group + (e >= 2 ? 8 : 0)) * 8 + 2 * t + e % 2] = d[e];
}

// Half the threads return while the others wait at a barrier: undefined on a GPU, an error here.
extern "C" __global__ void simt_selftest_skipped_barrier(float* out) {
    if (threadIdx.x < blockDim.x / 2) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// One warp's ldmatrix x4 of four 8×8 matrices of bf16 words M_m[i][j] = 64m + 8i + j (exact in
// bf16), plain and transposed; out[l][m] (and out[32 + l][m] transposed) is lane l's word m
// as its two halves' values, lower + 1000 · upper.
extern "C" __global__ void simt_selftest_ldmatrix(float* out) {
    __shared__ __align__(16) unsigned short tile[4][8][8];
    unsigned lane = threadIdx.x % 32;
    for (unsigned e = lane; e < 256; e += 32) {
        float v = (float)e;
        tile[e / 64][(e / 8) % 8][e % 8] = (unsigned short)(__float_as_uint(v) >> 16);
    }
    __syncthreads();
    auto value = [](unsigned w) {
        return __uint_as_float(w << 16) + 1000.0f * __uint_as_float(w & 0xffff0000u);
    };
    for (int trans = 0; trans < 2; ++trans) {
        unsigned r[4];
        ::simt::ldmatrix_x4(r, &tile[lane / 8][lane % 8][0], trans == 1);
        for (int m = 0; m < 4; ++m) out[(32 * trans + lane) * 4 + m] = value(r[m]);
    }
}
