// ReduceSum and ReduceMean over the last axis (kept with size 1), in f64 (kernels/src/reduce.rs),
// and their gradient: each row's output gradient spread over the row.

// y[r] = Σ_c x[r, c] / div, one block per row.
extern "C" __global__ void row_reduce(float* y, const float* x, i64 rows, i64 n, double div) {
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        double s = 0.0;
        for (i64 c = threadIdx.x; c < n; c += blockDim.x) s += x[r * n + c];
        s = block_sum(s);
        if (threadIdx.x == 0) y[r] = (float)(s / div);
    }
}

// dx[r, c] = g[r] / div.
extern "C" __global__ void row_spread(float* dx, const float* g, i64 rows, i64 n, double div) {
    for (i64 i = global_thread(); i < rows * n; i += grid_threads()) dx[i] = (float)((double)g[i / n] / div);
}
