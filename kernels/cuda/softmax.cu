// Softmax over the last axis with the causal mask of kernels/src/softmax.rs: in a [.., Sq, Sk]
// operand, query i sees keys j ≤ i + Sk − Sq. One block per row; exponentials in f32 and the
// sum in f64, as the CPU kernel.

extern "C" __global__ void softmax_forward(float* y, const float* x, i64 rows, i64 sq, i64 sk, int causal) {
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * sk;
        float* yr = y + r * sk;
        i64 vis = visible_keys(r, sq, sk, causal);
        float m = -INFINITY;
        for (i64 j = threadIdx.x; j < vis; j += blockDim.x) m = fmaxf(m, xr[j]);
        m = block_max(m);
        double s = 0.0;
        for (i64 j = threadIdx.x; j < vis; j += blockDim.x) s += (double)expf(xr[j] - m);
        double inv = 1.0 / block_sum(s);
        for (i64 j = threadIdx.x; j < sk; j += blockDim.x)
            yr[j] = j < vis ? (float)((double)expf(xr[j] - m) * inv) : 0.0f;
    }
}

// dx = y ⊙ (g − Σ g·y), y recomputed from x.
extern "C" __global__ void softmax_backward(float* dx, const float* x, const float* g, i64 rows, i64 sq, i64 sk,
                                            int causal) {
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * sk;
        const float* gr = g + r * sk;
        i64 vis = visible_keys(r, sq, sk, causal);
        float m = -INFINITY;
        for (i64 j = threadIdx.x; j < vis; j += blockDim.x) m = fmaxf(m, xr[j]);
        m = block_max(m);
        double s = 0.0;
        for (i64 j = threadIdx.x; j < vis; j += blockDim.x) s += (double)expf(xr[j] - m);
        double inv = 1.0 / block_sum(s);
        double dot = 0.0;
        for (i64 j = threadIdx.x; j < vis; j += blockDim.x) {
            float yj = (float)((double)expf(xr[j] - m) * inv);
            dot += (double)yj * gr[j];
        }
        dot = block_sum(dot);
        for (i64 j = threadIdx.x; j < sk; j += blockDim.x) {
            float yj = j < vis ? (float)((double)expf(xr[j] - m) * inv) : 0.0f;
            dx[r * sk + j] = (float)((double)yj * ((double)gr[j] - dot));
        }
    }
}
