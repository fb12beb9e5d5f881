// Pointwise ops: unary functions and their derivatives, broadcasting binary arithmetic and
// its partials, and the sum of a broadcast gradient back to its operand's shape. Values are
// computed in f64 and rounded once, as in the CPU kernels (kernels/src/elementwise.rs), except
// the transcendentals of the activation functions (GELU's tanh, erf and exp, SiLU's
// sigmoid), which run in f32 (tanhf, erff, expf: within 2 ulp): in f64 they made the
// activations of a transformer's MLP compute-bound at a third of memory bandwidth.

// Unary op codes: the order of `kernels::elementwise::Unary` (runtime/src/backend/device/ops.rs
// maps them).
#define U_NEG 0
#define U_EXP 1
#define U_SQRT 2
#define U_RSQRT 3
#define U_TANH 4
#define U_SIGMOID 5
#define U_POW 6
#define U_SCALE 7
#define U_GELU_ERF 8
#define U_GELU_TANH 9
#define U_SILU 10
#define U_RELU 11
#define U_CLAMP 12

#define GELU_TANH_C 0.7978845608028654
#define GELU_TANH_CUBIC 0.044715
#define INV_SQRT_2 0.7071067811865476
#define INV_SQRT_2PI 0.3989422804014327

__device__ double unary_apply(int op, double p, double x) {
    switch (op) {
        case U_NEG: return -x;
        case U_EXP: return exp(x);
        case U_SQRT: return sqrt(x);
        case U_RSQRT: return 1.0 / sqrt(x);
        case U_TANH: return tanh(x);
        case U_SIGMOID: return sigmoid64(x);
        case U_POW: return pow(x, p);
        case U_SCALE: return x * p;
        case U_GELU_ERF: return 0.5 * x * (1.0 + (double)erff((float)(x * INV_SQRT_2)));
        case U_GELU_TANH: {
            double u = GELU_TANH_C * (x + GELU_TANH_CUBIC * x * x * x);
            return 0.5 * x * (1.0 + (double)tanhf((float)u));
        }
        case U_SILU: return x * sigmoid32(x);
        case U_CLAMP: return fmin(fmax(x, -p), p);
        default: return x > 0.0 ? x : 0.0;  // U_RELU
    }
}

__device__ double unary_derivative(int op, double p, double x) {
    switch (op) {
        case U_NEG: return -1.0;
        case U_EXP: return exp(x);
        case U_SQRT: return 0.5 / sqrt(x);
        case U_RSQRT: return -0.5 / (x * sqrt(x));
        case U_TANH: { double t = tanh(x); return 1.0 - t * t; }
        case U_SIGMOID: { double s = sigmoid64(x); return s * (1.0 - s); }
        case U_POW: return p == 0.0 ? 0.0 : p * pow(x, p - 1.0);
        case U_SCALE: return p;
        case U_GELU_ERF: {
            double cdf = 0.5 * (1.0 + (double)erff((float)(x * INV_SQRT_2)));
            return cdf + x * (double)expf((float)(-0.5 * x * x)) * INV_SQRT_2PI;
        }
        case U_GELU_TANH: {
            double u = GELU_TANH_C * (x + GELU_TANH_CUBIC * x * x * x);
            double t = (double)tanhf((float)u);
            double du = GELU_TANH_C * (1.0 + 3.0 * GELU_TANH_CUBIC * x * x);
            return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
        }
        case U_SILU: { double s = sigmoid32(x); return s * (1.0 + x * (1.0 - s)); }
        case U_CLAMP: return fabs(x) <= p ? 1.0 : 0.0;  // PyTorch's: passes where min <= x <= max
        default: return x > 0.0 ? 1.0 : 0.0;  // U_RELU: PyTorch's subgradient 0 at 0
    }
}

