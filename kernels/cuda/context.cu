// Context parallelism's places (kernels/src/context.rs, Megatron-Core's load-balanced layout):
// the sequence is cut into 2·size chunks of `half` tokens and member m holds chunks m and
// 2·size − 1 − m, its local sequence of `local` = 2·half tokens. The gathered keys are the
// members' local sequences in member order.

// The whole-sequence position of token i of member m's local sequence.
__device__ i64 cp_position(i64 m, i64 i, i64 local, i64 size) {
    i64 half = local / 2;
    return i < half ? m * half + i : (2 * size - 1 - m) * half + (i - half);
}

// The gathered row (member · local + i) that holds whole-sequence position p.
__device__ i64 cp_gathered_row(i64 p, i64 local, i64 size) {
    i64 half = local / 2, c = p / half, o = p % half;
    return c < size ? c * local + o : (2 * size - 1 - c) * local + half + o;
}

// out[i] = the position of this member's token i.
extern "C" __global__ void cp_positions(float* out, i64 local, i64 size, i64 member) {
    for (i64 i = global_thread(); i < local; i += grid_threads()) out[i] = (float)cp_position(member, i, local, size);
}

// [batch, size·local, w] rows between gathered (member) order and whole-sequence order:
// `to_whole` 1 puts gathered row j at its position, 0 takes each gathered row from its position.
extern "C" __global__ void cp_reorder(float* dst, const float* src, i64 batch, i64 local, i64 size, i64 w,
                                      int to_whole) {
    i64 s = local * size;
    for (i64 e = global_thread(); e < batch * s * w; e += grid_threads()) {
        i64 c = e % w, r = (e / w) % s, b = e / (w * s);
        i64 from = to_whole ? cp_gathered_row(r, local, size) : cp_position(r / local, r % local, local, size);
        dst[e] = src[(b * s + from) * w + c];
    }
}
