// Fused causal attention on the tensor cores, for bf16 plans: FlashAttention-2's loops with
// every product a warp-wide `mma.sync.m16n8k16` on bf16 operands, accumulated in f32 (the
// operand rounding is the bf16 plan's own; the f32 plans keep attention.cu's CUDA-core tiles).
// The kernels take the same arguments, masks (causal, query positions), soft cap and grouped
// heads as attention.cu's `_tiled` kernels, for heads 32, 64 or 128 wide (d = dv).
//
// A block is four warps; each warp owns 16 rows (queries, or keys in dk/dv) and keeps its
// operand fragments and accumulators in registers, while the block streams the other side's
// tiles through shared memory as bf16, row-major. `ldmatrix` reads a tile's B fragments four
// 8×8 matrices at a time: as they lie for the products whose B is indexed by the tile's
// columns (Q·Kᵀ), transposed (`.trans`) for those indexed by its rows (P·V), so one tile of
// each operand serves both. Row strides are padded by four words so that the eight rows one
// matrix reads fall in different banks. Tiles arrive by `cp.async` into one of two buffers
// while the other is multiplied, and the softmax runs in base 2 (one `exp2f` a score).
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"; lane = 4·group + t):
//   A (16×16, row-major): a0 = (group, 2t..2t+1), a1 = (group+8, 2t..), a2 = (group, 2t+8..),
//                         a3 = (group+8, 2t+8..)
//   B (16×8, k × n):      b0 = (k 2t..2t+1, n group), b1 = (k 2t+8.., n group)
//   C (16×8, f32):        c0, c1 = (group, 2t..2t+1), c2, c3 = (group+8, 2t..2t+1)
// so an accumulator tile pair (n-tiles 2j, 2j+1) is, packed to bf16, the A fragment of the next
// product (FlashAttention-2's register reuse of P).
//
// Under the `simt` emulator a warp's lanes meet at each product and shuffle (simt.hpp), so these
// kernels run there too when the emulated device says it has tensor cores (`Device::
// tensor_cores`; tests/tests/device_ops.rs); `plait bench kernels --device cuda` checks them
// against the CPU kernels on a GPU.

// The tensor-core instructions (mma.sync on bf16, ldmatrix, cvt to bf16x2) exist from sm_80
// on. For an older GPU the program still compiles: these kernels never run there (the device
// says it has no tensor cores, cuda.rs), and their products trap.
#if defined(__CUDACC_RTC__) && __CUDA_ARCH__ >= 800
#define MMA_PTX 1
#else
#define MMA_PTX 0
#endif

#define MMA_THREADS 128
#define MMA_WARP_ROWS 16
#define MMA_BLOCK_ROWS 64
// Keys per shared tile in the forward; queries (dk, dv) or keys (dq) per tile in the backward.
// (The forward's tile is 64 keys up to heads 64 wide, 32 beyond: two buffers of each of K and
// V must fit the 48 KB of static shared memory a block may declare.)
#define MMA_FWD_TILE(d) ((d) > 64 ? 32 : 64)
#define MMA_BWD_TILE 32
// Queries per tile in dk, dv: 16 for heads over 64 wide, whose key fragments and dk, dv
// accumulators already take 192 registers a thread (at 32 the kernel spilled).
#define MMA_DKV_TILE(d) ((d) > 64 ? 16 : MMA_BWD_TILE)
// Row stride, in 32-bit words, of a row-major tile of `d` bf16 columns (+4 words).
#define MMA_ROW_WORDS(d) ((d) / 2 + 4)

// Two bf16 in one word, the lower column in the lower half (the fragments' order): one
// `cvt.rn.bf16x2.f32` on the GPU (sm_80 on), the same rounding by hand under the emulator.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
#if MMA_PTX
    unsigned w;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
    return w;
#else
    return bf16_bits(lo) | (bf16_bits(hi) << 16);
#endif
}

// The operands as the kernels read them: q, k, v and dO as bf16 words in their own layout
// [batch, n, heads, d] (two to a word, in order: a bf16 plan's words of them, made by the
// kernel that wrote them, back from the stash, or one `to_bf16` of f32 values), so that no
// copy gathers each head's rows first. A head's rows are `heads·d/2` words apart; a tile's rows
// past `n` read as zeros. Each head row is d/2 words, whole 16-byte words for d a multiple of 8.
struct MmaHead {
    const unsigned* base;  // row 0 of the head
    i64 stride;            // words from one row to the next
    i64 rows;              // n: rows past it are zeros
};

// Head `h` of batch entry `b` of x [batch, n, heads, d] given as its words.
template <int D>
__device__ MmaHead mma_head(const float* x, i64 b, i64 h, i64 heads, i64 n) {
    MmaHead head;
    head.base = (const unsigned*)x + (b * n * heads + h) * (D / 2);
    head.stride = heads * (D / 2);
    head.rows = n;
    return head;
}

// Operand x (q, k or v) of `heads` heads at head `h` of batch entry `b`, `n` rows, as the
// shape lays it out: rows `ld` elements apart (0: dense, heads·D), its columns from `off`
// (both multiples of 8, so that rows stay whole 16-byte words).
template <int D>
__device__ MmaHead mma_operand(const float* x, i64 b, i64 h, i64 heads, i64 n, i64 ld, i64 off) {
    i64 row = ld != 0 ? ld : heads * D;
    MmaHead head;
    head.base = (const unsigned*)x + (b * n * row + off + h * D) / 2;
    head.stride = row / 2;
    head.rows = n;
    return head;
}

template <int D>
__device__ MmaHead mma_q(const float* q, const Attention& a, i64 b, i64 h) {
    return mma_operand<D>(q, b, h, a.heads, a.sq, a.ld_q, a.off_q);
}