extern "C" __global__ void unary_forward(float* y, const float* x, i64 n, int op, double p) {
    i64 stride = grid_threads();
    for (i64 i0 = global_thread(); i0 < n; i0 += ILP * stride) {
        float v[ILP];
#pragma unroll
        for (int u = 0; u < ILP; ++u) v[u] = i0 + u * stride < n ? x[i0 + u * stride] : 0.0f;
#pragma unroll
        for (int u = 0; u < ILP; ++u)
            if (i0 + u * stride < n) y[i0 + u * stride] = (float)unary_apply(op, p, (double)v[u]);
    }
}

// unary_forward writing only y's bf16 words (two to a word, in order: y's twin), for a result
// every reader of which reads words (a GELU's output, which the next linear multiplies as
// bf16): half the bytes written, and no conversion after. x is read as f32 or, in the `_bf16x`
// kernels, as its words (a linear's output made as words: a GELU's input). One word per thread.
template <bool WORDS, class X>
__device__ void unary_forward_of(float* y, X x, i64 n, int op, double p) {
    for (i64 w = global_thread(); 2 * w < n; w += grid_threads()) {
        float lo = (float)unary_apply(op, p, (double)x[2 * w]);
        float hi = 2 * w + 1 < n ? (float)unary_apply(op, p, (double)x[2 * w + 1]) : 0.0f;
        if (WORDS) {
            ((unsigned*)y)[w] = bf16_pair(lo, hi);
        } else {
            y[2 * w] = lo;
            if (2 * w + 1 < n) y[2 * w + 1] = hi;
        }
    }
}

extern "C" __global__ void unary_forward_words(float* y, const float* x, i64 n, int op, double p) {
    unary_forward_of<true>(y, XF32{x}, n, op, p);
}

extern "C" __global__ void unary_forward_words_bf16x(float* y, const float* x, i64 n, int op, double p) {
    unary_forward_of<true>(y, XBf16{(const unsigned*)x}, n, op, p);
}

extern "C" __global__ void unary_forward_bf16x(float* y, const float* x, i64 n, int op, double p) {
    unary_forward_of<false>(y, XBf16{(const unsigned*)x}, n, op, p);
}

// unary_backward writing only dx's bf16 words (two to a word, in order), x read as f32
// (`unary_backward_words`) or as its words (`_bf16x`), and the output gradient g as f32 or as
// its words (`_bf16g`, `_bf16xg`: the linear after the GELU wrote it so): a GELU's input
// gradient, which the linear before it reads only as words (its GEMMs and its bias's column
// sums). One word per thread.
template <class X, class G>
__device__ void unary_backward_words_of(float* dx, X x, G g, i64 n, int op, double p) {
    unsigned* words = (unsigned*)dx;
    for (i64 w = global_thread(); 2 * w < n; w += grid_threads()) {
        float lo = (float)((double)g[2 * w] * unary_derivative(op, p, (double)x[2 * w]));
        float hi = 2 * w + 1 < n ? (float)((double)g[2 * w + 1] * unary_derivative(op, p, (double)x[2 * w + 1]))
                                 : 0.0f;
        words[w] = bf16_pair(lo, hi);
    }
}

extern "C" __global__ void unary_backward_words(float* dx, const float* x, const float* g, i64 n, int op,
                                                double p) {
    unary_backward_words_of(dx, XF32{x}, XF32{g}, n, op, p);
}

extern "C" __global__ void unary_backward_words_bf16x(float* dx, const float* x, const float* g, i64 n, int op,
                                                      double p) {
    unary_backward_words_of(dx, XBf16{(const unsigned*)x}, XF32{g}, n, op, p);
}

extern "C" __global__ void unary_backward_words_bf16g(float* dx, const float* x, const float* g, i64 n, int op,
                                                      double p) {
    unary_backward_words_of(dx, XF32{x}, XBf16{(const unsigned*)g}, n, op, p);
}

extern "C" __global__ void unary_backward_words_bf16xg(float* dx, const float* x, const float* g, i64 n, int op,
                                                       double p) {
    unary_backward_words_of(dx, XBf16{(const unsigned*)x}, XBf16{(const unsigned*)g}, n, op, p);
}

