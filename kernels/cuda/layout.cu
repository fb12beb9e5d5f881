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

extern "C" __global__ void strided_copy(float* dst, const float* src, Strided s, i64 n) {
    i64 inner = s.rank > 0 ? s.dims[s.rank - 1] : 1;
    if (inner >= STRIDED_ROW_MIN) {
        i64 in_src = s.src_stride[s.rank - 1], in_dst = s.dst_stride[s.rank - 1];
        for (i64 r = blockIdx.x; r < n / inner; r += gridDim.x) {
            i64 from, to;
            strided_offsets(s, s.rank - 1, r, &from, &to);
            const float* a = src + from;
            float* b = dst + to;
            if (in_src == 1 && in_dst == 1) {
                for (i64 c = threadIdx.x; c < inner; c += blockDim.x) b[c] = a[c];
            } else {
                for (i64 c = threadIdx.x; c < inner; c += blockDim.x) b[c * in_dst] = a[c * in_src];
            }
        }
        return;
    }
    for (i64 i = global_thread(); i < n; i += grid_threads()) {
        i64 from, to;
        strided_offsets(s, s.rank, i, &from, &to);
        dst[to] = src[from];
    }
}
