// LayerNorm and RMSNorm over the last axis (kernels/src/norm.rs): one block per row, row
// statistics in f64. The backward writes each row's statistics to `stats` so that the
// parameter gradients (sums over rows, `norm_param_grads`) need not recompute them.

// Row r of a norm's output, y[r·h + i] = f(i): f32, or (WORDS) only y's bf16 words, two to a
// word in order (h even), for an output every reader of which reads words (a norm's output
// that a linear multiplies next as bf16). The block's threads stride over the row.
template <bool WORDS, class F>
__device__ __forceinline__ void norm_put_row(float* y, i64 r, i64 h, F f) {
    if (WORDS) {
        unsigned* w = (unsigned*)y + r * (h / 2);
        for (i64 j = threadIdx.x; j < h / 2; j += blockDim.x) w[j] = bf16_pair(f(2 * j), f(2 * j + 1));
    } else {
        for (i64 i = threadIdx.x; i < h; i += blockDim.x) y[r * h + i] = f(i);
    }
}

template <bool WORDS>
__device__ void layer_norm_forward_of(float* y, const float* x, const float* gamma, const float* beta, i64 rows,
                                      i64 h, double eps) {
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * h;
        double s = 0.0;
        for (i64 i = threadIdx.x; i < h; i += blockDim.x) s += xr[i];
        double mu = block_sum(s) / (double)h;
        double q = 0.0;
        for (i64 i = threadIdx.x; i < h; i += blockDim.x) q += (xr[i] - mu) * (xr[i] - mu);
        double rstd = 1.0 / sqrt(block_sum(q) / (double)h + eps);
        norm_put_row<WORDS>(y, r, h, [&](i64 i) { return (float)((xr[i] - mu) * rstd * gamma[i] + (beta ? beta[i] : 0.0f)); });
    }
}

extern "C" __global__ void layer_norm_forward(float* y, const float* x, const float* gamma, const float* beta,
                                              i64 rows, i64 h, double eps) {
    layer_norm_forward_of<false>(y, x, gamma, beta, rows, h, eps);
}

extern "C" __global__ void layer_norm_forward_words(float* y, const float* x, const float* gamma,
                                                    const float* beta, i64 rows, i64 h, double eps) {
    layer_norm_forward_of<true>(y, x, gamma, beta, rows, h, eps);
}

// dx = r·(d − mean(d) − x̂·mean(d·x̂)) with x̂ = (x − μ)·r and d = g·γ; stats[2r] = μ, stats[2r+1] = r.
// The backward kernels read x as XF32 or, in the `_bf16x` kernels, as XBf16 (common.cuh: a
// bf16 plan's norm input back from its stash, with no f32 expansion first), and the output
// gradient g likewise (`_bf16g`, both `_bf16xg`: made as words by the linear's GEMM after it).

template <class X, class G>
__device__ void layer_norm_backward_of(float* dx, float* stats, X x, const float* gamma,
                                               G g, i64 rows, i64 h, double eps) {
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 xr = r * h;
        double s = 0.0;
        for (i64 i = threadIdx.x; i < h; i += blockDim.x) s += x[xr + i];
        double mu = block_sum(s) / (double)h;
        double q = 0.0;
        for (i64 i = threadIdx.x; i < h; i += blockDim.x) q += (x[xr + i] - mu) * (x[xr + i] - mu);
        double rstd = 1.0 / sqrt(block_sum(q) / (double)h + eps);
        double sd = 0.0, sdx = 0.0;
        for (i64 i = threadIdx.x; i < h; i += blockDim.x) {
            double d = (double)g[r * h + i] * gamma[i];
            sd += d;
            sdx += d * (x[xr + i] - mu) * rstd;
        }
        double mean_d = block_sum(sd) / (double)h;
        double mean_dx = block_sum(sdx) / (double)h;
        for (i64 i = threadIdx.x; i < h; i += blockDim.x) {
            double xhat = (x[xr + i] - mu) * rstd;
            double d = (double)g[r * h + i] * gamma[i];
            dx[r * h + i] = (float)(rstd * (d - mean_d - xhat * mean_dx));
        }
        if (threadIdx.x == 0) {
            stats[2 * r] = (float)mu;
            stats[2 * r + 1] = (float)rstd;
        }
    }
}