extern "C" __global__ void unary_backward(float* dx, const float* x, const float* g, i64 n, int op, double p) {
    i64 stride = grid_threads();
    for (i64 i0 = global_thread(); i0 < n; i0 += ILP * stride) {
        float v[ILP], d[ILP];
#pragma unroll
        for (int u = 0; u < ILP; ++u) {
            bool in = i0 + u * stride < n;
            v[u] = in ? x[i0 + u * stride] : 0.0f;
            d[u] = in ? g[i0 + u * stride] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < ILP; ++u)
            if (i0 + u * stride < n)
                dx[i0 + u * stride] = (float)((double)d[u] * unary_derivative(op, p, (double)v[u]));
    }
}

// unary_backward with x given as its bf16 words (two to a word, in order: the stash's layout),
// as a bf16 plan holds a GELU's input from its forward to its backward: read as it is, with no
// f32 expansion first (half the bytes of x). A thread takes a word: two elements of x, g, dx
// (g and dx whole allocations, so 8-byte aligned).
extern "C" __global__ void unary_backward_bf16x(float* dx, const float* xw, const float* g, i64 n, int op, double p) {
    const unsigned* words = (const unsigned*)xw;
    i64 count = (n + 1) / 2, stride = grid_threads();
    for (i64 w0 = global_thread(); w0 < count; w0 += ILP * stride) {
        unsigned v[ILP];
        float2 d[ILP];
#pragma unroll
        for (int u = 0; u < ILP; ++u) {
            i64 w = w0 + u * stride;
            v[u] = w < count ? words[w] : 0u;
            if (2 * w + 1 < n) {
                d[u] = ((const float2*)g)[w];
            } else {
                d[u].x = w < count ? g[2 * w] : 0.0f;
                d[u].y = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < ILP; ++u) {
            i64 w = w0 + u * stride;
            if (w >= count) continue;
            double lo = (double)__uint_as_float(v[u] << 16);
            double hi = (double)__uint_as_float(v[u] & 0xffff0000u);
            float2 out;
            out.x = (float)((double)d[u].x * unary_derivative(op, p, lo));
            out.y = (float)((double)d[u].y * unary_derivative(op, p, hi));
            if (2 * w + 1 < n) {
                ((float2*)dx)[w] = out;
            } else {
                dx[2 * w] = out.x;
            }
        }
    }
}

// Binary op codes: the order of `kernels::elementwise::Binary`.
#define B_ADD 0
#define B_SUB 1
#define B_MUL 2
#define B_DIV 3

__device__ double binary_apply(int op, double a, double b) {
    switch (op) {
        case B_ADD: return a + b;
        case B_SUB: return a - b;
        case B_MUL: return a * b;
        default: return a / b;
    }
}

// Operands laid out as the output (a residual add, a sum of two gradients): ILP loads of each
// in flight per thread, as the streaming kernels keep.
__device__ void binary_forward_dense(float* y, const float* a, const float* b, i64 n, int op) {
    i64 stride = grid_threads();
    for (i64 i0 = global_thread(); i0 < n; i0 += ILP * stride) {
        float va[ILP], vb[ILP];
#pragma unroll
        for (int u = 0; u < ILP; ++u) {
            bool in = i0 + u * stride < n;
            va[u] = in ? a[i0 + u * stride] : 0.0f;
            vb[u] = in ? b[i0 + u * stride] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < ILP; ++u)
            if (i0 + u * stride < n) y[i0 + u * stride] = (float)binary_apply(op, (double)va[u], (double)vb[u]);
    }
}

extern "C" __global__ void binary_forward(float* y, const float* a, const float* b, Broadcast s, i64 n, int op) {
    bool dense = broadcast_is_dense(s);
    if (dense) {
        binary_forward_dense(y, a, b, n, op);
        return;
    }
    for (i64 i = global_thread(); i < n; i += grid_threads()) {
        i64 oa = i, ob = i;
        if (!dense) broadcast_offsets(s, i, &oa, &ob);
        y[i] = (float)binary_apply(op, (double)a[oa], (double)b[ob]);
    }
}

// binary_forward on operands laid out as the output that also writes the result's bf16 twin
// (two to a word, in order, the last word's upper half zero when n is odd): the words the
// stash keeps, or a bf16 GEMM reads, of a residual add or a gradient sum, made while the
// result is in registers instead of by a second pass over it (`to_bf16`). One thread a word.
extern "C" __global__ void binary_forward_twin(float* y, float* twin, const float* a, const float* b, i64 n,
                                               int op) {
    unsigned* words = (unsigned*)twin;
    i64 count = (n + 1) / 2, stride = grid_threads();
    for (i64 w0 = global_thread(); w0 < count; w0 += ILP * stride) {
        float va[ILP][2], vb[ILP][2];
#pragma unroll
        for (int u = 0; u < ILP; ++u)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                i64 i = 2 * (w0 + u * stride) + h;
                va[u][h] = i < n ? a[i] : 0.0f;
                vb[u][h] = i < n ? b[i] : 0.0f;
            }
#pragma unroll
        for (int u = 0; u < ILP; ++u) {
            i64 w = w0 + u * stride;
            if (w >= count) continue;
            float lo = (float)binary_apply(op, (double)va[u][0], (double)vb[u][0]);
            float hi = 2 * w + 1 < n ? (float)binary_apply(op, (double)va[u][1], (double)vb[u][1]) : 0.0f;
            y[2 * w] = lo;
            if (2 * w + 1 < n) y[2 * w + 1] = hi;
            words[w] = bf16_pair(lo, hi);
        }
    }
}

