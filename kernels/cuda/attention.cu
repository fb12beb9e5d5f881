// Fused causal attention in the FlashAttention manner, no [sq, sk] buffer. Heads up to 128 wide
// (ATTN_TILE_D) run FlashAttention-2's tiled loops (the `_tiled` kernels at the end): a block
// per tile of queries, each key and value tile loaded into shared memory once for all of them,
// an online softmax per row; the backward recomputes the probabilities in three passes without
// atomics: row statistics (lse, D = dO·O), dq per query tile, dk and dv per key tile. Wider
// heads (up to 512) take the kernels below: one block per query (and per key), keys in tiles
// of blockDim.x.
//
// These tiles run on the CUDA cores, products accumulated in f32: the f32 plans' attention
// (and a bf16 plan's on a device without tensor cores). attention_mma.cu has a bf16 plan's.

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

// scale·q·k, soft-capped: the score the CPU kernel computes (its dot in f64; here in f32, as
// FlashAttention accumulates: a head's 128 products round to ~1e-7 relative, and f64 runs at
// half f32's rate on an H100/H200's CUDA cores).
__device__ float attn_score(const Attention& a, const float* qrow, const float* kj) {
    float s = 0.0f;
    for (i64 c = 0; c < a.d; ++c) s = fmaf(qrow[c], kj[c], s);
    float x = s * (float)a.scale;
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
        for (i64 j0 = mask_first(a, vis); j0 < vis; j0 += blockDim.x) {
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
    for (i64 j0 = mask_first(a, vis); j0 < vis; j0 += blockDim.x) {
        i64 j = j0 + threadIdx.x;
        float s = j < vis ? attn_score(a, qrow, key_row(a, k, x, j)) : -INFINITY;
        float m_new = fmaxf(m, block_max(s));
        double tile = block_sum(j < vis ? (double)expf(s - m_new) : 0.0);
        l = l * expf(m - m_new) + tile;
        m = m_new;
    }
    return m + (float)log(l);
}

__device__ float dot_row(const float* a, const float* b, i64 n) {
    float s = 0.0f;
    for (i64 c = 0; c < n; ++c) s = fmaf(a[c], b[c], s);
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
        for (i64 j = mask_first(a, vis) + threadIdx.x; j < vis; j += blockDim.x) {
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
        for (i64 j0 = mask_first(a, vis); j0 < vis; j0 += blockDim.x) {
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
        // One past the last query that sees it (its window's reach).
        i64 end = window_last_query(a, j);
        for (i64 h = g * group; h < (g + 1) * group; ++h) {
            for (i64 i0 = first; i0 < end; i0 += blockDim.x) {
                i64 i = i0 + threadIdx.x;
                float p = 0.0f, dsi = 0.0f;
                if (i < end) {
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
                i64 n = end - i0 < (i64)blockDim.x ? end - i0 : (i64)blockDim.x;
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

// The forward in tiles, as FlashAttention-2 runs it: one block per (batch, head, tile of
// ATTN_TILE_Q queries); the key and value tiles (ATTN_TILE_K rows) pass through shared memory
// once per query tile instead of once per query; an online softmax per query row and the
// output accumulated in shared memory, no [sq, sk] buffer. Head widths up to ATTN_TILE_D (the
// launcher takes `attention_forward` beyond). Scores and products accumulate in f32.
#define ATTN_TILE_Q 16
#define ATTN_TILE_K 16
#define ATTN_TILE_D 128
// A tile row's stride in shared memory: one float past the widest head, so that the 16 keys a
// warp's threads read at one column fall in 16 different banks (at a stride of 128 floats
// they all fall in one, and the score loops ran 16 times serialized).
#define ATTN_ROW (ATTN_TILE_D + 1)

// Tile t of the grid: its batch, head and first query.
struct AttnTile {
    i64 b, h, g, q0;
};

__device__ AttnTile attn_tile(const Attention& a, i64 t) {
    i64 tiles = (a.sq + ATTN_TILE_Q - 1) / ATTN_TILE_Q;
    AttnTile x;
    x.q0 = (t % tiles) * ATTN_TILE_Q;
    x.h = (t / tiles) % a.heads;
    x.b = t / (tiles * a.heads);
    x.g = x.h / (a.heads / a.kv);
    return x;
}

// Keys query `qi` sees: by the causal rule (queries aligned with the last keys), or, where its
// whole-sequence position is given (`qpos`, context parallelism: keys in sequence order), the
// keys up to that position.
__device__ i64 attn_visible(const Attention& a, const float* qpos, i64 qi) {
    if (!qpos || !a.causal) return visible_keys(qi, a.sq, a.sk, a.causal);
    i64 v = (i64)qpos[qi] + 1;
    return v < a.sk ? v : a.sk;
}

// Whether query `qi` sees key `j`: below its visible count and, in a sliding window or a chunk,
// within it.
__device__ bool attn_sees(const Attention& a, const float* qpos, i64 qi, i64 j) {
    if (qi >= a.sq) return false;
    i64 vis = attn_visible(a, qpos, qi);
    return j < vis && j >= mask_first(a, vis);
}

// The first key tile (of `tile` keys) any query from `q0` on sees: in a sliding window, the tile
// of the first query's window (queries in order; with positions, every tile from 0).
__device__ i64 attn_first_tile(const Attention& a, const float* qpos, i64 q0, i64 tile) {
    if (qpos || (a.window <= 0 && a.chunk <= 0) || q0 >= a.sq) return 0;
    i64 first = mask_first(a, attn_visible(a, qpos, q0));
    return first - first % tile;
}

// Rows `r0 ..` of a [batch, n, width·heads]-strided tensor's head `hh` into `dst[rows][ATTN_ROW]`,
// zero past `n`.
__device__ void load_tile(float* dst, const float* src, i64 b, i64 r0, i64 rows, i64 n, i64 heads, i64 hh,
                          i64 width) {
    for (i64 e = threadIdx.x; e < rows * width; e += blockDim.x) {
        i64 i = e / width, c = e % width, r = r0 + i;
        dst[i * ATTN_ROW + c] = r < n ? src[((b * n + r) * heads + hh) * width + c] : 0.0f;
    }
}

// The tile's online softmax over every key its queries see: leaves the unnormalized output in
// `ot`, each row's running max in `m` and sum in `l` (FlashAttention-2's forward loop).
struct AttnForwardTiles {
    float* qt;
    float* kt;
    float* vt;
    float* ot;
    float* st;
    float* m;
    float* corr;
    double* l;
};

__device__ void attn_tile_forward(const Attention& a, const AttnTile& x, const float* q, const float* k,
                                  const float* v, const float* qpos, const AttnForwardTiles& w) {
    load_tile(w.qt, q, x.b, x.q0, ATTN_TILE_Q, a.sq, a.heads, x.h, a.d);
    for (i64 e = threadIdx.x; e < ATTN_TILE_Q * ATTN_ROW; e += blockDim.x) w.ot[e] = 0.0f;
    for (i64 i = threadIdx.x; i < ATTN_TILE_Q; i += blockDim.x) {
        w.m[i] = -INFINITY;
        w.l[i] = 0.0;
    }
    // Keys any query of the tile sees (the causal mask's visible count grows with the query).
    i64 last = (x.q0 + ATTN_TILE_Q < a.sq ? x.q0 + ATTN_TILE_Q : a.sq) - 1;
    i64 keys = attn_visible(a, qpos, last);
    for (i64 k0 = attn_first_tile(a, qpos, x.q0, ATTN_TILE_K); k0 < keys; k0 += ATTN_TILE_K) {
        __syncthreads();  // the previous tile's readers are done
        load_tile(w.kt, k, x.b, k0, ATTN_TILE_K, a.sk, a.kv, x.g, a.d);
        load_tile(w.vt, v, x.b, k0, ATTN_TILE_K, a.sk, a.kv, x.g, a.dv);
        __syncthreads();
        for (i64 e = threadIdx.x; e < ATTN_TILE_Q * ATTN_TILE_K; e += blockDim.x) {
            i64 i = e / ATTN_TILE_K, j = e % ATTN_TILE_K, qi = x.q0 + i;
            bool seen = attn_sees(a, qpos, qi, k0 + j);
            w.st[e] = seen ? attn_score(a, w.qt + i * ATTN_ROW, w.kt + j * ATTN_ROW) : -INFINITY;
        }
        __syncthreads();
        for (i64 i = threadIdx.x; i < ATTN_TILE_Q; i += blockDim.x) {
            float* row = w.st + i * ATTN_TILE_K;
            float m_new = w.m[i];
            for (i64 j = 0; j < ATTN_TILE_K; ++j) m_new = fmaxf(m_new, row[j]);
            double tile = 0.0;
            for (i64 j = 0; j < ATTN_TILE_K; ++j) {
                row[j] = row[j] == -INFINITY ? 0.0f : expf(row[j] - m_new);
                tile += row[j];
            }
            w.corr[i] = w.m[i] == -INFINITY ? 0.0f : expf(w.m[i] - m_new);
            w.l[i] = w.l[i] * w.corr[i] + tile;
            w.m[i] = m_new;
        }
        __syncthreads();
        for (i64 e = threadIdx.x; e < ATTN_TILE_Q * a.dv; e += blockDim.x) {
            i64 i = e / a.dv, c = e % a.dv;
            float s2 = 0.0f;
            for (i64 j = 0; j < ATTN_TILE_K; ++j) s2 = fmaf(w.st[i * ATTN_TILE_K + j], w.vt[j * ATTN_ROW + c], s2);
            w.ot[i * ATTN_ROW + c] = fmaf(w.ot[i * ATTN_ROW + c], w.corr[i], s2);
        }
    }
    __syncthreads();
}

// The shared tiles of one block of the tiled forward.
#define ATTN_FORWARD_TILES                                              \
    __shared__ float qt[ATTN_TILE_Q * ATTN_ROW];                     \
    __shared__ float kt[ATTN_TILE_K * ATTN_ROW];                     \
    __shared__ float vt[ATTN_TILE_K * ATTN_ROW];                     \
    __shared__ float ot[ATTN_TILE_Q * ATTN_ROW];                     \
    __shared__ float st[ATTN_TILE_Q * ATTN_TILE_K];                     \
    __shared__ float m[ATTN_TILE_Q], corr[ATTN_TILE_Q];                 \
    __shared__ double l[ATTN_TILE_Q];                                   \
    AttnForwardTiles w = {qt, kt, vt, ot, st, m, corr, l};

__device__ i64 attn_tiles(const Attention& a) { return a.batch * a.heads * ((a.sq + ATTN_TILE_Q - 1) / ATTN_TILE_Q); }

extern "C" __global__ void attention_forward_tiled(float* o, const float* q, const float* k, const float* v,
                                                   const float* qpos, Attention a) {
    ATTN_FORWARD_TILES
    for (i64 t = blockIdx.x; t < attn_tiles(a); t += gridDim.x) {
        AttnTile x = attn_tile(a, t);
        attn_tile_forward(a, x, q, k, v, qpos, w);
        for (i64 e = threadIdx.x; e < ATTN_TILE_Q * a.dv; e += blockDim.x) {
            i64 i = e / a.dv, c = e % a.dv, qi = x.q0 + i;
            if (qi < a.sq)
                o[((x.b * a.sq + qi) * a.heads + x.h) * a.dv + c] =
                    l[i] > 0.0 ? (float)(ot[i * ATTN_ROW + c] / l[i]) : 0.0f;
        }
        __syncthreads();  // the shared tiles are reloaded for the next tile
    }
}

// The backward's row statistics in tiles: lse = m + log l and D = dO·O from the recomputed
// output (FlashAttention-2's D), per query row (row index (batch·heads + head)·sq + query).
extern "C" __global__ void attention_row_stats_tiled(float* lse, float* dsum, const float* q, const float* k,
                                                     const float* v, const float* go, const float* qpos,
                                                     Attention a) {
    ATTN_FORWARD_TILES
    for (i64 t = blockIdx.x; t < attn_tiles(a); t += gridDim.x) {
        AttnTile x = attn_tile(a, t);
        attn_tile_forward(a, x, q, k, v, qpos, w);
        for (i64 i = threadIdx.x; i < ATTN_TILE_Q; i += blockDim.x) {
            i64 qi = x.q0 + i;
            if (qi >= a.sq) continue;
            const float* g = go + ((x.b * a.sq + qi) * a.heads + x.h) * a.dv;
            double d = 0.0;
            for (i64 c = 0; c < a.dv; ++c) d += (double)g[c] * (l[i] > 0.0 ? ot[i * ATTN_ROW + c] / l[i] : 0.0);
            i64 row = (x.b * a.heads + x.h) * a.sq + qi;
            lse[row] = l[i] > 0.0 ? m[i] + (float)log(l[i]) : -INFINITY;
            dsum[row] = (float)d;
        }
        __syncthreads();
    }
}

// dS of a score tile entry: P (dP − D) through the soft cap, 0 where masked (`s` = −inf).
__device__ float attn_tile_ds(const Attention& a, float s, float lse, const float* grow, const float* vrow,
                              float dsum, float* p_out) {
    if (s == -INFINITY) {
        *p_out = 0.0f;
        return 0.0f;
    }
    float p = expf(s - lse);
    *p_out = p;
    return attn_score_grad(a, s, p, dot_row(grow, vrow, a.dv), dsum);
}

// dq in tiles: per query tile, over the key tiles its queries see, dq += scale · dS k.
extern "C" __global__ void attention_backward_dq_tiled(float* dq, const float* q, const float* k, const float* v,
                                                       const float* go, const float* lse, const float* dsum,
                                                       const float* qpos, Attention a) {
    __shared__ float qt[ATTN_TILE_Q * ATTN_ROW];
    __shared__ float gt[ATTN_TILE_Q * ATTN_ROW];
    __shared__ float kt[ATTN_TILE_K * ATTN_ROW];
    __shared__ float vt[ATTN_TILE_K * ATTN_ROW];
    __shared__ float dqt[ATTN_TILE_Q * ATTN_ROW];
    __shared__ float dst[ATTN_TILE_Q * ATTN_TILE_K];
    for (i64 t = blockIdx.x; t < attn_tiles(a); t += gridDim.x) {
        AttnTile x = attn_tile(a, t);
        load_tile(qt, q, x.b, x.q0, ATTN_TILE_Q, a.sq, a.heads, x.h, a.d);
        load_tile(gt, go, x.b, x.q0, ATTN_TILE_Q, a.sq, a.heads, x.h, a.dv);
        for (i64 e = threadIdx.x; e < ATTN_TILE_Q * ATTN_ROW; e += blockDim.x) dqt[e] = 0.0f;
        i64 last = (x.q0 + ATTN_TILE_Q < a.sq ? x.q0 + ATTN_TILE_Q : a.sq) - 1;
        i64 keys = attn_visible(a, qpos, last);
        i64 row0 = (x.b * a.heads + x.h) * a.sq + x.q0;
        for (i64 k0 = attn_first_tile(a, qpos, x.q0, ATTN_TILE_K); k0 < keys; k0 += ATTN_TILE_K) {
            __syncthreads();
            load_tile(kt, k, x.b, k0, ATTN_TILE_K, a.sk, a.kv, x.g, a.d);
            load_tile(vt, v, x.b, k0, ATTN_TILE_K, a.sk, a.kv, x.g, a.dv);
            __syncthreads();
            for (i64 e = threadIdx.x; e < ATTN_TILE_Q * ATTN_TILE_K; e += blockDim.x) {
                i64 i = e / ATTN_TILE_K, j = e % ATTN_TILE_K, qi = x.q0 + i;
                bool seen = attn_sees(a, qpos, qi, k0 + j);
                float s = seen ? attn_score(a, qt + i * ATTN_ROW, kt + j * ATTN_ROW) : -INFINITY;
                float p;
                dst[e] = seen ? attn_tile_ds(a, s, lse[row0 + i], gt + i * ATTN_ROW, vt + j * ATTN_ROW,
                                             dsum[row0 + i], &p)
                              : 0.0f;
            }
            __syncthreads();
            for (i64 e = threadIdx.x; e < ATTN_TILE_Q * a.d; e += blockDim.x) {
                i64 i = e / a.d, c = e % a.d;
                float s2 = 0.0f;
                for (i64 j = 0; j < ATTN_TILE_K; ++j) s2 = fmaf(dst[i * ATTN_TILE_K + j], kt[j * ATTN_ROW + c], s2);
                dqt[i * ATTN_ROW + c] += s2;
            }
        }
        __syncthreads();
        for (i64 e = threadIdx.x; e < ATTN_TILE_Q * a.d; e += blockDim.x) {
            i64 i = e / a.d, c = e % a.d, qi = x.q0 + i;
            if (qi < a.sq) dq[((x.b * a.sq + qi) * a.heads + x.h) * a.d + c] = (float)a.scale * dqt[i * ATTN_ROW + c];
        }
        __syncthreads();
    }
}

// dk and dv in tiles: per (batch, kv head, key tile), over the query heads of the group and
// the query tiles (ATTN_BWD_Q rows) that see the keys: dv += P dO, dk += scale · dS q.
#define ATTN_BWD_Q 8

extern "C" __global__ void attention_backward_dkv_tiled(float* dk, float* dv, const float* q, const float* k,
                                                        const float* v, const float* go, const float* lse,
                                                        const float* dsum, const float* qpos, Attention a) {
    __shared__ float kt[ATTN_TILE_K * ATTN_ROW];
    __shared__ float vt[ATTN_TILE_K * ATTN_ROW];
    __shared__ float dkt[ATTN_TILE_K * ATTN_ROW];
    __shared__ float dvt[ATTN_TILE_K * ATTN_ROW];
    __shared__ float qt[ATTN_BWD_Q * ATTN_ROW];
    __shared__ float gt[ATTN_BWD_Q * ATTN_ROW];
    __shared__ float pt[ATTN_BWD_Q * ATTN_TILE_K];
    __shared__ float dst[ATTN_BWD_Q * ATTN_TILE_K];
    i64 key_tiles = (a.sk + ATTN_TILE_K - 1) / ATTN_TILE_K;
    i64 tiles = a.batch * a.kv * key_tiles;
    i64 group = a.heads / a.kv;
    for (i64 t = blockIdx.x; t < tiles; t += gridDim.x) {
        i64 k0 = (t % key_tiles) * ATTN_TILE_K, g = (t / key_tiles) % a.kv, b = t / (key_tiles * a.kv);
        load_tile(kt, k, b, k0, ATTN_TILE_K, a.sk, a.kv, g, a.d);
        load_tile(vt, v, b, k0, ATTN_TILE_K, a.sk, a.kv, g, a.dv);
        for (i64 e = threadIdx.x; e < ATTN_TILE_K * ATTN_ROW; e += blockDim.x) {
            dkt[e] = 0.0f;
            dvt[e] = 0.0f;
        }
        // The first query that sees key k0 (all of them without the mask; with positions the
        // mask alone says).
        i64 first = a.causal && !qpos ? k0 - (a.sk - a.sq) : 0;
        if (first < 0) first = 0;
        // One past the last query that sees the tile's last key (with positions, every query).
        i64 end = qpos ? a.sq : window_last_query(a, k0 + ATTN_TILE_K - 1);
        for (i64 h = g * group; h < (g + 1) * group; ++h) {
            for (i64 i0 = first; i0 < end; i0 += ATTN_BWD_Q) {
                __syncthreads();
                load_tile(qt, q, b, i0, ATTN_BWD_Q, a.sq, a.heads, h, a.d);
                load_tile(gt, go, b, i0, ATTN_BWD_Q, a.sq, a.heads, h, a.dv);
                __syncthreads();
                for (i64 e = threadIdx.x; e < ATTN_BWD_Q * ATTN_TILE_K; e += blockDim.x) {
                    i64 i = e / ATTN_TILE_K, j = e % ATTN_TILE_K, qi = i0 + i;
                    bool seen = attn_sees(a, qpos, qi, k0 + j);
                    i64 row = (b * a.heads + h) * a.sq + qi;
                    float s = seen ? attn_score(a, qt + i * ATTN_ROW, kt + j * ATTN_ROW) : -INFINITY;
                    float p = 0.0f;
                    dst[e] = seen ? attn_tile_ds(a, s, lse[row], gt + i * ATTN_ROW, vt + j * ATTN_ROW,
                                                 dsum[row], &p)
                                  : 0.0f;
                    pt[e] = p;
                }
                __syncthreads();
                for (i64 e = threadIdx.x; e < ATTN_TILE_K * a.dv; e += blockDim.x) {
                    i64 j = e / a.dv, c = e % a.dv;
                    float s2 = 0.0f;
                    for (i64 i = 0; i < ATTN_BWD_Q; ++i) s2 = fmaf(pt[i * ATTN_TILE_K + j], gt[i * ATTN_ROW + c], s2);
                    dvt[j * ATTN_ROW + c] += s2;
                }
                for (i64 e = threadIdx.x; e < ATTN_TILE_K * a.d; e += blockDim.x) {
                    i64 j = e / a.d, c = e % a.d;
                    float s2 = 0.0f;
                    for (i64 i = 0; i < ATTN_BWD_Q; ++i) s2 = fmaf(dst[i * ATTN_TILE_K + j], qt[i * ATTN_ROW + c], s2);
                    dkt[j * ATTN_ROW + c] += s2;
                }
            }
        }
        __syncthreads();
        for (i64 e = threadIdx.x; e < ATTN_TILE_K * a.d; e += blockDim.x) {
            i64 j = e / a.d, c = e % a.d;
            if (k0 + j < a.sk) dk[((b * a.sk + k0 + j) * a.kv + g) * a.d + c] = (float)a.scale * dkt[j * ATTN_ROW + c];
        }
        for (i64 e = threadIdx.x; e < ATTN_TILE_K * a.dv; e += blockDim.x) {
            i64 j = e / a.dv, c = e % a.dv;
            if (k0 + j < a.sk) dv[((b * a.sk + k0 + j) * a.kv + g) * a.dv + c] = dvt[j * ATTN_ROW + c];
        }
        __syncthreads();
    }
}

// Attention sinks (gpt-oss): one more logit s_h per head in every row's softmax, reading no
// value. The kernels above attend without it; these correct what they made. With l the row's
// log-sum-exp over its keys, the keys keep 1/(1 + e^(s − l)) of the row and the sink the rest,
// so O' = O / (1 + e^(s − l)), l' = log(e^l + e^s) and D' = dO·O' = D / (1 + e^(s − l)); the
// backward's kernels, given l' and D', make the gradients of q, k and v with the sink, and the
// sink's own is −Σ_rows e^(s − l') D'. `log2u`: l in log₂ units (the tensor-core kernels'), s
// scaled to them.

__device__ float sink_of(const float* sinks, const Attention& a, i64 r, int log2u) {
    float s = sinks[(r / a.sq) % a.heads];
    return log2u ? s * 1.4426950408889634f : s;
}

__device__ float exp_units(float x, int log2u) { return log2u ? exp2f(x) : expf(x); }

// log(e^l + e^s) in the units.
__device__ float add_sink(float l, float s, int log2u) {
    float m = fmaxf(l, s);
    float t = exp_units(l - m, log2u) + exp_units(s - m, log2u);
    return m + (log2u ? log2f(t) : logf(t));
}

// o (and lse, to l') of every row with its head's sink.
extern "C" __global__ void attention_sink_forward(float* o, float* lse, const float* sinks, Attention a,
                                                  int log2u) {
    i64 rows = a.batch * a.heads * a.sq;
    for (i64 r = global_thread(); r < rows; r += grid_threads()) {
        AttnRow x = attn_row(a, r);
        float l = lse[r], s = sink_of(sinks, a, r, log2u);
        float keep = 1.0f / (1.0f + exp_units(s - l, log2u));
        float* orow = o + (x.b * a.sq + x.i) * a.heads * a.dv + x.h * a.dv;
        for (i64 c = 0; c < a.dv; ++c) orow[c] *= keep;
        lse[r] = add_sink(l, s, log2u);
    }
}

// The backward's row statistics (l, D) to (l', D').
extern "C" __global__ void attention_sink_stats(float* lse, float* dsum, const float* sinks, Attention a,
                                                int log2u) {
    i64 rows = a.batch * a.heads * a.sq;
    for (i64 r = global_thread(); r < rows; r += grid_threads()) {
        float l = lse[r], s = sink_of(sinks, a, r, log2u);
        dsum[r] = dsum[r] / (1.0f + exp_units(s - l, log2u));
        lse[r] = add_sink(l, s, log2u);
    }
}

// dsinks[h] = −Σ over head h's rows of e^(s − l') D', rows in order per thread, in f64; a
// block per head.
extern "C" __global__ void attention_sink_grad(float* dsinks, const float* lse, const float* dsum,
                                               const float* sinks, Attention a, int log2u) {
    for (i64 h = blockIdx.x; h < a.heads; h += gridDim.x) {
        double part = 0.0;
        for (i64 t = threadIdx.x; t < a.batch * a.sq; t += blockDim.x) {
            i64 r = (t / a.sq) * a.heads * a.sq + h * a.sq + t % a.sq;
            float s = sink_of(sinks, a, r, log2u);
            part += (double)exp_units(s - lse[r], log2u) * (double)dsum[r];
        }
        double total = block_sum(part);
        if (threadIdx.x == 0) dsinks[h] = (float)(-total);
        __syncthreads();
    }
}
