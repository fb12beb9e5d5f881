// Fused causal attention in the FlashAttention manner: one block per (batch, head, query), the
// keys in tiles of blockDim.x whose scores and probabilities live in shared memory, an online
// softmax (running max and sum) and no [sq, sk] buffer; the backward recomputes the
// probabilities from q and k (FlashAttention-2's recomputation) in three passes without
// atomics: row statistics, dq per query, dk and dv per key.
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

// The backward in three passes, as FlashAttention-2 splits it, with no atomics:
// `attention_row_stats` (per query: the log-sum-exp and D = dO·O), `attention_backward_dq` (per
// query, over its keys) and `attention_backward_dkv` (per key, over the queries that see it).

// lse[r] and dsum[r] = Σ_j P_j (dO·v_j) of block row r (a query).
extern "C" __global__ void attention_row_stats(float* lse, float* dsum, const float* q, const float* k,
                                               const float* v, const float* go, Attention a) {
    __shared__ float qrow[PLAIT_MAX_HEAD_DIM];
    __shared__ float grow[PLAIT_MAX_HEAD_DIM];
    i64 rows = a.batch * a.heads * a.sq;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        AttnRow x = attn_row(a, r);
        load_row(qrow, q + (x.b * a.sq + x.i) * a.heads * a.d + x.h * a.d, a.d);
        load_row(grow, go + (x.b * a.sq + x.i) * a.heads * a.dv + x.h * a.dv, a.dv);
        __syncthreads();
        i64 vis = visible_keys(x.i, a.sq, a.sk, a.causal);
        float l = attn_log_sum_exp(a, qrow, k, x, vis);
        double part = 0.0;
        for (i64 j = threadIdx.x; j < vis; j += blockDim.x) {
            float p = expf(attn_score(a, qrow, key_row(a, k, x, j)) - l);
            part += (double)p * dot_row(grow, value_row(a, v, x, j), a.dv);
        }
        double d = block_sum(part);
        if (threadIdx.x == 0) {
            lse[r] = l;
            dsum[r] = (float)d;
        }
        __syncthreads();  // `qrow` and `grow` are reloaded for the next row
    }
}

// dS of query row (with `lse`, `dsum`) and key j: P (dP − D), through the soft cap.
__device__ float attn_score_grad(const Attention& a, float s, float p, double dp, float dsum) {
    float ds = (float)((double)p * (dp - (double)dsum));
    if (a.softcap > 0.0) {
        float c = s / (float)a.softcap;
        ds *= 1.0f - c * c;
    }
    return ds;
}

// dq of each query: scale · Σ_j dS_j k_j, keys in tiles of blockDim.x.
extern "C" __global__ void attention_backward_dq(float* dq, const float* q, const float* k, const float* v,
                                                 const float* go, const float* lse, const float* dsum,
                                                 Attention a) {
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
        for (i64 j0 = 0; j0 < vis; j0 += blockDim.x) {
            i64 j = j0 + threadIdx.x;
            float dsj = 0.0f;
            if (j < vis) {
                float s = attn_score(a, qrow, key_row(a, k, x, j));
                float p = expf(s - lse[r]);
                dsj = attn_score_grad(a, s, p, dot_row(grow, value_row(a, v, x, j), a.dv), dsum[r]);
            }
            ds[threadIdx.x] = dsj;
            __syncthreads();
            i64 n = vis - j0 < (i64)blockDim.x ? vis - j0 : (i64)blockDim.x;
            for (i64 c = threadIdx.x; c < a.d; c += blockDim.x) {
                double s2 = 0.0;
                for (i64 t = 0; t < n; ++t) s2 += (double)ds[t] * key_row(a, k, x, j0 + t)[c];
                dqacc[c] += (float)s2;
            }
            __syncthreads();  // `ds` is rewritten by the next tile
        }
        float* dqrow = dq + (x.b * a.sq + x.i) * a.heads * a.d + x.h * a.d;
        for (i64 c = threadIdx.x; c < a.d; c += blockDim.x) dqrow[c] = (float)a.scale * dqacc[c];
        __syncthreads();
    }
}