// binary_forward on operands laid out as the output where one of them (`side` 0: a, 1: b) is a
// biased linear's product still without its bias: that operand is read as product[r, c] +
// bias[c] (rounded to f32 first, as `add_bias` would have stored it), so the residual add after
// a projection adds the bias in the same pass instead of a pass of its own over the product.
// With `twin` non-null it also writes the result's bf16 words (binary_forward_twin). One block
// per row, a thread a pair of columns (cols even).
extern "C" __global__ void binary_forward_biased(float* y, float* twin, const float* a, const float* b,
                                                 const float* bias, i64 rows, i64 cols, int op, int side) {
    unsigned* words = (unsigned*)twin;
    int half = (int)(cols / 2);
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        for (int w = threadIdx.x; w < half; w += blockDim.x) {
            i64 i = r * cols + 2 * w;
            float v[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float x = a[i + h], z = b[i + h];
                if (side == 0) x = x + bias[2 * w + h];
                else z = z + bias[2 * w + h];
                v[h] = (float)binary_apply(op, (double)x, (double)z);
            }
            y[i] = v[0];
            y[i + 1] = v[1];
            if (twin) words[i / 2] = bf16_pair(v[0], v[1]);
        }
    }
}

// The output-shaped gradients of both operands: ga = g·∂/∂a, gb = g·∂/∂b (either may be null
// when its operand needs none).
// ∂/∂a and ∂/∂b of `op` at (x, z).
__device__ void binary_partials(int op, double x, double z, double* da, double* db) {
    switch (op) {
        case B_ADD: *da = 1.0; *db = 1.0; break;
        case B_SUB: *da = 1.0; *db = -1.0; break;
        case B_MUL: *da = z; *db = x; break;
        default: *da = 1.0 / z; *db = -x / (z * z); break;
    }
}