template <int D>
__device__ MmaHead mma_k(const float* k, const Attention& a, i64 b, i64 g) {
    return mma_operand<D>(k, b, g, a.kv, a.sk, a.ld_k, a.off_k);
}

template <int D>
__device__ MmaHead mma_v(const float* v, const Attention& a, i64 b, i64 g) {
    return mma_operand<D>(v, b, g, a.kv, a.sk, a.ld_v, a.off_v);
}

// Where column `c` of row `row` of head `h` of a gradient lies: dense ([batch, n, heads, D]),
// or (a.grads_packed) in its operand's layout (rows `ld` apart from column `off`).
template <int D>
__device__ i64 mma_grad_at(const Attention& a, i64 b, i64 n, i64 row, i64 heads, i64 h, i64 ld, i64 off, i64 c) {
    if (!a.grads_packed) return ((b * n + row) * heads + h) * D + c;
    return (b * n + row) * ld + off + h * D + c;
}

// d += a · b on the tensor cores (one warp, 16×8×16, bf16 operands, f32 accumulators).
__device__ __forceinline__ void mma_bf16(float* d, const unsigned* a, unsigned b0, unsigned b1) {
#if MMA_PTX
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(__CUDACC_RTC__)
    __trap();
#else
    ::simt::mma_m16n8k16_bf16(d, a, b0, b1);
#endif
}

// Four 8×8 bf16 matrices from shared memory in fragment order (ldmatrix; simt.hpp states its
// layout): lane l names row l % 8 of matrix l / 8; with TRANS each is loaded transposed.
template <bool TRANS>
__device__ __forceinline__ void mma_ldm_x4(unsigned* r, const unsigned* row) {
#if MMA_PTX
    unsigned at = (unsigned)__cvta_generic_to_shared(row);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(at));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(at));
#elif defined(__CUDACC_RTC__)
    __trap();
#else
    ::simt::ldmatrix_x4(r, row, TRANS);
#endif
}

// The maximum and the sum over the four lanes that hold one accumulator row.
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The lane's place in its warp's fragments.
struct MmaLane {
    int warp, lane, group, t;
};

__device__ MmaLane mma_lane() {
    MmaLane l;
    l.warp = threadIdx.x / 32;
    l.lane = threadIdx.x % 32;
    l.group = (threadIdx.x % 32) / 4;
    l.t = threadIdx.x % 4;
    return l;
}

// The A fragments of 16 rows `r0 ..` of head `x` (zeros past its rows): a0, a2 from the
// lane's row `group`, a1, a3 from row `group + 8`.
template <int D>
__device__ void mma_load_a(unsigned (*frag)[4], const MmaHead& x, i64 r0, const MmaLane& l) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        i64 r = r0 + l.group + 8 * half;
        const unsigned* row = x.base + r * x.stride;
        bool in = r < x.rows;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            frag[kk][half] = in ? row[kk * 8 + l.t] : 0u;
            frag[kk][half + 2] = in ? row[kk * 8 + 4 + l.t] : 0u;
        }
    }
}

// Copies into shared memory that run while the block computes (cp.async, sm_80 on): a tile is
// fetched into one of two buffers while the other is multiplied, FlashAttention-2's pipeline.
// A thread's copies land by its `mma_copies_land`; a barrier after it shows them to the block.
// The emulator lands each at once or only at that wait (simt.hpp), so a tile read too early or
// overwritten while read shows there; GPUs that never run these kernels copy plainly.
__device__ __forceinline__ void mma_copy16(unsigned* dst, const unsigned* src, bool in) {
#if MMA_PTX
    unsigned at = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(src), "r"(in ? 16 : 0));
#elif defined(__CUDACC_RTC__)
    *(uint4*)dst = in ? *(const uint4*)src : make_uint4(0u, 0u, 0u, 0u);
#else
    ::simt::async_copy(dst, src, 16, in ? 16 : 0);
#endif
}

// One float, or zero where `in` is false (then `src` is not read).
__device__ __forceinline__ void mma_copy4(float* dst, const float* src, bool in) {
#if MMA_PTX
    unsigned at = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(at), "l"(src), "r"(in ? 4 : 0));
#elif defined(__CUDACC_RTC__)
    *dst = in ? *src : 0.0f;
#else
    ::simt::async_copy(dst, src, 4, in ? 4 : 0);
#endif
}

__device__ __forceinline__ void mma_copies_land() {
#if MMA_PTX
    asm volatile("cp.async.wait_all;\n" ::);
#elif !defined(__CUDACC_RTC__)
    ::simt::async_wait();
#endif
}

// Rows `r0 .. r0 + rows` of head `x` into a row-major tile (MMA_ROW_WORDS(D) words a row),
// 16 bytes at a time, asynchronously (`mma_copy16`; zeros past the head's rows).
template <int D>
__device__ void mma_tile_rows(unsigned* tile, const MmaHead& x, i64 r0, int rows) {
    for (int e = threadIdx.x; e < rows * (D / 8); e += blockDim.x) {
        int r = e / (D / 8), w = e % (D / 8);
        bool in = r0 + r < x.rows;
        // A row past the head copies nothing (src-size 0): any address in the tensor serves.
        const unsigned* src = x.base + (in ? (r0 + r) * x.stride : 0) + 4 * w;
        mma_copy16(tile + r * MMA_ROW_WORDS(D) + 4 * w, src, in);
    }
}

// The key tile from key `k0`, K and V (`rows` rows each), into buffer `buf` (of `words` words)
// of `ks` and `vs`, asynchronously.
template <int D>
__device__ void mma_kv_tile(unsigned* ks, unsigned* vs, int buf, int words, const MmaHead& k, const MmaHead& v,
                            i64 k0, int rows) {
    mma_tile_rows<D>(ks + buf * words, k, k0, rows);
    mma_tile_rows<D>(vs + buf * words, v, k0, rows);
}

