// Kernels that test the emulator itself (not part of plait's NVRTC program).

// Thread t reads what thread t − 1 wrote without a barrier between: a race on a GPU. Run in
// thread order it would look right; the emulator's shuffled phases must show it.
extern "C" __global__ void simt_selftest_race(float* out) {
    __shared__ float s[PLAIT_MAX_BLOCK];
    s[threadIdx.x] = (float)(blockIdx.x * 1000 + threadIdx.x + 1);
    unsigned prev = (threadIdx.x + blockDim.x - 1) % blockDim.x;
    out[blockIdx.x * blockDim.x + threadIdx.x] = s[prev];
}