// binary_backward on operands laid out as the output, ILP elements in flight per thread; a
// sum or difference reads neither operand (its partials are constants).
__device__ void binary_backward_dense(float* ga, float* gb, const float* a, const float* b, const float* g, i64 n,
                                      int op) {
    bool reads = op == B_MUL || op == B_DIV;
    i64 stride = grid_threads();
    for (i64 i0 = global_thread(); i0 < n; i0 += ILP * stride) {
        float vx[ILP], vz[ILP], vg[ILP];
#pragma unroll
        for (int u = 0; u < ILP; ++u) {
            i64 i = i0 + u * stride;
            bool in = i < n;
            vg[u] = in ? g[i] : 0.0f;
            vx[u] = in && reads ? a[i] : 0.0f;
            vz[u] = in && reads ? b[i] : 1.0f;
        }
#pragma unroll
        for (int u = 0; u < ILP; ++u) {
            i64 i = i0 + u * stride;
            if (i >= n) continue;
            double da, db;
            binary_partials(op, (double)vx[u], (double)vz[u], &da, &db);
            if (ga) ga[i] = (float)((double)vg[u] * da);
            if (gb) gb[i] = (float)((double)vg[u] * db);
        }
    }
}

extern "C" __global__ void binary_backward(float* ga, float* gb, const float* a, const float* b, const float* g,
                                           Broadcast s, i64 n, int op) {
    if (broadcast_is_dense(s)) {
        binary_backward_dense(ga, gb, a, b, g, n, op);
        return;
    }
    for (i64 i = global_thread(); i < n; i += grid_threads()) {
        i64 oa = i, ob = i;
        broadcast_offsets(s, i, &oa, &ob);
        double x = a[oa], z = b[ob], gi = g[i], da, db;
        binary_partials(op, x, z, &da, &db);
        if (ga) ga[i] = (float)(gi * da);
        if (gb) gb[i] = (float)(gi * db);
    }
}

// out[j] = Σ g[i] over the output elements i that read operand element j: `s.dims` is the
// output's shape and `s.stride_a` the operand's strides (0 on the axes it is broadcast along).
// One thread per operand element, summing in f64 in a fixed order (deterministic).
extern "C" __global__ void sum_to_operand(float* out, const float* g, Broadcast s, i64 operand_len) {
    i64 spread = 1;
    for (int d = 0; d < s.rank; ++d)
        if (s.stride_a[d] == 0) spread *= s.dims[d];
    for (i64 j = global_thread(); j < operand_len; j += grid_threads()) {
        double total = 0.0;
        for (i64 k = 0; k < spread; ++k) {
            // Output offset: kept axes from j, broadcast axes from k.
            i64 off = 0, out_stride = 1, jr = j, kr = k;
            for (int d = s.rank - 1; d >= 0; --d) {
                i64 c;
                if (s.stride_a[d] == 0) { c = kr % s.dims[d]; kr /= s.dims[d]; }
                else { c = jr % s.dims[d]; jr /= s.dims[d]; }
                off += c * out_stride;
                out_stride *= s.dims[d];
            }
            total += g[off];
        }
        out[j] = (float)total;
    }
}

// out[c] = Σ_r x[r, c] over `rows` rows of `cols`, in f64: the second pass of a column
// reduction (over `column_sum_chunks`' partial sums) or a short one. A block takes
// COLUMN_SUM_WIDTH columns (a warp's loads coalesce along a row), its other threads split the
// rows among them, and the block adds their sums in lane order (the same every run). One
// thread per column, as this was, summed 128 partial rows in one dependent chain: about 10 µs
// a launch on an H200 whatever the width, for ~100 launches a GPT-2 step.
#define COLUMN_SUM_WIDTH 32
extern "C" __global__ void column_sum(float* out, const float* x, i64 rows, i64 cols) {
    __shared__ double lane_sums[PLAIT_MAX_BLOCK];
    int width = blockDim.x < COLUMN_SUM_WIDTH ? (int)blockDim.x : COLUMN_SUM_WIDTH;
    int lanes = (int)blockDim.x / width;
    int col = (int)threadIdx.x % width, lane = (int)threadIdx.x / width;
    for (i64 c0 = (i64)blockIdx.x * width; c0 < cols; c0 += (i64)gridDim.x * width) {
        i64 c = c0 + col;
        double total = 0.0;
        if (c < cols)
            for (i64 r = lane; r < rows; r += lanes) total += x[r * cols + c];
        lane_sums[threadIdx.x] = total;
        __syncthreads();
        if (lane == 0 && c < cols) {
            double sum = 0.0;
            for (int l = 0; l < lanes; ++l) sum += lane_sums[l * width + col];
            out[c] = (float)sum;
        }
        __syncthreads();
    }
}