// acc[nt] += A · B over D columns, for `NT` n-tiles of 8 rows of a row-major tile (B[k][n] =
// tile[n][k]): one ldmatrix holds the B fragments of two k-steps.
template <int D, int NT>
__device__ void mma_rows(float (*acc)[4], const unsigned (*a)[4], const unsigned* tile, const MmaLane& l) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int kk = 0; kk < D / 16; kk += 2) {
            unsigned b[4];
            mma_ldm_x4<false>(b, tile + (nt * 8 + l.lane % 8) * MMA_ROW_WORDS(D) + kk * 8 + (l.lane / 8) * 4);
            mma_bf16(acc[nt], a[kk], b[0], b[1]);
            mma_bf16(acc[nt], a[kk + 1], b[2], b[3]);
        }
}

// acc[dt] += P · X, P the accumulators `p` (16 × 8·NT, packed to bf16 as A fragments) and X
// the row-major tile of 8·NT rows and D columns, read transposed (B[k][n] = tile[k][n]): one
// ldmatrix.trans holds the B fragments of two d-tiles.
template <int D, int NT>
__device__ void mma_cols(float (*acc)[4], float (*p)[4], const unsigned* tile, const MmaLane& l) {
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
        unsigned a[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                         pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
        const unsigned* rows = tile + (kk * 16 + ((l.lane / 8) % 2) * 8 + l.lane % 8) * MMA_ROW_WORDS(D);
#pragma unroll
        for (int dt = 0; dt < D / 8; dt += 2) {
            unsigned b[4];
            mma_ldm_x4<true>(b, rows + (dt + l.lane / 16) * 4);
            mma_bf16(acc[dt], a, b[0], b[1]);
            mma_bf16(acc[dt + 1], a, b[2], b[3]);
        }
    }
}

// The softmax in base 2: exp2f is one instruction on the GPU (MUFU.EX2), expf several, and
// the inner loops are bound by their instructions per score, not by the tensor cores. Scores
// are kept as log₂e · score, and so is the lse the row statistics pass to dq and dk, dv (only
// these kernels read it).
#define MMA_LOG2E 1.4426950408889634f

// attention.cu's `attn_score` constants, in log₂ units.
struct MmaScore {
    float scale2;     // scale · log₂e
    float over_cap;   // scale / cap (0: no soft cap)
    float cap2;       // cap · log₂e
    // What the exponents multiply a raw product by: scale · log₂e where the score is that
    // product scaled by a positive number (no soft cap), whose row maximum is then the raw
    // maximum scaled, so one FFMA per score scales it and subtracts the maximum; 1 where
    // `mma_scores2` computed the scores first.
    float fold;
};

__device__ MmaScore mma_score_of(const Attention& a) {
    MmaScore c;
    c.scale2 = (float)(a.scale * 1.4426950408889634);
    c.over_cap = a.softcap > 0.0 ? (float)(a.scale / a.softcap) : 0.0f;
    c.cap2 = (float)(a.softcap * 1.4426950408889634);
    c.fold = c.over_cap == 0.0f && c.scale2 > 0.0f ? c.scale2 : 1.0f;
    return c;
}

// log₂e · the scores of a lane's products over NT n-tiles: scale · s, soft-capped
// (cap · tanh(scale · s / cap)); the soft cap is tested once per tile rather than per score.
// Where the exponents fold the scale in (`MmaScore::fold`), the products stay as they are.
template <int NT>
__device__ __forceinline__ void mma_scores2(float (*s)[4], const MmaScore& c) {
    if (c.fold != 1.0f) return;
    if (c.over_cap > 0.0f) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = c.cap2 * tanhf(s[nt][e] * c.over_cap);
    } else {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] *= c.scale2;
    }
}

// dS = P (dP − D) through the soft cap (attention.cu's `attn_score_grad`): tanh' = 1 − tanh²,
// tanh being x2 / cap2 for the score x2 of `mma_scores2`.
__device__ __forceinline__ float mma_score_grad(const MmaScore& c, float x2, float p, float dp, float dsum) {
    float ds = p * (dp - dsum);
    if (c.over_cap > 0.0f) {
        float t = x2 / c.cap2;
        ds *= 1.0f - t * t;
    }
    return ds;
}

// How many of the `width` columns from `c0` on are below `limit`, as the 32-bit count the
// inner loops compare with (a column c is seen when c < the count).
__device__ __forceinline__ int mma_below(i64 limit, i64 c0, int width) {
    i64 n = limit - c0;
    return n < 0 ? 0 : (n > width ? width : (int)n);
}

// One block's 64 queries (batch `b`, head `h`, first query `q0`).
struct MmaQueries {
    i64 b, h, g, q0;
};

// Block t's queries: the last query tiles of every (batch, head) first, the first ones last.
// Under the causal mask a tile late in the sequence sees the most keys, so the longest blocks
// start in the first wave and the short ones fill the tail (longest-first scheduling).
__device__ MmaQueries mma_queries(const Attention& a, i64 t) {
    i64 tiles = (a.sq + MMA_BLOCK_ROWS - 1) / MMA_BLOCK_ROWS, heads = a.batch * a.heads;
    MmaQueries x;
    x.q0 = (tiles - 1 - t / heads) * MMA_BLOCK_ROWS;
    x.h = (t % heads) % a.heads;
    x.b = (t % heads) / a.heads;
    x.g = x.h / (a.heads / a.kv);
    return x;
}

__device__ i64 mma_query_blocks(const Attention& a) {
    return a.batch * a.heads * ((a.sq + MMA_BLOCK_ROWS - 1) / MMA_BLOCK_ROWS);
}

