// Embedding lookup of ids (stored as f32) in a [V, H] table, and its gradient: the output
// gradient's rows added into a zeroed table gradient (kernels/src/embedding.rs). An id
// outside [0, V) gives a NaN row forward and adds nothing backward.

extern "C" __global__ void embedding_forward(float* y, const float* table, const float* ids, i64 n, i64 h,
                                             i64 vocab) {
    for (i64 i = global_thread(); i < n * h; i += grid_threads()) {
        i64 row = i / h, col = i % h;
        i64 id = (i64)ids[row];
        bool ok = (float)id == ids[row] && id >= 0 && id < vocab;
        y[i] = ok ? table[id * h + col] : NAN;
    }
}

// Adds g's rows into dtable (zeroed by the caller) with atomics: rows sharing an id collide.
extern "C" __global__ void embedding_backward(float* dtable, const float* ids, const float* g, i64 n, i64 h,
                                              i64 vocab) {
    for (i64 i = global_thread(); i < n * h; i += grid_threads()) {
        i64 row = i / h, col = i % h;
        i64 id = (i64)ids[row];
        if ((float)id == ids[row] && id >= 0 && id < vocab) atomicAdd(&dtable[id * h + col], g[i]);
    }
}