// The first pass of a column reduction over many rows (a bias's gradient): part[k, c] = Σ x[r, c]
// over the rows r of chunk k (`chunk` rows each), one thread per (chunk, column), so that the
// whole grid works instead of one thread per column.
template <class X>
__device__ void column_sum_chunks_of(float* part, X x, i64 rows, i64 cols, i64 chunk) {
    i64 chunks = (rows + chunk - 1) / chunk;
    for (i64 i = global_thread(); i < chunks * cols; i += grid_threads()) {
        i64 k = i / cols, c = i % cols;
        i64 end = (k + 1) * chunk < rows ? (k + 1) * chunk : rows;
        double total = 0.0;
        for (i64 r = k * chunk; r < end; ++r) total += x[r * cols + c];
        part[i] = (float)total;
    }
}

extern "C" __global__ void column_sum_chunks(float* part, const float* x, i64 rows, i64 cols, i64 chunk) {
    column_sum_chunks_of(part, XF32{x}, rows, cols, chunk);
}

// column_sum_chunks of x given as its bf16 words (a linear's output gradient made as words:
// its bias's gradient).
extern "C" __global__ void column_sum_chunks_bf16x(float* part, const float* x, i64 rows, i64 cols, i64 chunk) {
    column_sum_chunks_of(part, XBf16{(const unsigned*)x}, rows, cols, chunk);
}

// y[i] = value for i < n (a constant buffer: zeros for accumulators, a loss scale).
extern "C" __global__ void fill(float* y, i64 n, double value) {
    for (i64 i = global_thread(); i < n; i += grid_threads()) y[i] = (float)value;
}

// y[i] = i for i < n (positions: the IR's `Iota`).
extern "C" __global__ void iota(float* y, i64 n) {
    for (i64 i = global_thread(); i < n; i += grid_threads()) y[i] = (float)i;
}