// Keys any query of the block sees.
__device__ i64 mma_block_keys(const Attention& a, const float* qpos, i64 q0) {
    i64 last = (q0 + MMA_BLOCK_ROWS < a.sq ? q0 + MMA_BLOCK_ROWS : a.sq) - 1;
    return attn_visible(a, qpos, last);
}

// Keys query `qi` sees (none past the sequence).
__device__ i64 mma_visible(const Attention& a, const float* qpos, i64 qi) {
    return qi < a.sq ? attn_visible(a, qpos, qi) : 0;
}

// The forward over one block's queries: the output (f32, or with WORDS its bf16 words, two to
// a word in order, where every reader of it reads only those) and, where `lse` is given, each
// row's log-sum-exp, kept for the backward as FlashAttention-2 keeps it (STATS false); or the
// backward's row statistics lse and D = dO·O recomputed (STATS true: the forward kept none).
template <int D, bool STATS, bool WORDS = false>
__device__ void mma_forward(float* o, float* lse, float* dsum, const float* qp, const float* kp, const float* vp,
                            const float* go, const float* qpos, const Attention& a, unsigned* ks, unsigned* vs) {
    MmaLane l = mma_lane();
    MmaScore sc = mma_score_of(a);
    const int TILE = MMA_FWD_TILE(D);
    for (i64 t = blockIdx.x; t < mma_query_blocks(a); t += gridDim.x) {
        MmaQueries x = mma_queries(a, t);
        i64 w0 = x.q0 + l.warp * MMA_WARP_ROWS;
        i64 rows[2] = {w0 + l.group, w0 + l.group + 8};
        i64 vis[2] = {mma_visible(a, qpos, rows[0]), mma_visible(a, qpos, rows[1])};
        unsigned qa[D / 16][4];
        mma_load_a<D>(qa, mma_q<D>(qp, a, x.b, x.h), w0, l);
        float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};
        float acc[D / 8][4];
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[dt][e] = 0.0f;
        i64 keys = mma_block_keys(a, qpos, x.q0), k_first = attn_first_tile(a, qpos, x.q0, TILE);
        i64 lo[2] = {mask_first(a, vis[0]), mask_first(a, vis[1])};
        MmaHead kh = mma_k<D>(kp, a, x.b, x.g), vh = mma_v<D>(vp, a, x.b, x.g);
        const int words = TILE * MMA_ROW_WORDS(D);  // one buffer
        __syncthreads();  // the last block's readers are done with both buffers
        if (k_first < keys) mma_kv_tile<D>(ks, vs, (int)(k_first / TILE) % 2, words, kh, vh, k_first, TILE);
        for (i64 k0 = k_first; k0 < keys; k0 += TILE) {
            int now = (int)(k0 / TILE) % 2;
            mma_copies_land();
            __syncthreads();  // this tile is in, and the other buffer's readers are done
            if (k0 + TILE < keys) mma_kv_tile<D>(ks, vs, 1 - now, words, kh, vh, k0 + TILE, TILE);
            const unsigned *kt = ks + now * words, *vt = vs + now * words;
            float s[TILE / 8][4];
#pragma unroll
            for (int nt = 0; nt < TILE / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
            mma_rows<D, TILE / 8>(s, qa, kt, l);
            mma_scores2<TILE / 8>(s, sc);
            // Columns from k0 each of the lane's two rows sees (all but on the diagonal, and
            // in a sliding window none before it).
            int seen[2] = {mma_below(vis[0], k0, TILE), mma_below(vis[1], k0, TILE)};
            int from[2] = {mma_below(lo[0], k0, TILE), mma_below(lo[1], k0, TILE)};
            float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nt = 0; nt < TILE / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int c = nt * 8 + 2 * l.t + e % 2;
                    s[nt][e] = c >= from[e / 2] && c < seen[e / 2] ? s[nt][e] : -INFINITY;
                    tile_max[e / 2] = fmaxf(tile_max[e / 2], s[nt][e]);
                }
            // A row that has seen no key yet keeps max −∞ and subtracts 0: its exponents stay
            // exp2(−∞) = 0, never exp2(−∞ + ∞).
            float corr[2], base[2], tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float m_new = fmaxf(m[r], quad_max(tile_max[r]) * sc.fold);
                base[r] = m_new == -INFINITY ? 0.0f : m_new;
                corr[r] = exp2f(m[r] - base[r]);
                m[r] = m_new;
            }
#pragma unroll
            for (int nt = 0; nt < TILE / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[nt][e] = exp2f(fmaf(s[nt][e], sc.fold, -base[e / 2]));
                    tile_sum[e / 2] += s[nt][e];
                }
#pragma unroll
            for (int r = 0; r < 2; ++r) sum[r] = sum[r] * corr[r] + tile_sum[r];
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[dt][e] *= corr[e / 2];
            mma_cols<D, TILE / 8>(acc, s, vt, l);
        }
        float dpart[2] = {0.0f, 0.0f}, inv[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            sum[r] = quad_sum(sum[r]);
            inv[r] = sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f;
        }
        // The lse before the output, so that m is dead through its loop (written after it,
        // the 64-wide forward spilled at its three-blocks register bound).
        if (lse) {
#pragma unroll
            for (int r = 0; r < 2; ++r)
                if (l.t == 0 && rows[r] < a.sq)
                    lse[(x.b * a.heads + x.h) * a.sq + rows[r]] = sum[r] > 0.0f ? m[r] + log2f(sum[r]) : -INFINITY;
        }
        // Each lane holds two adjacent columns of each of its rows: one bf16 word of O.
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                if (rows[r] >= a.sq) continue;
                float y0 = acc[dt][2 * r] * inv[r], y1 = acc[dt][2 * r + 1] * inv[r];
                i64 at = ((x.b * a.sq + rows[r]) * a.heads + x.h) * D + dt * 8 + 2 * l.t;
                if (STATS) {
                    dpart[r] += go[at] * y0;
                    dpart[r] += go[at + 1] * y1;
                } else if (WORDS) {
                    ((unsigned*)o)[at / 2] = pack_bf16(y0, y1);
                } else {
                    o[at] = y0;
                    o[at + 1] = y1;
                }
            }
        if (STATS) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float d = quad_sum(dpart[r]);
                if (l.t == 0 && rows[r] < a.sq) dsum[(x.b * a.heads + x.h) * a.sq + rows[r]] = d;
            }
        }
    }
}