extern "C" __global__ void layer_norm_backward(float* dx, float* stats, const float* x, const float* gamma,
                                               const float* g, i64 rows, i64 h, double eps) {
    layer_norm_backward_of(dx, stats, XF32{x}, gamma, XF32{g}, rows, h, eps);
}

extern "C" __global__ void layer_norm_backward_bf16x(float* dx, float* stats, const float* x, const float* gamma,
                                               const float* g, i64 rows, i64 h, double eps) {
    layer_norm_backward_of(dx, stats, XBf16{(const unsigned*)x}, gamma, XF32{g}, rows, h, eps);
}

extern "C" __global__ void layer_norm_backward_bf16g(float* dx, float* stats, const float* x, const float* gamma,
                                                     const float* g, i64 rows, i64 h, double eps) {
    layer_norm_backward_of(dx, stats, XF32{x}, gamma, XBf16{(const unsigned*)g}, rows, h, eps);
}

extern "C" __global__ void layer_norm_backward_bf16xg(float* dx, float* stats, const float* x, const float* gamma,
                                                      const float* g, i64 rows, i64 h, double eps) {
    layer_norm_backward_of(dx, stats, XBf16{(const unsigned*)x}, gamma, XBf16{(const unsigned*)g}, rows, h, eps);
}

template <bool WORDS>
__device__ void rms_norm_forward_of(float* y, const float* x, const float* gamma, i64 rows, i64 h, double eps) {
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * h;
        double q = 0.0;
        for (i64 i = threadIdx.x; i < h; i += blockDim.x) q += (double)xr[i] * xr[i];
        double rs = 1.0 / sqrt(block_sum(q) / (double)h + eps);
        norm_put_row<WORDS>(y, r, h, [&](i64 i) { return (float)(xr[i] * rs * gamma[i]); });
    }
}

extern "C" __global__ void rms_norm_forward(float* y, const float* x, const float* gamma, i64 rows, i64 h,
                                            double eps) {
    rms_norm_forward_of<false>(y, x, gamma, rows, h, eps);
}

extern "C" __global__ void rms_norm_forward_words(float* y, const float* x, const float* gamma, i64 rows, i64 h,
                                                  double eps) {
    rms_norm_forward_of<true>(y, x, gamma, rows, h, eps);
}

// dx = r·d − x·r³·mean(d·x) with d = g·γ; stats[2r] = 0, stats[2r+1] = r (LayerNorm's layout
// with μ = 0, so `norm_param_grads` serves both).
template <class X, class G>
__device__ void rms_norm_backward_of(float* dx, float* stats, X x, const float* gamma,
                                             G g, i64 rows, i64 h, double eps) {
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 xr = r * h;
        double q = 0.0, sdx = 0.0;
        for (i64 i = threadIdx.x; i < h; i += blockDim.x) {
            q += (double)x[xr + i] * x[xr + i];
            sdx += (double)g[r * h + i] * gamma[i] * x[xr + i];
        }
        double rs = 1.0 / sqrt(block_sum(q) / (double)h + eps);
        double mean_dx = block_sum(sdx) / (double)h;
        for (i64 i = threadIdx.x; i < h; i += blockDim.x) {
            double d = (double)g[r * h + i] * gamma[i];
            dx[r * h + i] = (float)(rs * d - x[xr + i] * rs * rs * rs * mean_dx);
        }
        if (threadIdx.x == 0) {
            stats[2 * r] = 0.0f;
            stats[2 * r + 1] = (float)rs;
        }
    }
}

