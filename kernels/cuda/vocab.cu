// Vocabulary-parallel embedding and cross-entropy on one rank's shard (kernels/src/vocab.rs,
// Megatron-LM's VocabParallelEmbedding and vocab_parallel_cross_entropy): the shard holds table
// rows (logit columns) start .. start + rows; a token outside them contributes zeros, and the
// loss combines each shard's (max, Σ exp, target logit) gathered over the group.

// The local row of token id `t` (stored as f32, truncated as the CPU kernel does), or −1.
__device__ i64 shard_row(float t, i64 start, i64 rows) {
    i64 r = (i64)t - start;
    return r >= 0 && r < rows ? r : -1;
}

// y[token, c] = table[row of token, c], 0 for a token outside the shard.
extern "C" __global__ void shard_embedding(float* y, const float* table, const float* ids, i64 tokens, i64 h,
                                           i64 rows, i64 start) {
    for (i64 i = global_thread(); i < tokens * h; i += grid_threads()) {
        i64 r = shard_row(ids[i / h], start, rows);
        y[i] = r < 0 ? 0.0f : table[r * h + i % h];
    }
}

// dtable (zeroed by the caller) += dy's rows at their tokens' shard rows (atomics: tokens
// sharing a row collide).
extern "C" __global__ void shard_embedding_grad(float* dtable, const float* ids, const float* dy, i64 tokens,
                                                i64 h, i64 rows, i64 start) {
    for (i64 i = global_thread(); i < tokens * h; i += grid_threads()) {
        i64 r = shard_row(ids[i / h], start, rows);
        if (r >= 0) atomicAdd(&dtable[r * h + i % h], dy[i]);
    }
}

// stats[r] = (max, Σ exp(z − max) in f64, target logit or 0) over the row's first `valid`
// columns of `n`; one block per row.
// Row r of the logits lies at r · pitch (≥ n: the LM head's GEMM may write its rows padded).
extern "C" __global__ void shard_loss_stats(float* stats, const float* logits, const float* targets, i64 positions,
                                            i64 n, i64 pitch, i64 start, i64 valid) {
    for (i64 r = blockIdx.x; r < positions; r += gridDim.x) {
        const float* row = logits + r * pitch;
        float m = -INFINITY;
        for (i64 j = threadIdx.x; j < valid; j += blockDim.x) m = fmaxf(m, row[j]);
        m = block_max(m);
        double s = 0.0;
        for (i64 j = threadIdx.x; j < valid; j += blockDim.x) s += exp((double)row[j] - (double)m);
        s = block_sum(s);
        if (threadIdx.x == 0) {
            i64 t = shard_row(targets[r], start, valid);
            stats[r * 3] = m;
            stats[r * 3 + 1] = (float)s;
            stats[r * 3 + 2] = t < 0 ? 0.0f : row[t];
        }
    }
}

// From the gathered [shards, positions, 3] statistics: lse[r] = log Σ_s sum_s·exp(max_s − max),
// and loss[0] the mean over positions of lse − target logit (f64); one block.
extern "C" __global__ void shard_loss_combine(float* loss, float* lse, const float* stats, i64 shards,
                                              i64 positions) {
    double total = 0.0;
    for (i64 r = threadIdx.x; r < positions; r += blockDim.x) {
        double m = -INFINITY, sum = 0.0, target = 0.0;
        for (i64 s = 0; s < shards; ++s) m = fmax(m, (double)stats[(s * positions + r) * 3]);
        for (i64 s = 0; s < shards; ++s) {
            const float* st = stats + (s * positions + r) * 3;
            if (st[1] > 0.0f) sum += (double)st[1] * exp((double)st[0] - m);
            target += st[2];
        }
        double l = m + log(sum);
        lse[r] = (float)l;
        total += l - target;
    }
    total = block_sum(total);
    if (threadIdx.x == 0) loss[0] = (float)(total / (double)positions);
}

// One column's gradient: g · (exp(z − lse) − [c is the target's column]), in f64.
__device__ __forceinline__ float shard_grad(float z, i64 c, float lse, i64 target, double g) {
    double p = exp((double)z - (double)lse);
    return (float)(g * (p - (target == c ? 1.0 : 0.0)));
}

// d logits = dloss/N · (exp(z − lse) − onehot(target)) on the first `valid` columns, 0 past them;
// the logits' rows at `pitch`, the gradient's dense.
extern "C" __global__ void shard_loss_grad(float* dlogits, const float* logits, const float* targets,
                                           const float* lse, const float* dloss, i64 positions, i64 n, i64 pitch,
                                           i64 start, i64 valid) {
    double g = (double)dloss[0] / (double)positions;
    for (i64 i = global_thread(); i < positions * n; i += grid_threads()) {
        i64 r = i / n, c = i % n;
        dlogits[i] = c < valid ? shard_grad(logits[r * pitch + c], c, lse[r], shard_row(targets[r], start, valid), g)
                               : 0.0f;
    }
}

// The same gradient written as the bf16 operand the LM head's backward GEMMs read (`to_bf16`'s
// copy of it): each value rounded to bf16, two to a word, each row `out_pitch` (even, ≥ n) wide
// with zeros past `valid`. The f32 gradient, and its conversion, are never made.
extern "C" __global__ void shard_loss_grad_words(float* dwords, const float* logits, const float* targets,
                                                 const float* lse, const float* dloss, i64 positions, i64 pitch,
                                                 i64 start, i64 valid, i64 out_pitch) {
    double g = (double)dloss[0] / (double)positions;
    unsigned* words = (unsigned*)dwords;
    i64 per_row = out_pitch / 2;
    for (i64 i = global_thread(); i < positions * per_row; i += grid_threads()) {
        i64 r = i / per_row, j = 2 * (i % per_row);
        const float* row = logits + r * pitch;
        i64 t = shard_row(targets[r], start, valid);
        float lo = j < valid ? shard_grad(row[j], j, lse[r], t, g) : 0.0f;
        float hi = j + 1 < valid ? shard_grad(row[j + 1], j + 1, lse[r], t, g) : 0.0f;
        words[i] = bf16_pair(lo, hi);
    }
}