// The backward's shared tiles, two buffers of each (`mma_copy16`), declared in each kernel at
// its own head width `d` (a template's own `__shared__` arrays would be allocated once per
// width it is instantiated at).
struct MmaBackwardTiles {
    unsigned *rows, *rows2;
    float *lse, *d;
};

#define MMA_BACKWARD_TILES(d)                                                   \
    __shared__ __align__(16) unsigned rows[2 * MMA_BWD_TILE * MMA_ROW_WORDS(d)];  \
    __shared__ __align__(16) unsigned rows2[2 * MMA_BWD_TILE * MMA_ROW_WORDS(d)]; \
    __shared__ float tile_lse[2 * MMA_BWD_TILE], tile_d[2 * MMA_BWD_TILE];        \
    MmaBackwardTiles w = {rows, rows2, tile_lse, tile_d};

#define MMA_FORWARD_TILES(d)                                                   \
    __shared__ __align__(16) unsigned ks[2 * MMA_FWD_TILE(d) * MMA_ROW_WORDS(d)]; \
    __shared__ __align__(16) unsigned vs[2 * MMA_FWD_TILE(d) * MMA_ROW_WORDS(d)];

// One lane's two adjacent columns `at`, `at + 1` of a gradient: f32, or with WORDS one bf16
// word of them (two to a word, in order; `at` even), where every reader reads only those.
template <bool WORDS>
__device__ __forceinline__ void mma_store_pair(float* out, i64 at, float y0, float y1) {
    if (WORDS) {
        ((unsigned*)out)[at / 2] = pack_bf16(y0, y1);
    } else {
        out[at] = y0;
        out[at + 1] = y1;
    }
}

// dq over one block's queries: dq = scale · Σ_j dS_j k_j, key tiles of MMA_BWD_TILE (with
// WORDS written as its bf16 words, `mma_store_pair`).
template <int D, bool WORDS = false>
__device__ void mma_backward_dq(float* dq, const float* qp, const float* kp, const float* vp,
                                const float* gp, const float* lse, const float* dsum, const float* qpos,
                                const Attention& a, const MmaBackwardTiles& w) {
    unsigned *ks = w.rows, *vs = w.rows2;
    MmaLane l = mma_lane();
    MmaScore sc = mma_score_of(a);
    for (i64 t = blockIdx.x; t < mma_query_blocks(a); t += gridDim.x) {
        MmaQueries x = mma_queries(a, t);
        i64 w0 = x.q0 + l.warp * MMA_WARP_ROWS;
        i64 rows[2] = {w0 + l.group, w0 + l.group + 8};
        i64 vis[2] = {mma_visible(a, qpos, rows[0]), mma_visible(a, qpos, rows[1])};
        float row_lse[2], row_d[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            i64 at = (x.b * a.heads + x.h) * a.sq + rows[r];
            row_lse[r] = rows[r] < a.sq ? lse[at] : 0.0f;
            row_d[r] = rows[r] < a.sq ? dsum[at] : 0.0f;
        }
        unsigned qa[D / 16][4], ga[D / 16][4];
        mma_load_a<D>(qa, mma_q<D>(qp, a, x.b, x.h), w0, l);
        mma_load_a<D>(ga, mma_head<D>(gp, x.b, x.h, a.heads, a.sq), w0, l);
        float acc[D / 8][4];
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[dt][e] = 0.0f;
        i64 keys = mma_block_keys(a, qpos, x.q0), k_first = attn_first_tile(a, qpos, x.q0, MMA_BWD_TILE);
        i64 lo[2] = {mask_first(a, vis[0]), mask_first(a, vis[1])};
        MmaHead kh = mma_k<D>(kp, a, x.b, x.g), vh = mma_v<D>(vp, a, x.b, x.g);
        const int words = MMA_BWD_TILE * MMA_ROW_WORDS(D);  // one buffer
        __syncthreads();  // the last block's readers are done with both buffers
        if (k_first < keys)
            mma_kv_tile<D>(ks, vs, (int)(k_first / MMA_BWD_TILE) % 2, words, kh, vh, k_first, MMA_BWD_TILE);
        for (i64 k0 = k_first; k0 < keys; k0 += MMA_BWD_TILE) {
            int now = (int)(k0 / MMA_BWD_TILE) % 2;
            mma_copies_land();
            __syncthreads();  // this tile is in, and the other buffer's readers are done
            if (k0 + MMA_BWD_TILE < keys)
                mma_kv_tile<D>(ks, vs, 1 - now, words, kh, vh, k0 + MMA_BWD_TILE, MMA_BWD_TILE);
            const unsigned *kt = ks + now * words, *vt = vs + now * words;
            float s[MMA_BWD_TILE / 8][4], dp[MMA_BWD_TILE / 8][4];
#pragma unroll
            for (int nt = 0; nt < MMA_BWD_TILE / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.0f;
            mma_rows<D, MMA_BWD_TILE / 8>(s, qa, kt, l);
            mma_rows<D, MMA_BWD_TILE / 8>(dp, ga, vt, l);
            mma_scores2<MMA_BWD_TILE / 8>(s, sc);
            int seen[2] = {mma_below(vis[0], k0, MMA_BWD_TILE), mma_below(vis[1], k0, MMA_BWD_TILE)};
            int from[2] = {mma_below(lo[0], k0, MMA_BWD_TILE), mma_below(lo[1], k0, MMA_BWD_TILE)};
#pragma unroll
            for (int nt = 0; nt < MMA_BWD_TILE / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int c = nt * 8 + 2 * l.t + e % 2, r = e / 2;
                    float x2 = s[nt][e];
                    float ds = mma_score_grad(sc, x2, exp2f(fmaf(x2, sc.fold, -row_lse[r])), dp[nt][e], row_d[r]);
                    s[nt][e] = c >= from[r] && c < seen[r] ? ds : 0.0f;
                }
            mma_cols<D, MMA_BWD_TILE / 8>(acc, s, kt, l);
        }
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                i64 row = rows[r];
                if (row < a.sq)
                    mma_store_pair<WORDS>(dq, mma_grad_at<D>(a, x.b, a.sq, row, a.heads, x.h, a.ld_q, a.off_q, dt * 8 + 2 * l.t),
                                          (float)a.scale * acc[dt][2 * r], (float)a.scale * acc[dt][2 * r + 1]);
            }
    }
}