extern "C" __global__ void rms_norm_backward(float* dx, float* stats, const float* x, const float* gamma,
                                             const float* g, i64 rows, i64 h, double eps) {
    rms_norm_backward_of(dx, stats, XF32{x}, gamma, XF32{g}, rows, h, eps);
}

extern "C" __global__ void rms_norm_backward_bf16x(float* dx, float* stats, const float* x, const float* gamma,
                                             const float* g, i64 rows, i64 h, double eps) {
    rms_norm_backward_of(dx, stats, XBf16{(const unsigned*)x}, gamma, XF32{g}, rows, h, eps);
}

extern "C" __global__ void rms_norm_backward_bf16g(float* dx, float* stats, const float* x, const float* gamma,
                                                   const float* g, i64 rows, i64 h, double eps) {
    rms_norm_backward_of(dx, stats, XF32{x}, gamma, XBf16{(const unsigned*)g}, rows, h, eps);
}

extern "C" __global__ void rms_norm_backward_bf16xg(float* dx, float* stats, const float* x, const float* gamma,
                                                    const float* g, i64 rows, i64 h, double eps) {
    rms_norm_backward_of(dx, stats, XBf16{(const unsigned*)x}, gamma, XBf16{(const unsigned*)g}, rows, h, eps);
}

// The first pass of dγ[c] = Σ_r g·(x − μ_r)·r_r and dβ[c] = Σ_r g (when `dbeta` is not null):
// their partial sums over the rows of chunk k (`chunk` rows each) at [k, c], one thread per
// (chunk, column); `column_sum` adds the chunks.
template <class X, class G>
__device__ void norm_param_grads_of(float* dgamma, float* dbeta, X x, G g,
                                            const float* stats, i64 rows, i64 h, i64 chunk) {
    i64 chunks = (rows + chunk - 1) / chunk;
    for (i64 i = global_thread(); i < chunks * h; i += grid_threads()) {
        i64 k = i / h, c = i % h;
        i64 end = (k + 1) * chunk < rows ? (k + 1) * chunk : rows;
        double dg = 0.0, db = 0.0;
        for (i64 r = k * chunk; r < end; ++r) {
            double gi = g[r * h + c];
            dg += gi * ((double)x[r * h + c] - stats[2 * r]) * stats[2 * r + 1];
            db += gi;
        }
        dgamma[i] = (float)dg;
        if (dbeta) dbeta[i] = (float)db;
    }
}

extern "C" __global__ void norm_param_grads(float* dgamma, float* dbeta, const float* x, const float* g,
                                            const float* stats, i64 rows, i64 h, i64 chunk) {
    norm_param_grads_of(dgamma, dbeta, XF32{x}, XF32{g}, stats, rows, h, chunk);
}

extern "C" __global__ void norm_param_grads_bf16x(float* dgamma, float* dbeta, const float* x, const float* g,
                                            const float* stats, i64 rows, i64 h, i64 chunk) {
    norm_param_grads_of(dgamma, dbeta, XBf16{(const unsigned*)x}, XF32{g}, stats, rows, h, chunk);
}

extern "C" __global__ void norm_param_grads_bf16g(float* dgamma, float* dbeta, const float* x, const float* g,
                                                  const float* stats, i64 rows, i64 h, i64 chunk) {
    norm_param_grads_of(dgamma, dbeta, XF32{x}, XBf16{(const unsigned*)g}, stats, rows, h, chunk);
}

extern "C" __global__ void norm_param_grads_bf16xg(float* dgamma, float* dbeta, const float* x, const float* g,
                                                   const float* stats, i64 rows, i64 h, i64 chunk) {
    norm_param_grads_of(dgamma, dbeta, XBf16{(const unsigned*)x}, XBf16{(const unsigned*)g}, stats, rows, h, chunk);
}

