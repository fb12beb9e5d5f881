// One AdamW update in place (kernels/src/optim.rs): decoupled weight decay, bias-corrected
// moments; the per-step scalars (step size, √(1 − β₂ᵗ), decay) come from the launcher in f64.
// `frozen` != 0 keeps each nonzero second moment as it is (and `frozen_bias2_sqrt` with it).

#define ADAMW_ARGS                                                                                        \
    double beta1, double beta2, double eps, double step_size, double decay, double bias2_sqrt, \
        double frozen_bias2_sqrt, int frozen

// One element's update: p, m, v in place from g.
__device__ __forceinline__ void adamw_one(float& p, float& m, float& v, float g, ADAMW_ARGS) {
    double p64 = (double)p * decay;
    double m64 = beta1 * m + (1.0 - beta1) * g;
    bool keep = frozen && v > 0.0f;
    double v64 = keep ? (double)v : beta2 * v + (1.0 - beta2) * (double)g * g;
    double denom = sqrt(v64) / (keep ? frozen_bias2_sqrt : bias2_sqrt) + eps;
    p = (float)(p64 - step_size * m64 / denom);
    m = (float)m64;
    v = (float)v64;
}

#define ADAMW_PASS beta1, beta2, eps, step_size, decay, bias2_sqrt, frozen_bias2_sqrt, frozen

// The gradient is read as f32 (XF32) or, in the `_bf16g` kernels, as its bf16 words (XBf16: a
// bf16 plan's gradient held in the stash until the update, read with no f32 expansion first).
template <class G>
__device__ void adamw_step_of(float* param, float* m, float* v, G grad, i64 n, ADAMW_ARGS) {
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
            adamw_one(ps[u], ms[u], vs[u], gs[u], ADAMW_PASS);
            param[i] = ps[u];
            m[i] = ms[u];
            v[i] = vs[u];
        }
    }
}

extern "C" __global__ void adamw_step(float* param, float* m, float* v, const float* grad, i64 n, ADAMW_ARGS) {
    adamw_step_of(param, m, v, XF32{grad}, n, ADAMW_PASS);
}

extern "C" __global__ void adamw_step_bf16g(float* param, float* m, float* v, const float* grad, i64 n,
                                            ADAMW_ARGS) {
    adamw_step_of(param, m, v, XBf16{(const unsigned*)grad}, n, ADAMW_PASS);
}

// adamw_step that also writes the updated parameter to `copy` (a mixed-precision program's
// compute copy, which it copies the master weight to next) and, where `words` is not null, its
// bf16 words (two to a word, in order: the copy's twin, which the next forward's GEMM reads
// instead of converting the copy): one pass instead of the update, a copy and a conversion.
// Each thread updates a pair of neighbours, whose two bf16 make one word.
template <class G>
__device__ void adamw_step_copy_of(float* param, float* m, float* v, float* copy, float* words, G grad, i64 n,
                                   ADAMW_ARGS) {
    for (i64 j = global_thread(); 2 * j < n; j += grid_threads()) {
        float gs[2] = {0.0f, 0.0f}, ps[2] = {0.0f, 0.0f}, ms[2] = {0.0f, 0.0f}, vs[2] = {0.0f, 0.0f};
        int count = 2 * j + 1 < n ? 2 : 1;
        for (int u = 0; u < count; ++u) {
            i64 i = 2 * j + u;
            gs[u] = grad[i];
            ps[u] = param[i];
            ms[u] = m[i];
            vs[u] = v[i];
        }
        for (int u = 0; u < count; ++u) {
            i64 i = 2 * j + u;
            adamw_one(ps[u], ms[u], vs[u], gs[u], ADAMW_PASS);
            param[i] = ps[u];
            copy[i] = ps[u];
            m[i] = ms[u];
            v[i] = vs[u];
        }
        if (words) ((unsigned*)words)[j] = bf16_pair(ps[0], ps[1]);
    }
}

extern "C" __global__ void adamw_step_copy(float* param, float* m, float* v, float* copy, float* words,
                                           const float* grad, i64 n, ADAMW_ARGS) {
    adamw_step_copy_of(param, m, v, copy, words, XF32{grad}, n, ADAMW_PASS);
}

extern "C" __global__ void adamw_step_copy_bf16g(float* param, float* m, float* v, float* copy, float* words,
                                                 const float* grad, i64 n, ADAMW_ARGS) {
    adamw_step_copy_of(param, m, v, copy, words, XBf16{(const unsigned*)grad}, n, ADAMW_PASS);
}