// Query tile `i0` of head `h` of batch entry `b` into buffer `buf` of the backward's tiles: q and dO rows, and
// the rows' lse (log₂ units) and D (zero past the sequence), all asynchronously.
template <int D>
__device__ void mma_query_tile(const MmaBackwardTiles& w, int buf, const float* qp, const float* gp,
                               const float* lse, const float* dsum, i64 b, i64 h, i64 i0, const Attention& a) {
    const int words = MMA_DKV_TILE(D) * MMA_ROW_WORDS(D);
    i64 bh = b * a.heads + h, sq = a.sq;
    mma_tile_rows<D>(w.rows + buf * words, mma_q<D>(qp, a, b, h), i0, MMA_DKV_TILE(D));
    mma_tile_rows<D>(w.rows2 + buf * words, mma_head<D>(gp, b, h, a.heads, sq), i0, MMA_DKV_TILE(D));
    for (int i = threadIdx.x; i < MMA_DKV_TILE(D); i += blockDim.x) {
        bool in = i0 + i < sq;
        i64 at = in ? bh * sq + i0 + i : 0;
        mma_copy4(w.lse + buf * MMA_DKV_TILE(D) + i, lse + at, in);
        mma_copy4(w.d + buf * MMA_DKV_TILE(D) + i, dsum + at, in);
    }
}

// dk and dv over one block's 64 keys (batch, kv head): Σ over the group's query heads and the
// query tiles that see the keys of scale·dS q and P dO (with WORDS as their bf16 words).
template <int D, bool WORDS = false>
__device__ void mma_backward_dkv(float* dk, float* dv, const float* qp, const float* kp,
                                 const float* vp, const float* gp, const float* lse,
                                 const float* dsum, const float* qpos, const Attention& a,
                                 const MmaBackwardTiles& w) {
    MmaLane l = mma_lane();
    MmaScore sc = mma_score_of(a);
    i64 key_blocks = (a.sk + MMA_BLOCK_ROWS - 1) / MMA_BLOCK_ROWS;
    i64 group = a.heads / a.kv;
    for (i64 t = blockIdx.x; t < a.batch * a.kv * key_blocks; t += gridDim.x) {
        i64 k0 = (t % key_blocks) * MMA_BLOCK_ROWS, g = (t / key_blocks) % a.kv, b = t / (key_blocks * a.kv);
        i64 w0 = k0 + l.warp * MMA_WARP_ROWS;
        i64 keys[2] = {w0 + l.group, w0 + l.group + 8};
        unsigned ka[D / 16][4], va[D / 16][4];
        mma_load_a<D>(ka, mma_k<D>(kp, a, b, g), w0, l);
        mma_load_a<D>(va, mma_v<D>(vp, a, b, g), w0, l);
        float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) dka[dt][e] = dva[dt][e] = 0.0f;
        // The first query that sees key k0 (all of them without the mask; with positions the
        // mask alone says).
        i64 first = a.causal && !qpos ? k0 - (a.sk - a.sq) : 0;
        if (first < 0) first = 0;
        first -= first % MMA_DKV_TILE(D);  // whole tiles
        // One past the last query that sees the block's last key (with positions, every query).
        i64 end = qpos ? a.sq : window_last_query(a, k0 + MMA_BLOCK_ROWS - 1);
        // The group's query heads' tiles in turn, each fetched while the one before is used.
        const int words = MMA_DKV_TILE(D) * MMA_ROW_WORDS(D);  // one buffer
        i64 h = g * group, i0 = first;
        bool any = first < end;
        __syncthreads();  // the last block's readers are done with both buffers
        if (any) mma_query_tile<D>(w, 0, qp, gp, lse, dsum, b, h, i0, a);
        for (int it = 0; any && h < (g + 1) * group; ++it) {
            i64 nh = h, ni0 = i0 + MMA_DKV_TILE(D);
            if (ni0 >= end) {
                ++nh;
                ni0 = first;
            }
            int now = it % 2;
            mma_copies_land();
            __syncthreads();  // this tile is in, and the other buffer's readers are done
            if (nh < (g + 1) * group) mma_query_tile<D>(w, 1 - now, qp, gp, lse, dsum, b, nh, ni0, a);
            const unsigned *qs = w.rows + now * words, *gs = w.rows2 + now * words;
            const float *tl = w.lse + now * MMA_DKV_TILE(D), *td = w.d + now * MMA_DKV_TILE(D);
            // Sᵀ and dPᵀ: rows the warp's keys, columns the tile's queries.
            float s[MMA_DKV_TILE(D) / 8][4], dp[MMA_DKV_TILE(D) / 8][4];
#pragma unroll
            for (int nt = 0; nt < MMA_DKV_TILE(D) / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.0f;
            mma_rows<D, MMA_DKV_TILE(D) / 8>(s, ka, qs, l);
            mma_rows<D, MMA_DKV_TILE(D) / 8>(dp, va, gs, l);
            // The tile's columns each of the lane's two keys is seen by: from the first
            // query whose causal window reaches the key to the last query (or, with the
            // queries' positions, as each position says).
            mma_scores2<MMA_DKV_TILE(D) / 8>(s, sc);
            int hi[2], lo[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                lo[r] = keys[r] >= a.sk ? MMA_DKV_TILE(D)
                                        : (a.causal ? mma_below(keys[r] - (a.sk - a.sq), i0, MMA_DKV_TILE(D)) : 0);
                hi[r] = mma_below(window_last_query(a, keys[r]), i0, MMA_DKV_TILE(D));
            }
#pragma unroll
            for (int nt = 0; nt < MMA_DKV_TILE(D) / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int c = nt * 8 + 2 * l.t + e % 2, r = e / 2;
                    bool seen = qpos ? keys[r] < a.sk && attn_sees(a, qpos, i0 + c, keys[r])
                                     : c >= lo[r] && c < hi[r];
                    float x2 = s[nt][e];
                    float p = seen ? exp2f(fmaf(x2, sc.fold, -tl[c])) : 0.0f;
                    s[nt][e] = p;
                    dp[nt][e] = seen ? mma_score_grad(sc, x2, p, dp[nt][e], td[c]) : 0.0f;
                }
            mma_cols<D, MMA_DKV_TILE(D) / 8>(dva, s, gs, l);
            mma_cols<D, MMA_DKV_TILE(D) / 8>(dka, dp, qs, l);
            h = nh;
            i0 = ni0;
        }
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                i64 j = keys[r];
                if (j >= a.sk) continue;
                i64 c = dt * 8 + 2 * l.t;
                i64 at_k = mma_grad_at<D>(a, b, a.sk, j, a.kv, g, a.ld_k, a.off_k, c);
                i64 at_v = mma_grad_at<D>(a, b, a.sk, j, a.kv, g, a.ld_v, a.off_v, c);
                mma_store_pair<WORDS>(dk, at_k, (float)a.scale * dka[dt][2 * r], (float)a.scale * dka[dt][2 * r + 1]);
                mma_store_pair<WORDS>(dv ? dv : dk, at_v, dva[dt][2 * r], dva[dt][2 * r + 1]);
            }
    }
}


