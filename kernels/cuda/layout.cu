// Layout ops as strided copies (kernels/src/layout.rs): the launcher describes each as a box
// of `n` elements with source and destination strides.

// Boxes whose last dim is at least this long are copied a row (of that dim) per block turn:
// the 64-bit divisions that place an element then run once per row, not per element.
#define STRIDED_ROW_MIN 64

// The source and destination offsets of element `index` of the box's first `dims` dims.
__device__ void strided_offsets(const Strided& s, int dims, i64 index, i64* from, i64* to) {
    i64 rest = index, a = s.src_offset, b = s.dst_offset;
    for (int d = dims - 1; d >= 0; --d) {
        i64 c = rest % s.dims[d];
        rest /= s.dims[d];
        a += c * s.src_stride[d];
        b += c * s.dst_stride[d];
    }
    *from = a;
    *to = b;
}

// One row of `cols` elements, `src_step` and `dst_step` apart, by the block's threads with ILP
// loads in flight each (a row's element count fits 32 bits; its offsets are 64-bit).
__device__ void strided_row(float* b, const float* a, int cols, i64 src_step, i64 dst_step) {
    for (int c0 = threadIdx.x; c0 < cols; c0 += ILP * (int)blockDim.x) {
        float v[ILP];
#pragma unroll
        for (int u = 0; u < ILP; ++u) {
            int c = c0 + u * (int)blockDim.x;
            v[u] = c < cols ? a[(i64)c * src_step] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < ILP; ++u) {
            int c = c0 + u * (int)blockDim.x;
            if (c < cols) b[(i64)c * dst_step] = v[u];
        }
    }
}

extern "C" __global__ void strided_copy(float* dst, const float* src, Strided s, i64 n) {
    i64 inner = s.rank > 0 ? s.dims[s.rank - 1] : 1;
    if (inner >= STRIDED_ROW_MIN && inner < (1LL << 31)) {
        i64 in_src = s.src_stride[s.rank - 1], in_dst = s.dst_stride[s.rank - 1];
        for (i64 r = blockIdx.x; r < n / inner; r += gridDim.x) {
            i64 from, to;
            strided_offsets(s, s.rank - 1, r, &from, &to);
            const float* a = src + from;
            float* b = dst + to;
            strided_row(b, a, (int)inner, in_src, in_dst);
        }
        return;
    }
    for (i64 i = global_thread(); i < n; i += grid_threads()) {
        i64 from, to;
        strided_offsets(s, s.rank, i, &from, &to);
        dst[to] = src[from];
    }
}

// Columns start .. start + len of each of x's `rows` rows of `cols` as bf16 words only (two to a
// word, in order; len even): a last-axis split (q, k and v out of one fused projection) whose
// parts are read only as words (attention's operands on the tensor cores), with no f32 copy.
// One block per row.
extern "C" __global__ void split_cols_words(float* y, const float* x, i64 rows, i64 cols, i64 start, i64 len) {
    unsigned* words = (unsigned*)y;
    int half = (int)(len / 2);
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* src = x + r * cols + start;
        unsigned* out = words + r * half;
        for (int w = threadIdx.x; w < half; w += blockDim.x) out[w] = bf16_pair(src[2 * w], src[2 * w + 1]);
    }
}

// The same from x's bf16 words (two to a word, in order; cols and start even): a split of a
// result held as words only (the fused projection's output, which no kernel then writes in
// f32). One block per row.
extern "C" __global__ void split_cols_words_bf16x(float* y, const float* x, i64 rows, i64 cols, i64 start,
                                                  i64 len) {
    unsigned* words = (unsigned*)y;
    const unsigned* in = (const unsigned*)x;
    int half = (int)(len / 2);
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const unsigned* src = in + (r * cols + start) / 2;
        unsigned* out = words + r * half;
        for (int w = threadIdx.x; w < half; w += blockDim.x) out[w] = src[w];
    }
}

// x ([rows, len], f32) placed at columns start .. start + len of y's rows of `cols` as bf16
// words (two to a word, in order; start and len even): one part of a last-axis concatenation
// made as words only (dq, dk, dv joined into the fused projection's output gradient, which
// its linear reads only as words). One block per row.
extern "C" __global__ void place_cols_words(float* y, const float* x, i64 rows, i64 cols, i64 start, i64 len) {
    unsigned* words = (unsigned*)y;
    int half = (int)(len / 2);
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* src = x + r * len;
        unsigned* out = words + (r * cols + start) / 2;
        for (int w = threadIdx.x; w < half; w += blockDim.x) out[w] = bf16_pair(src[2 * w], src[2 * w + 1]);
    }
}

// The same from x's bf16 words ([rows, len], two to a word, in order): a part held as words
// only (attention's dq, dk and dv, written so by its backward). One block per row.
extern "C" __global__ void place_cols_words_bf16x(float* y, const float* x, i64 rows, i64 cols, i64 start,
                                                  i64 len) {
    unsigned* words = (unsigned*)y;
    const unsigned* in = (const unsigned*)x;
    int half = (int)(len / 2);
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const unsigned* src = in + r * half;
        unsigned* out = words + (r * cols + start) / 2;
        for (int w = threadIdx.x; w < half; w += blockDim.x) out[w] = src[w];
    }
}
