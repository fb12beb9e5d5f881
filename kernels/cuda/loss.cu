// Cross-entropy of logits[N, V] against integer targets (stored as f32, as the IR does), the
// mean over the N rows (kernels/src/loss.rs). A target outside [0, V) gives NaN, so a bad
// batch shows in the loss instead of reading past the row. The logits' rows lie `pitch` ≥ V
// elements apart: V for a dense tensor, more where a bf16 GEMM wrote them at its padded pitch
// (an LM head over a vocabulary of odd width), read where they lie instead of copied out.

// log Σ exp(row) in one pass over the row (a vocabulary's row is read once, not twice): each
// thread keeps its running maximum and its sum of exp(x − max), rescaled when the maximum
// grows; the block then rescales every thread's sum to the row's maximum. The sums are f64,
// the exponentials f32 (expf, within 2 ulp; f64 exp made these kernels compute-bound).
__device__ double row_log_sum_exp(const float* row, i64 v) {
    float m = -INFINITY;
    double s = 0.0;
    for (i64 j0 = threadIdx.x; j0 < v; j0 += ILP * blockDim.x) {
        float xs[ILP];
#pragma unroll
        for (int u = 0; u < ILP; ++u) xs[u] = j0 + u * blockDim.x < v ? row[j0 + u * blockDim.x] : -INFINITY;
#pragma unroll
        for (int u = 0; u < ILP; ++u) {
            float x = xs[u];
            if (x == -INFINITY) continue;  // contributes nothing (and −∞ − −∞ is NaN)
            if (x > m) {
                s *= (double)expf(m - x);
                m = x;
            }
            s += (double)expf(x - m);
        }
    }
    float top = block_max(m);
    double mine = m == -INFINITY ? 0.0 : s * (double)expf(m - top);
    return (double)top + log(block_sum(mine));
}

__device__ i64 target_index(float t, i64 v) {
    i64 i = (i64)t;
    return ((float)i == t && i >= 0 && i < v) ? i : -1;
}

// One block per row: per_row[r] = lse(row) − row[target].
extern "C" __global__ void cross_entropy_rows(float* per_row, const float* logits, const float* targets, i64 n,
                                              i64 v, i64 pitch) {
    for (i64 r = blockIdx.x; r < n; r += gridDim.x) {
        const float* row = logits + r * pitch;
        double lse = row_log_sum_exp(row, v);
        i64 t = target_index(targets[r], v);
        if (threadIdx.x == 0) per_row[r] = t < 0 ? NAN : (float)(lse - row[t]);
    }
}

// out[0] = mean of x[0..n), one block, in f64.
extern "C" __global__ void mean_all(float* out, const float* x, i64 n) {
    double s = 0.0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
    s = block_sum(s);
    if (threadIdx.x == 0) out[0] = (float)(s / (double)n);
}

// d logits[r, j] = g/N · (softmax(row) − onehot(target)) as f32, from the row's log-sum-exp
// `lse` and its target `t` (< 0: a bad target, NaN); `scale` is g/N.
__device__ __forceinline__ float cross_entropy_grad(float x, i64 j, double lse, i64 t, double scale) {
    double p = (double)expf((float)((double)x - lse)) - (j == t ? 1.0 : 0.0);
    return t < 0 ? NAN : (float)(p * scale);
}

// d logits = g/N · (softmax(row) − onehot(target)); `g` is the loss gradient (one element).
// dlogits is dense ([N, V]).
extern "C" __global__ void cross_entropy_backward(float* dlogits, const float* logits, const float* targets,
                                                  const float* g, i64 n, i64 v, i64 pitch) {
    double scale = (double)g[0] / (double)n;
    for (i64 r = blockIdx.x; r < n; r += gridDim.x) {
        const float* row = logits + r * pitch;
        double lse = row_log_sum_exp(row, v);
        i64 t = target_index(targets[r], v);
        for (i64 j0 = threadIdx.x; j0 < v; j0 += ILP * blockDim.x) {
            float x[ILP];
#pragma unroll
            for (int u = 0; u < ILP; ++u) x[u] = j0 + u * blockDim.x < v ? row[j0 + u * blockDim.x] : 0.0f;
#pragma unroll
            for (int u = 0; u < ILP; ++u) {
                i64 j = j0 + u * blockDim.x;
                if (j >= v) continue;
                dlogits[r * v + j] = cross_entropy_grad(x[u], j, lse, t, scale);
            }
        }
    }
}

// The same gradient written as a bf16 GEMM's operand (`to_bf16`'s copy of it, which the LM
// head's backward reads next): each value rounded to bf16, two to a word, each row
// `out_pitch` (even, ≥ V) bf16 wide with zeros past V. The f32 gradient (twice the bytes,
// written, then read again by `to_bf16`) is never made.
extern "C" __global__ void cross_entropy_backward_words(float* dwords, const float* logits, const float* targets,
                                                        const float* g, i64 n, i64 v, i64 pitch, i64 out_pitch) {
    double scale = (double)g[0] / (double)n;
    unsigned* words = (unsigned*)dwords;
    i64 per_row = out_pitch / 2;
    for (i64 r = blockIdx.x; r < n; r += gridDim.x) {
        const float* row = logits + r * pitch;
        double lse = row_log_sum_exp(row, v);
        i64 t = target_index(targets[r], v);
        for (i64 w = threadIdx.x; w < per_row; w += blockDim.x) {
            i64 j = 2 * w;
            float lo = j < v ? cross_entropy_grad(row[j], j, lse, t, scale) : 0.0f;
            float hi = j + 1 < v ? cross_entropy_grad(row[j + 1], j + 1, lse, t, scale) : 0.0f;
            words[r * per_row + w] = bf16_pair(lo, hi);
        }
    }
}