// dk and dv of each key (block row: batch, kv head, key): Σ over the query heads of its group
// and the queries that see the key of scale·dS q and P dO, queries in tiles of blockDim.x.
extern "C" __global__ void attention_backward_dkv(float* dk, float* dv, const float* q, const float* k,
                                                  const float* v, const float* go, const float* lse,
                                                  const float* dsum, Attention a) {
    __shared__ float krow[PLAIT_MAX_HEAD_DIM];
    __shared__ float vrow[PLAIT_MAX_HEAD_DIM];
    __shared__ float dkacc[PLAIT_MAX_HEAD_DIM];
    __shared__ float dvacc[PLAIT_MAX_HEAD_DIM];
    __shared__ float ps[PLAIT_MAX_BLOCK];
    __shared__ float ds[PLAIT_MAX_BLOCK];
    i64 rows = a.batch * a.kv * a.sk;
    i64 group = a.heads / a.kv;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 j = r % a.sk, g = (r / a.sk) % a.kv, b = r / (a.sk * a.kv);
        load_row(krow, k + (b * a.sk + j) * a.kv * a.d + g * a.d, a.d);
        load_row(vrow, v + (b * a.sk + j) * a.kv * a.dv + g * a.dv, a.dv);
        for (i64 c = threadIdx.x; c < a.d; c += blockDim.x) dkacc[c] = 0.0f;
        for (i64 c = threadIdx.x; c < a.dv; c += blockDim.x) dvacc[c] = 0.0f;
        __syncthreads();
        // The first query that sees key j (all of them without the mask).
        i64 first = a.causal ? j - (a.sk - a.sq) : 0;
        if (first < 0) first = 0;
        for (i64 h = g * group; h < (g + 1) * group; ++h) {
            for (i64 i0 = first; i0 < a.sq; i0 += blockDim.x) {
                i64 i = i0 + threadIdx.x;
                float p = 0.0f, dsi = 0.0f;
                if (i < a.sq) {
                    i64 row = (b * a.heads + h) * a.sq + i;
                    const float* qi = q + (b * a.sq + i) * a.heads * a.d + h * a.d;
                    const float* gi = go + (b * a.sq + i) * a.heads * a.dv + h * a.dv;
                    float s = attn_score(a, qi, krow);
                    p = expf(s - lse[row]);
                    dsi = attn_score_grad(a, s, p, dot_row(gi, vrow, a.dv), dsum[row]);
                }
                ps[threadIdx.x] = p;
                ds[threadIdx.x] = dsi;
                __syncthreads();
                i64 n = a.sq - i0 < (i64)blockDim.x ? a.sq - i0 : (i64)blockDim.x;
                for (i64 c = threadIdx.x; c < a.dv; c += blockDim.x) {
                    double s2 = 0.0;
                    for (i64 t = 0; t < n; ++t)
                        s2 += (double)ps[t] * go[(b * a.sq + i0 + t) * a.heads * a.dv + h * a.dv + c];
                    dvacc[c] += (float)s2;
                }
                for (i64 c = threadIdx.x; c < a.d; c += blockDim.x) {
                    double s2 = 0.0;
                    for (i64 t = 0; t < n; ++t)
                        s2 += (double)ds[t] * q[(b * a.sq + i0 + t) * a.heads * a.d + h * a.d + c];
                    dkacc[c] += (float)s2;
                }
                __syncthreads();  // `ps` and `ds` are rewritten by the next tile
            }
        }
        float* dkj = dk + (b * a.sk + j) * a.kv * a.d + g * a.d;
        float* dvj = dv + (b * a.sk + j) * a.kv * a.dv + g * a.dv;
        for (i64 c = threadIdx.x; c < a.d; c += blockDim.x) dkj[c] = (float)a.scale * dkacc[c];
        for (i64 c = threadIdx.x; c < a.dv; c += blockDim.x) dvj[c] = dvacc[c];
        __syncthreads();
    }
}