// The same four kernels with one warp per row, for rows up to NORM_WARP_COLS · 32 wide (GPT-2's
// 768, Llama's up to 1024 do not; 4096 does not): the row lives in the lane's registers
// (columns lane, lane + 32, …: each load a warp's 128 contiguous bytes, up to 32 in flight per
// lane), and the row statistics are warp sums, with no block barrier. A block is
// blockDim / 32 rows (blockDim a multiple of 32; ops/rows.rs launches the block kernels
// otherwise). Sums in f64 as the block kernels'.
#define NORM_WARP_COLS 32

// Row r's values at the lane's columns (0 past h).
__device__ __forceinline__ void norm_row(float* v, const float* xr, i64 h, int lane) {
#pragma unroll
    for (int u = 0; u < NORM_WARP_COLS; ++u) {
        i64 i = lane + 32 * u;
        v[u] = i < h ? xr[i] : 0.0f;
    }
}

// Row values of x at `base` (the lane's columns, 0 past h), through a loader (XF32, XBf16).
template <class X>
__device__ __forceinline__ void norm_row_of(float* v, X x, i64 base, i64 h, int lane) {
#pragma unroll
    for (int u = 0; u < NORM_WARP_COLS; ++u) {
        i64 i = lane + 32 * u;
        v[u] = i < h ? x[base + i] : 0.0f;
    }
}

// A LayerNorm row's mean and 1 / standard deviation from the lane's values `v` (0 past h).
__device__ __forceinline__ void norm_row_stats(const float* v, i64 h, int lane, double eps, double* mu,
                                               double* rstd) {
    double s = 0.0;
#pragma unroll
    for (int u = 0; u < NORM_WARP_COLS; ++u) s += v[u];
    *mu = warp_sum(s) / (double)h;
    double q = 0.0;
#pragma unroll
    for (int u = 0; u < NORM_WARP_COLS; ++u)
        if (lane + 32 * u < h) q += (v[u] - *mu) * (v[u] - *mu);
    *rstd = 1.0 / sqrt(warp_sum(q) / (double)h + eps);
}

// The warp's first row and the stride between a warp's rows.
__device__ __forceinline__ i64 norm_warp() { return global_thread() / 32; }
__device__ __forceinline__ i64 norm_warps() { return grid_threads() / 32; }

// The warp's row r of a norm's output from the lane's values y_u at columns lane + 32u: f32,
// or (WORDS) only bf16 words, two to a word in order (h even): an even lane pairs its value
// with its odd neighbour's (a shuffle every lane takes part in).
template <bool WORDS>
__device__ __forceinline__ void norm_put_warp_row(float* y, i64 r, i64 h, int lane, const float* yu) {
#pragma unroll
    for (int u = 0; u < NORM_WARP_COLS; ++u) {
        i64 i = lane + 32 * u;
        if (WORDS) {
            float odd = __shfl_xor_sync(FULL_WARP, yu[u], 1);
            if (lane % 2 == 0 && i < h) ((unsigned*)y)[(r * h + i) / 2] = bf16_pair(yu[u], odd);
        } else if (i < h) {
            y[r * h + i] = yu[u];
        }
    }
}

template <bool WORDS>
__device__ void layer_norm_forward_warp_of(float* y, const float* x, const float* gamma, const float* beta,
                                           i64 rows, i64 h, double eps) {
    int lane = threadIdx.x % 32;
    for (i64 r = norm_warp(); r < rows; r += norm_warps()) {
        float v[NORM_WARP_COLS];
        norm_row(v, x + r * h, h, lane);
        double mu, rstd;
        norm_row_stats(v, h, lane, eps, &mu, &rstd);
#pragma unroll
        for (int u = 0; u < NORM_WARP_COLS; ++u) {
            i64 i = lane + 32 * u;
            v[u] = i < h ? (float)((v[u] - mu) * rstd * gamma[i] + (beta ? beta[i] : 0.0f)) : 0.0f;
        }
        norm_put_warp_row<WORDS>(y, r, h, lane, v);
    }
}