// The kernels, one per head width (a kernel's registers are its widest path's, so one kernel
// for all widths would run every width at the 128-wide head's occupancy): MMA_KERNELS in
// ops/attention.rs.
#define MMA_BODY(...) __VA_ARGS__
#define MMA_FORWARD(D) MMA_BODY({ MMA_FORWARD_TILES(D) mma_forward<D, false>(o, lse, 0, qp, kp, vp, 0, qpos, a, ks, vs); })
#define MMA_FORWARD_WORDS(D) \
    MMA_BODY({ MMA_FORWARD_TILES(D) mma_forward<D, false, true>(o, lse, 0, qp, kp, vp, 0, qpos, a, ks, vs); })
#define MMA_STATS(D) MMA_BODY({ MMA_FORWARD_TILES(D) mma_forward<D, true>(0, lse, dsum, qp, kp, vp, go, qpos, a, ks, vs); })
#define MMA_DQ(D) MMA_BODY({ MMA_BACKWARD_TILES(D) mma_backward_dq<D>(dq, qp, kp, vp, gp, lse, dsum, qpos, a, w); })
#define MMA_DKV(D) \
    MMA_BODY({ MMA_BACKWARD_TILES(D) mma_backward_dkv<D>(dk, dv, qp, kp, vp, gp, lse, dsum, qpos, a, w); })
#define MMA_DQ_WORDS(D) \
    MMA_BODY({ MMA_BACKWARD_TILES(D) mma_backward_dq<D, true>(dq, qp, kp, vp, gp, lse, dsum, qpos, a, w); })
#define MMA_DKV_WORDS(D) \
    MMA_BODY({ MMA_BACKWARD_TILES(D) mma_backward_dkv<D, true>(dk, dv, qp, kp, vp, gp, lse, dsum, qpos, a, w); })
// Arguments: the outputs (f32; the forward's lse may be null: not kept), then the operands
// as their bf16 words in their own layout (`MmaHead`: qp, kp, vp, gp), dO in f32 where the
// row statistics read it, lse and D, the queries' positions (null: none) and the shape.
#define MMA_FORWARD_ARGS \
    float *o, float *lse, const float *qp, const float *kp, const float *vp, const float *qpos, Attention a
#define MMA_STATS_ARGS                                                                                     \
    float *lse, float *dsum, const float *qp, const float *kp, const float *vp, const float *go, const float *qpos, \
        Attention a
#define MMA_DQ_ARGS                                                                                        \
    float *dq, const float *qp, const float *kp, const float *vp, const float *gp,                          \
        const float *lse, const float *dsum, const float *qpos, Attention a
#define MMA_DKV_ARGS                                                                                       \
    float *dk, float *dv, const float *qp, const float *kp, const float *vp, const float *gp,              \
        const float *lse, const float *dsum, const float *qpos, Attention a

