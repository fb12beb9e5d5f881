// Layout ops as strided copies (kernels/src/layout.rs): the launcher describes each as a box
// of `n` elements with source and destination strides.

// Boxes whose last dim is at least this long are copied a row (of that dim) per block turn:
// the 64-bit divisions that place an element then run once per row, not per element.
#define STRIDED_ROW_MIN 64

extern "C" __global__ void strided_copy(float* dst, const float* src, Strided s, i64 n) {
    i64 inner = s.rank > 0 ? s.dims[s.rank - 1] : 1;
    if (inner >= STRIDED_ROW_MIN) {
        i64 in_src = s.src_stride[s.rank - 1], in_dst = s.dst_stride[s.rank - 1];
        for (i64 r = blockIdx.x; r < n / inner; r += gridDim.x) {
            i64 rest = r, from = s.src_offset, to = s.dst_offset;
            for (int d = s.rank - 2; d >= 0; --d) {
                i64 c = rest % s.dims[d];
                rest /= s.dims[d];
                from += c * s.src_stride[d];
                to += c * s.dst_stride[d];
            }
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
        i64 rest = i, from = s.src_offset, to = s.dst_offset;
        for (int d = s.rank - 1; d >= 0; --d) {
            i64 c = rest % s.dims[d];
            rest /= s.dims[d];
            from += c * s.src_stride[d];
            to += c * s.dst_stride[d];
        }
        dst[to] = src[from];
    }
}