extern "C" __global__ void layer_norm_forward_warp(float* y, const float* x, const float* gamma, const float* beta,
                                                   i64 rows, i64 h, double eps) {
    layer_norm_forward_warp_of<false>(y, x, gamma, beta, rows, h, eps);
}

extern "C" __global__ void layer_norm_forward_warp_words(float* y, const float* x, const float* gamma,
                                                         const float* beta, i64 rows, i64 h, double eps) {
    layer_norm_forward_warp_of<true>(y, x, gamma, beta, rows, h, eps);
}

template <class X, class G>
__device__ void layer_norm_backward_warp_of(float* dx, float* stats, X x, const float* gamma,
                                                    G g, i64 rows, i64 h, double eps) {
    int lane = threadIdx.x % 32;
    for (i64 r = norm_warp(); r < rows; r += norm_warps()) {
        float v[NORM_WARP_COLS], d[NORM_WARP_COLS];
        norm_row_of(v, x, r * h, h, lane);
        norm_row_of(d, g, r * h, h, lane);
        double mu, rstd;
        norm_row_stats(v, h, lane, eps, &mu, &rstd);
        double sd = 0.0, sdx = 0.0;
#pragma unroll
        for (int u = 0; u < NORM_WARP_COLS; ++u) {
            i64 i = lane + 32 * u;
            double di = i < h ? (double)d[u] * gamma[i] : 0.0;
            sd += di;
            sdx += di * (v[u] - mu) * rstd;
        }
        double mean_d = warp_sum(sd) / (double)h, mean_dx = warp_sum(sdx) / (double)h;
#pragma unroll
        for (int u = 0; u < NORM_WARP_COLS; ++u) {
            i64 i = lane + 32 * u;
            if (i >= h) continue;
            double xhat = (v[u] - mu) * rstd, di = (double)d[u] * gamma[i];
            dx[r * h + i] = (float)(rstd * (di - mean_d - xhat * mean_dx));
        }
        if (lane == 0) {
            stats[2 * r] = (float)mu;
            stats[2 * r + 1] = (float)rstd;
        }
    }
}

extern "C" __global__ void layer_norm_backward_warp(float* dx, float* stats, const float* x, const float* gamma,
                                                    const float* g, i64 rows, i64 h, double eps) {
    layer_norm_backward_warp_of(dx, stats, XF32{x}, gamma, XF32{g}, rows, h, eps);
}

extern "C" __global__ void layer_norm_backward_warp_bf16x(float* dx, float* stats, const float* x, const float* gamma,
                                                    const float* g, i64 rows, i64 h, double eps) {
    layer_norm_backward_warp_of(dx, stats, XBf16{(const unsigned*)x}, gamma, XF32{g}, rows, h, eps);
}

extern "C" __global__ void layer_norm_backward_warp_bf16g(float* dx, float* stats, const float* x, const float* gamma,
                                                          const float* g, i64 rows, i64 h, double eps) {
    layer_norm_backward_warp_of(dx, stats, XF32{x}, gamma, XBf16{(const unsigned*)g}, rows, h, eps);
}

extern "C" __global__ void layer_norm_backward_warp_bf16xg(float* dx, float* stats, const float* x,
                                                           const float* gamma, const float* g, i64 rows, i64 h,
                                                           double eps) {
    layer_norm_backward_warp_of(dx, stats, XBf16{(const unsigned*)x}, gamma, XBf16{(const unsigned*)g}, rows, h, eps);
}