// Three blocks of the query-side kernels per SM at heads up to 64 wide (GPT-2's, Llama's 128
// take two): at most 170 registers a thread, which ptxas meets without spilling; left alone it
// spends up to 181 on hoisted tile loads and fits two.
#define MMA_THREE_BLOCKS __launch_bounds__(MMA_THREADS, 3)

extern "C" __global__ void attention_forward_mma32(MMA_FORWARD_ARGS) { MMA_FORWARD(32) }
extern "C" __global__ void MMA_THREE_BLOCKS attention_forward_mma64(MMA_FORWARD_ARGS) { MMA_FORWARD(64) }
extern "C" __global__ void attention_forward_mma128(MMA_FORWARD_ARGS) { MMA_FORWARD(128) }
extern "C" __global__ void attention_forward_words_mma32(MMA_FORWARD_ARGS) { MMA_FORWARD_WORDS(32) }
extern "C" __global__ void MMA_THREE_BLOCKS attention_forward_words_mma64(MMA_FORWARD_ARGS) { MMA_FORWARD_WORDS(64) }
extern "C" __global__ void attention_forward_words_mma128(MMA_FORWARD_ARGS) { MMA_FORWARD_WORDS(128) }
extern "C" __global__ void attention_row_stats_mma32(MMA_STATS_ARGS) { MMA_STATS(32) }
extern "C" __global__ void MMA_THREE_BLOCKS attention_row_stats_mma64(MMA_STATS_ARGS) { MMA_STATS(64) }
extern "C" __global__ void attention_row_stats_mma128(MMA_STATS_ARGS) { MMA_STATS(128) }
extern "C" __global__ void attention_backward_dq_mma32(MMA_DQ_ARGS) { MMA_DQ(32) }
extern "C" __global__ void MMA_THREE_BLOCKS attention_backward_dq_mma64(MMA_DQ_ARGS) { MMA_DQ(64) }
extern "C" __global__ void attention_backward_dq_mma128(MMA_DQ_ARGS) { MMA_DQ(128) }
extern "C" __global__ void attention_backward_dkv_mma32(MMA_DKV_ARGS) { MMA_DKV(32) }
extern "C" __global__ void attention_backward_dkv_mma64(MMA_DKV_ARGS) { MMA_DKV(64) }
extern "C" __global__ void attention_backward_dkv_mma128(MMA_DKV_ARGS) { MMA_DKV(128) }
extern "C" __global__ void attention_backward_dq_words_mma32(MMA_DQ_ARGS) { MMA_DQ_WORDS(32) }
extern "C" __global__ void MMA_THREE_BLOCKS attention_backward_dq_words_mma64(MMA_DQ_ARGS) { MMA_DQ_WORDS(64) }
extern "C" __global__ void attention_backward_dq_words_mma128(MMA_DQ_ARGS) { MMA_DQ_WORDS(128) }
extern "C" __global__ void attention_backward_dkv_words_mma32(MMA_DKV_ARGS) { MMA_DKV_WORDS(32) }
extern "C" __global__ void attention_backward_dkv_words_mma64(MMA_DKV_ARGS) { MMA_DKV_WORDS(64) }
extern "C" __global__ void attention_backward_dkv_words_mma128(MMA_DKV_ARGS) { MMA_DKV_WORDS(128) }

// D = dO·O of each query row, FlashAttention-2's first backward pass where the forward kept the
// rows' lse (no recomputed forward): dsum[(b·heads + h)·sq + i] from dO and O at [b, i, h·d],
// each f32 or its bf16 words (`_bf16g`: dO, `_bf16x`: O, `_bf16xg`: both; two to a word, in
// order). Eight lanes a row, four rows a warp: lane l of a row reads columns l, l + 8, …, so
// that the eight read contiguous bytes together, and the row's sum is three shuffles. The
// grid has eight threads a row, in whole warps.
template <class G, class O>
__device__ void attention_dsum_of(float* dsum, G go, O o, i64 batch, i64 sq, i64 heads, i64 d) {
    i64 rows = batch * sq * heads;
    int lane = threadIdx.x % 8;
    for (i64 w = global_thread() / 32; 4 * w < rows; w += grid_threads() / 32) {
        i64 r = 4 * w + (threadIdx.x % 32) / 8;
        float acc = 0.0f;
        if (r < rows)
            for (i64 c = lane; c < d; c += 8) acc = fmaf(go[r * d + c], o[r * d + c], acc);
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        acc += __shfl_xor_sync(0xffffffffu, acc, 4);
        i64 h = r % heads, bi = r / heads;
        if (r < rows && lane == 0) dsum[(bi / sq * heads + h) * sq + bi % sq] = acc;
    }
}

extern "C" __global__ void attention_dsum(float* dsum, const float* go, const float* o, i64 batch, i64 sq, i64 heads,
                                          i64 d) {
    attention_dsum_of(dsum, XF32{go}, XF32{o}, batch, sq, heads, d);
}

extern "C" __global__ void attention_dsum_bf16x(float* dsum, const float* go, const float* o, i64 batch, i64 sq,
                                                i64 heads, i64 d) {
    attention_dsum_of(dsum, XF32{go}, XBf16{(const unsigned*)o}, batch, sq, heads, d);
}

extern "C" __global__ void attention_dsum_bf16g(float* dsum, const float* go, const float* o, i64 batch, i64 sq,
                                                i64 heads, i64 d) {
    attention_dsum_of(dsum, XBf16{(const unsigned*)go}, XF32{o}, batch, sq, heads, d);
}

extern "C" __global__ void attention_dsum_bf16xg(float* dsum, const float* go, const float* o, i64 batch, i64 sq,
                                                 i64 heads, i64 d) {
    attention_dsum_of(dsum, XBf16{(const unsigned*)go}, XBf16{(const unsigned*)o}, batch, sq, heads, d);
}
