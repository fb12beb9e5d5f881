// One AdamW update in place (kernels/src/optim.rs): decoupled weight decay, bias-corrected
// moments; the per-step scalars (step size, √(1 − β₂ᵗ), decay) come from the launcher in f64.
// `frozen` != 0 keeps each nonzero second moment as it is (and `frozen_bias2_sqrt` with it).

extern "C" __global__ void adamw_step(float* param, float* m, float* v, const float* grad, i64 n, double beta1,
                                      double beta2, double eps, double step_size, double decay,
                                      double bias2_sqrt, double frozen_bias2_sqrt, int frozen) {
    // Two elements per thread in flight (eight loads: each element reads four tensors).
    i64 stride = grid_threads();
    for (i64 i0 = global_thread(); i0 < n; i0 += 2 * stride) {
        float gs[2], ps[2], ms[2], vs[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            i64 i = i0 + u * stride;
            bool in = i < n;
            gs[u] = in ? grad[i] : 0.0f;
            ps[u] = in ? param[i] : 0.0f;
            ms[u] = in ? m[i] : 0.0f;
            vs[u] = in ? v[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            i64 i = i0 + u * stride;
            if (i >= n) continue;
            double g = gs[u];
            double p = (double)ps[u] * decay;
            double m64 = beta1 * ms[u] + (1.0 - beta1) * g;
            bool keep = frozen && vs[u] > 0.0f;
            double v64 = keep ? (double)vs[u] : beta2 * vs[u] + (1.0 - beta2) * g * g;
            double denom = sqrt(v64) / (keep ? frozen_bias2_sqrt : bias2_sqrt) + eps;
            param[i] = (float)(p - step_size * m64 / denom);
            m[i] = (float)m64;
            v[i] = (float)v64;
        }
    }
}