template <bool WORDS>
__device__ void rms_norm_forward_warp_of(float* y, const float* x, const float* gamma, i64 rows, i64 h,
                                         double eps) {
    int lane = threadIdx.x % 32;
    for (i64 r = norm_warp(); r < rows; r += norm_warps()) {
        float v[NORM_WARP_COLS];
        norm_row(v, x + r * h, h, lane);
        double q = 0.0;
#pragma unroll
        for (int u = 0; u < NORM_WARP_COLS; ++u) q += (double)v[u] * v[u];
        double rs = 1.0 / sqrt(warp_sum(q) / (double)h + eps);
#pragma unroll
        for (int u = 0; u < NORM_WARP_COLS; ++u) {
            i64 i = lane + 32 * u;
            v[u] = i < h ? (float)(v[u] * rs * gamma[i]) : 0.0f;
        }
        norm_put_warp_row<WORDS>(y, r, h, lane, v);
    }
}

extern "C" __global__ void rms_norm_forward_warp(float* y, const float* x, const float* gamma, i64 rows, i64 h,
                                                 double eps) {
    rms_norm_forward_warp_of<false>(y, x, gamma, rows, h, eps);
}

extern "C" __global__ void rms_norm_forward_warp_words(float* y, const float* x, const float* gamma, i64 rows,
                                                       i64 h, double eps) {
    rms_norm_forward_warp_of<true>(y, x, gamma, rows, h, eps);
}

template <class X, class G>
__device__ void rms_norm_backward_warp_of(float* dx, float* stats, X x, const float* gamma,
                                                  G g, i64 rows, i64 h, double eps) {
    int lane = threadIdx.x % 32;
    for (i64 r = norm_warp(); r < rows; r += norm_warps()) {
        float v[NORM_WARP_COLS], d[NORM_WARP_COLS];
        norm_row_of(v, x, r * h, h, lane);
        norm_row_of(d, g, r * h, h, lane);
        double q = 0.0, sdx = 0.0;
#pragma unroll
        for (int u = 0; u < NORM_WARP_COLS; ++u) {
            i64 i = lane + 32 * u;
            q += (double)v[u] * v[u];
            sdx += i < h ? (double)d[u] * gamma[i] * v[u] : 0.0;
        }
        double rs = 1.0 / sqrt(warp_sum(q) / (double)h + eps);
        double mean_dx = warp_sum(sdx) / (double)h;
#pragma unroll
        for (int u = 0; u < NORM_WARP_COLS; ++u) {
            i64 i = lane + 32 * u;
            if (i < h) dx[r * h + i] = (float)(rs * (double)d[u] * gamma[i] - v[u] * rs * rs * rs * mean_dx);
        }
        if (lane == 0) {
            stats[2 * r] = 0.0f;
            stats[2 * r + 1] = (float)rs;
        }
    }
}

extern "C" __global__ void rms_norm_backward_warp(float* dx, float* stats, const float* x, const float* gamma,
                                                  const float* g, i64 rows, i64 h, double eps) {
    rms_norm_backward_warp_of(dx, stats, XF32{x}, gamma, XF32{g}, rows, h, eps);
}

extern "C" __global__ void rms_norm_backward_warp_bf16x(float* dx, float* stats, const float* x, const float* gamma,
                                                  const float* g, i64 rows, i64 h, double eps) {
    rms_norm_backward_warp_of(dx, stats, XBf16{(const unsigned*)x}, gamma, XF32{g}, rows, h, eps);
}

extern "C" __global__ void rms_norm_backward_warp_bf16g(float* dx, float* stats, const float* x, const float* gamma,
                                                        const float* g, i64 rows, i64 h, double eps) {
    rms_norm_backward_warp_of(dx, stats, XF32{x}, gamma, XBf16{(const unsigned*)g}, rows, h, eps);
}

extern "C" __global__ void rms_norm_backward_warp_bf16xg(float* dx, float* stats, const float* x, const float* gamma,
                                                         const float* g, i64 rows, i64 h, double eps) {
    rms_norm_backward_warp_of(dx, stats, XBf16{(const unsigned*)x}, gamma, XBf16{(const unsigned*)g}, rows, h, eps);
}
