// One AdamW update in place (kernels/src/optim.rs): decoupled weight decay, bias-corrected
// moments; the per-step scalars (step size, √(1 − β₂ᵗ), decay) come from the launcher in f64.
// `frozen` != 0 keeps each nonzero second moment as it is (and `frozen_bias2_sqrt` with it).

extern "C" __global__ void adamw_step(float* param, float* m, float* v, const float* grad, i64 n, double beta1,
                                      double beta2, double eps, double step_size, double decay,
                                      double bias2_sqrt, double frozen_bias2_sqrt, int frozen) {
    for (i64 i = global_thread(); i < n; i += grid_threads()) {
        double g = grad[i];
        double p = (double)param[i] * decay;
        double m64 = beta1 * m[i] + (1.0 - beta1) * g;
        bool keep = frozen && v[i] > 0.0f;
        double v64 = keep ? (double)v[i] : beta2 * v[i] + (1.0 - beta2) * g * g;
        double denom = sqrt(v64) / (keep ? frozen_bias2_sqrt : bias2_sqrt) + eps;
        param[i] = (float)(p - step_size * m64 / denom);
        m[i] = (float)m64;
        v[i] = (float)v64;
    }
}
