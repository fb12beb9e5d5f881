// Fused causal attention in the FlashAttention manner: one block per (batch, head, query), the
// keys in tiles of blockDim.x whose scores and probabilities live in shared memory, an online
// softmax (running max and sum) and no [sq, sk] buffer; the backward recomputes the
// probabilities from q and k (FlashAttention-2's recomputation), writes its query's dq row and
// adds into dk and dv with atomics (query heads that share a kv head meet there).
//
// TODO(runtime, issue 15): tensor-core tiles (several queries per block, mma); this is the
// correct, memory-lean form, not yet the fast one.

#define PLAIT_MAX_HEAD_DIM 512

// The query's position, head, batch and kv head of block row `r`.
struct AttnRow {
    i64 i, h, b, g;
};

__device__ AttnRow attn_row(const Attention& a, i64 r) {
    AttnRow x;
    x.i = r % a.sq;
    x.h = (r / a.sq) % a.heads;
    x.b = r / (a.sq * a.heads);
    x.g = x.h / (a.heads / a.kv);
    return x;
}

__device__ const float* key_row(const Attention& a, const float* k, const AttnRow& x, i64 j) {
    return k + (x.b * a.sk + j) * a.kv * a.d + x.g * a.d;
}

__device__ const float* value_row(const Attention& a, const float* v, const AttnRow& x, i64 j) {
    return v + (x.b * a.sk + j) * a.kv * a.dv + x.g * a.dv;
}

// scale·q·k, soft-capped: the score the CPU kernel computes (f32 result, f64 dot).
__device__ float attn_score(const Attention& a, const float* qrow, const float* kj) {
    double s = 0.0;
    for (i64 c = 0; c < a.d; ++c) s += (double)qrow[c] * kj[c];
    float x = (float)(s * a.scale);
    if (a.softcap > 0.0) {
        float cap = (float)a.softcap;
        x = cap * tanhf(x / cap);
    }
    return x;
}

// Copies `n` floats of global memory into shared `dst` (the block's threads striding).
__device__ void load_row(float* dst, const float* src, i64 n) {
    for (i64 c = threadIdx.x; c < n; c += blockDim.x) dst[c] = src[c];
}

extern "C" __global__ void attention_forward(float* o, const float* q, const float* k, const float* v,
                                             Attention a) {
    __shared__ float qrow[PLAIT_MAX_HEAD_DIM];
    __shared__ float acc[PLAIT_MAX_HEAD_DIM];
    __shared__ float prob[PLAIT_MAX_BLOCK];
    i64 rows = a.batch * a.heads * a.sq;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        AttnRow x = attn_row(a, r);
        load_row(qrow, q + (x.b * a.sq + x.i) * a.heads * a.d + x.h * a.d, a.d);
        for (i64 c = threadIdx.x; c < a.dv; c += blockDim.x) acc[c] = 0.0f;
        __syncthreads();
        i64 vis = visible_keys(x.i, a.sq, a.sk, a.causal);
        float m = -INFINITY;
        double l = 0.0;
        for (i64 j0 = 0; j0 < vis; j0 += blockDim.x) {
            i64 j = j0 + threadIdx.x;
            float s = j < vis ? attn_score(a, qrow, key_row(a, k, x, j)) : -INFINITY;
            float m_new = fmaxf(m, block_max(s));
            float e = j < vis ? expf(s - m_new) : 0.0f;
            prob[threadIdx.x] = e;
            double tile = block_sum((double)e);  // its barrier publishes `prob`
            float correction = expf(m - m_new);
            l = l * correction + tile;
            i64 n = vis - j0 < (i64)blockDim.x ? vis - j0 : (i64)blockDim.x;
            for (i64 c = threadIdx.x; c < a.dv; c += blockDim.x) {
                double s2 = 0.0;
                for (i64 t = 0; t < n; ++t) s2 += (double)prob[t] * value_row(a, v, x, j0 + t)[c];
                acc[c] = (float)((double)acc[c] * correction + s2);
            }
            m = m_new;
            __syncthreads();  // `prob` is rewritten by the next tile
        }
        float* orow = o + (x.b * a.sq + x.i) * a.heads * a.dv + x.h * a.dv;
        for (i64 c = threadIdx.x; c < a.dv; c += blockDim.x) orow[c] = vis > 0 ? (float)(acc[c] / l) : 0.0f;
        __syncthreads();  // `qrow` and `acc` are reloaded for the next row
    }
}