// Inverted dropout with the mask of ir::interp::dropout_keep on each element's global index
// (runtime/src/backend/dropout.rs, `DropoutMask`): kept iff the top 53 bits of splitmix64 at
// seed + (index + 1)·φ, as a uniform in [0, 1), are ≥ p. `shard_s` > 0: the rows are
// sequence-parallel shards, local token t being global token `shard_off + t`.
__device__ unsigned long long splitmix_output(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

extern "C" __global__ void dropout(float* y, const float* x, i64 n, i64 per_row, i64 row, i64 seq, i64 shard_s,
                                   i64 shard_off, i64 seed, double p) {
    double scale = 1.0 / (1.0 - p);
    i64 pr = per_row > 0 ? per_row : 1;
    for (i64 i = global_thread(); i < n; i += grid_threads()) {
        i64 bi = i / pr, rest = i % pr, g;
        if (shard_s > 0) {
            i64 inner = pr / shard_s > 0 ? pr / shard_s : 1;
            g = ((row + bi) * seq + shard_off + rest / inner) * inner + rest % inner;
        } else {
            g = (row + bi) * pr + rest;
        }
        unsigned long long z =
            splitmix_output((unsigned long long)seed + ((unsigned long long)g + 1ull) * 0x9E3779B97F4A7C15ull);
        double u = (double)(z >> 11) * (1.0 / 9007199254740992.0);
        y[i] = u >= p ? (float)((double)x[i] * scale) : 0.0f;
    }
}

// Words of one row a block converts per turn (the launcher's grid is one block per segment):
// the block divides once per segment, not per word, as 64-bit divisions cost tens of
// instructions and this kernel should run at memory bandwidth.
#define BF16_SEGMENT 2048

// `mats` row-major [rows, cols] matrices of x (the m-th at m·stride) rounded to bf16 (to
// nearest, ties to even; kernels::device::round_bf16), two to a word of `y`, each row padded
// with zeros to `pitch` (even) columns and the matrices packed: the operands of a bf16 plan's
// GEMMs, which cuBLAS then multiplies as bf16. The row pitch of 8 elements (16 bytes) is the
// alignment cuBLAS's fast Hopper kernels want, which a 50257-word vocabulary row lacks.
extern "C" __global__ void to_bf16(float* y, const float* x, i64 mats, i64 rows, i64 cols, i64 stride, i64 pitch) {
    unsigned* words = (unsigned*)y;
    i64 per_row = pitch / 2, segments = (per_row + BF16_SEGMENT - 1) / BF16_SEGMENT;
    for (i64 t = blockIdx.x; t < mats * rows * segments; t += gridDim.x) {
        i64 mr = t / segments, first = (t - mr * segments) * BF16_SEGMENT;
        i64 m = mr / rows, r = mr - m * rows;
        const float* row = x + m * stride + r * cols;
        unsigned* out = words + mr * per_row + first;
        // Within a segment, 32-bit indices; pairs load as one 8-byte word where the row is
        // 8-byte aligned.
        int count = (int)(first + BF16_SEGMENT < per_row ? BF16_SEGMENT : per_row - first);
        int full = (int)((cols - 2 * first) / 2);  // words whose two columns are both inside
        if (full > count) full = count;
        if (full < 0) full = 0;
        const float* seg = row + 2 * first;
        bool pairs = ((unsigned long long)seg & 7ull) == 0;
        for (int w0 = threadIdx.x; w0 < count; w0 += ILP * blockDim.x) {
            float2 v[ILP];
#pragma unroll
            for (int u = 0; u < ILP; ++u) {
                int w = w0 + u * (int)blockDim.x;
                if (w < full && pairs) {
                    v[u] = ((const float2*)seg)[w];
                } else {
                    i64 c = 2 * (first + w);
                    v[u].x = w < count && c < cols ? seg[2 * w] : 0.0f;
                    v[u].y = w < count && c + 1 < cols ? seg[2 * w + 1] : 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < ILP; ++u) {
                int w = w0 + u * (int)blockDim.x;
                if (w < count) out[w] = bf16_pair(v[u].x, v[u].y);
            }
        }
    }
}

// y[i] = the i-th bf16 of x's words, as f32 (exact): `to_bf16`'s copy of one row (mats = rows =
// 1) back, for a tensor the executor kept as bf16 between its uses (Backend::unstash_bf16).
extern "C" __global__ void from_bf16(float* y, const float* x, i64 n) {
    const unsigned* words = (const unsigned*)x;
    i64 count = (n + 1) / 2, stride = grid_threads();
    for (i64 w0 = global_thread(); w0 < count; w0 += ILP * stride) {
        unsigned v[ILP];
#pragma unroll
        for (int u = 0; u < ILP; ++u) v[u] = w0 + u * stride < count ? words[w0 + u * stride] : 0u;
#pragma unroll
        for (int u = 0; u < ILP; ++u) {
            i64 w = w0 + u * stride;
            if (w >= count) continue;
            float lo = __uint_as_float(v[u] << 16), hi = __uint_as_float(v[u] & 0xffff0000u);
            if (2 * w + 1 < n) {
                float2 pair;
                pair.x = lo;
                pair.y = hi;
                ((float2*)y)[w] = pair;  // y is a whole allocation: 8-byte aligned
            } else {
                y[2 * w] = lo;
            }
        }
    }
}

// y[row0 + r, c] = x[r · pitch + c] for `rows` rows `cols` wide: a GEMM's output written at a
// padded row pitch (cuBLAS's fast Hopper kernels need 16-byte aligned rows; a 50257-word
// vocabulary's logits are not), copied to the dense layout. One block per row.
extern "C" __global__ void unpad_rows(float* y, const float* x, i64 rows, i64 cols, i64 pitch, i64 row0) {
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        float* out = y + (row0 + r) * cols;
        const float* in = x + r * pitch;
        for (i64 c0 = threadIdx.x; c0 < cols; c0 += ILP * blockDim.x) {
            float v[ILP];
#pragma unroll
            for (int u = 0; u < ILP; ++u) v[u] = c0 + u * blockDim.x < cols ? in[c0 + u * blockDim.x] : 0.0f;
#pragma unroll
            for (int u = 0; u < ILP; ++u)
                if (c0 + u * blockDim.x < cols) out[c0 + u * blockDim.x] = v[u];
        }
    }
}

// add_bias on 16-byte words: `words` of y, rows `row_words` wide (32-bit indices).
__device__ void add_bias_words(float4* y, const float4* bias, unsigned words, unsigned row_words) {
    unsigned stride = gridDim.x * blockDim.x;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        float4 v = y[i], b = bias[i % row_words];
        v.x += b.x;
        v.y += b.y;
        v.z += b.z;
        v.w += b.w;
        y[i] = v;
    }
}

