// Layout ops as strided copies (kernels/src/layout.rs): the launcher describes each as a box
// of `n` elements with source and destination strides.

extern "C" __global__ void strided_copy(float* dst, const float* src, Strided s, i64 n) {
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