// The row's max score and log of its exponentials' sum: its softmax is exp(s − lse).
__device__ float attn_log_sum_exp(const Attention& a, const float* qrow, const float* k, const AttnRow& x,
                                  i64 vis) {
    float m = -INFINITY;
    double l = 0.0;
    for (i64 j0 = 0; j0 < vis; j0 += blockDim.x) {
        i64 j = j0 + threadIdx.x;
        float s = j < vis ? attn_score(a, qrow, key_row(a, k, x, j)) : -INFINITY;
        float m_new = fmaxf(m, block_max(s));
        double tile = block_sum(j < vis ? (double)expf(s - m_new) : 0.0);
        l = l * expf(m - m_new) + tile;
        m = m_new;
    }
    return m + (float)log(l);
}

__device__ double dot_row(const float* a, const float* b, i64 n) {
    double s = 0.0;
    for (i64 c = 0; c < n; ++c) s += (double)a[c] * b[c];
    return s;
}

// dq (written), dk and dv (added into; zeroed by the caller) of the output gradient `go`.
extern "C" __global__ void attention_backward(float* dq, float* dk, float* dv, const float* q, const float* k,
                                              const float* v, const float* go, Attention a) {
    __shared__ float qrow[PLAIT_MAX_HEAD_DIM];
    __shared__ float grow[PLAIT_MAX_HEAD_DIM];
    __shared__ float dqacc[PLAIT_MAX_HEAD_DIM];
    __shared__ float ds[PLAIT_MAX_BLOCK];
    i64 rows = a.batch * a.heads * a.sq;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        AttnRow x = attn_row(a, r);
        load_row(qrow, q + (x.b * a.sq + x.i) * a.heads * a.d + x.h * a.d, a.d);
        load_row(grow, go + (x.b * a.sq + x.i) * a.heads * a.dv + x.h * a.dv, a.dv);
        for (i64 c = threadIdx.x; c < a.d; c += blockDim.x) dqacc[c] = 0.0f;
        __syncthreads();
        i64 vis = visible_keys(x.i, a.sq, a.sk, a.causal);
        float lse = attn_log_sum_exp(a, qrow, k, x, vis);
        // D = Σ_j P_j (dO · v_j) = dO · O.
        double part = 0.0;
        for (i64 j = threadIdx.x; j < vis; j += blockDim.x) {
            float p = expf(attn_score(a, qrow, key_row(a, k, x, j)) - lse);
            part += (double)p * dot_row(grow, value_row(a, v, x, j), a.dv);
        }
        double big_d = block_sum(part);
        float scale = (float)a.scale;
        for (i64 j0 = 0; j0 < vis; j0 += blockDim.x) {
            i64 j = j0 + threadIdx.x;
            float dsj = 0.0f;
            if (j < vis) {
                const float* kj = key_row(a, k, x, j);
                float s = attn_score(a, qrow, kj);
                float p = expf(s - lse);
                double dp = dot_row(grow, value_row(a, v, x, j), a.dv);
                dsj = (float)((double)p * (dp - big_d));
                if (a.softcap > 0.0) {
                    float c = s / (float)a.softcap;
                    dsj *= 1.0f - c * c;
                }
                float* dvj = dv + (x.b * a.sk + j) * a.kv * a.dv + x.g * a.dv;
                for (i64 c = 0; c < a.dv; ++c) atomicAdd(&dvj[c], p * grow[c]);
                float* dkj = dk + (x.b * a.sk + j) * a.kv * a.d + x.g * a.d;
                for (i64 c = 0; c < a.d; ++c) atomicAdd(&dkj[c], scale * dsj * qrow[c]);
            }
            ds[threadIdx.x] = dsj;
            __syncthreads();
            i64 n = vis - j0 < (i64)blockDim.x ? vis - j0 : (i64)blockDim.x;
            for (i64 c = threadIdx.x; c < a.d; c += blockDim.x) {
                double s2 = 0.0;
                for (i64 t = 0; t < n; ++t) s2 += (double)ds[t] * key_row(a, k, x, j0 + t)[c];
                dqacc[c] += (float)s2;
            }
            __syncthreads();
        }
        float* dqrow = dq + (x.b * a.sq + x.i) * a.heads * a.d + x.h * a.d;
        for (i64 c = threadIdx.x; c < a.d; c += blockDim.x) dqrow[c] = scale * dqacc[c];
        __syncthreads();
    }
}
