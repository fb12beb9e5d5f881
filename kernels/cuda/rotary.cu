// Rotary position embedding, Hugging Face Llama's "rotate half" (kernels/src/rotary.rs): in
// each head of width d, channel c < d/2 pairs with c + d/2 and the pair turns by pos·f_c, with
// f_c from `freq` (each frequency as two floats, hi + lo, so the angle keeps f64 precision for
// long sequences), times the YaRN factor `m` and, where `floor` > 0, Llama 4's attention
// temperature 1 + scale·ln(⌊(pos + 1)/floor⌋ + 1); `sign` −1 turns back (the gradient). A token's
// position is its index in the sequence, or `pos[index]` where given (context parallelism:
// the rank's chunks sit at their places in the whole sequence).

extern "C" __global__ void rotary(float* y, const float* x, const float* freq, const float* pos, i64 batch,
                                  i64 seq, i64 heads, i64 d, double m, double floor_scale, double attn_scale,
                                  double sign) {
    i64 half = d / 2;
    i64 n = batch * seq * heads * half;
    for (i64 t = global_thread(); t < n; t += grid_threads()) {
        i64 c = t % half;
        i64 token = t / (half * heads);  // (batch, position) flattened
        double p = pos ? (double)pos[token % seq] : (double)(token % seq);
        i64 base = (t / half) * d;
        double f = (double)freq[2 * c] + (double)freq[2 * c + 1];
        double angle = p * f;
        double mp = floor_scale > 0.0 ? m * (1.0 + attn_scale * log1p(floor((p + 1.0) / floor_scale))) : m;
        double cs = mp * cos(angle), sn = mp * sign * sin(angle);
        double x1 = x[base + c], x2 = x[base + c + half];
        y[base + c] = (float)(x1 * cs - x2 * sn);
        y[base + c + half] = (float)(x2 * cs + x1 * sn);
    }
}