// The words of y[r, c] + bias[c] (two to a word, in order; cols even) into `words`, y's own
// values left as they are: a biased linear's output made as bf16 words alone (its readers read
// only words), straight after its GEMM wrote y. One block per row.
extern "C" __global__ void add_bias_to_words(float* words, const float* y, const float* bias, i64 n, i64 cols) {
    unsigned* out = (unsigned*)words;
    int half = (int)(cols / 2);
    for (i64 r = blockIdx.x; r < n / cols; r += gridDim.x) {
        const float* row = y + r * cols;
        for (int w = threadIdx.x; w < half; w += blockDim.x)
            out[r * half + w] = bf16_pair(row[2 * w] + bias[2 * w], row[2 * w + 1] + bias[2 * w + 1]);
    }
}

// bias[c] rounded to bf16 in every row of `words` (two to a word, in order; cols even; n
// elements): the output a biased linear's bf16 GEMM then adds its product to (beta = 1), so
// that the sum is rounded once, as a bias epilogue rounds it. One block per row.
extern "C" __global__ void bias_rows_words(float* words, const float* bias, i64 n, i64 cols) {
    unsigned* out = (unsigned*)words;
    int half = (int)(cols / 2);
    for (i64 r = blockIdx.x; r < n / cols; r += gridDim.x)
        for (int w = threadIdx.x; w < half; w += blockDim.x)
            out[r * half + w] = bf16_pair(bias[2 * w], bias[2 * w + 1]);
}

// y[r, c] += bias[c] in place over n elements of rows `cols` wide: a biased linear's output
// straight after its GEMM (no second [rows, cols] buffer). Rows a multiple of 4 wide go as
// 16-byte words, the grid striding over all of them (an H200 ran the one-row-per-block,
// one-float-per-load form at about 1.6 TB/s: 1.7 ms of GPT-2's step).
extern "C" __global__ void add_bias(float* y, const float* bias, i64 n, i64 cols) {
    bool aligned = (((unsigned long long)y | (unsigned long long)bias) & 15ull) == 0;
    if ((cols & 3) == 0 && aligned && n / 4 < (1ll << 31)) {
        add_bias_words((float4*)y, (const float4*)bias, (unsigned)(n / 4), (unsigned)(cols / 4));
        return;
    }
    // One block per row (no division per element; the launcher's grid is the row count).
    for (i64 r = blockIdx.x; r < n / cols; r += gridDim.x) {
        float* row = y + r * cols;
        for (i64 c0 = threadIdx.x; c0 < cols; c0 += ILP * blockDim.x) {
            float v[ILP], b[ILP];
#pragma unroll
            for (int u = 0; u < ILP; ++u) {
                bool in = c0 + u * blockDim.x < cols;
                v[u] = in ? row[c0 + u * blockDim.x] : 0.0f;
                b[u] = in ? bias[c0 + u * blockDim.x] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < ILP; ++u)
                if (c0 + u * blockDim.x < cols) row[c0 + u * blockDim.x] = v[u] + b[u];
        }
    }
}
