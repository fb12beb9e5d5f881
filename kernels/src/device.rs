//! The device kernels' source and launch types: the CUDA C of `kernels/cuda/`, which the CUDA
//! backend compiles with NVRTC and the `simt` crate compiles for the host to test it here, and
//! the argument types both launchers share.
//!
//! Each kernel is declared once, as `extern "C" __global__ void NAME(..)` in one `.cu` file;
//! its argument letters ([`KernelArg::letter`]) are checked against that declaration at every
//! emulated launch, so a launcher out of step with a kernel fails in CI, not on a GPU.

/// The kernels' shared helpers and every kernel file, as one NVRTC program.
pub const CUDA_SOURCE: &str = concat!(
    include_str!("../cuda/common.cuh"),
    include_str!("../cuda/pointwise.cu"),
    include_str!("../cuda/norm.cu"),
    include_str!("../cuda/softmax.cu"),
    include_str!("../cuda/loss.cu"),
    include_str!("../cuda/embedding.cu"),
    include_str!("../cuda/adamw.cu"),
    include_str!("../cuda/layout.cu"),
    include_str!("../cuda/attention.cu"),
    include_str!("../cuda/attention_mma.cu"),
    include_str!("../cuda/rotary.cu"),
    include_str!("../cuda/reduce.cu"),
    include_str!("../cuda/moe.cu"),
    include_str!("../cuda/vocab.cu"),
    include_str!("../cuda/context.cu"),
);

/// The names of the kernels in [`CUDA_SOURCE`]: its `extern "C" __global__ void NAME(` lines,
/// NAME the last word before the parenthesis (a launch-bounds macro may come first; the
/// `simt` build script reads the same lines).
pub fn kernel_names() -> Vec<&'static str> {
    const DECL: &str = "extern \"C\" __global__ void ";
    CUDA_SOURCE
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix(DECL))
        .filter_map(|rest| rest.split('(').next())
        .filter_map(|head| head.split_whitespace().last())
        .collect()
}

/// The file names [`CUDA_SOURCE`] is made of (a test checks the folder has no others).
pub const CUDA_FILES: &[&str] = &[
    "common.cuh",
    "pointwise.cu",
    "norm.cu",
    "softmax.cu",
    "loss.cu",
    "embedding.cu",
    "adamw.cu",
    "layout.cu",
    "attention.cu",
    "attention_mma.cu",
    "rotary.cu",
    "reduce.cu",
    "moe.cu",
    "vocab.cu",
    "context.cu",
];

/// The `op` and `p` arguments of `unary_forward`/`unary_backward` for a pointwise function of
/// one operand (the `U_*` codes of `pointwise.cu`); `None` for other ops.
pub fn unary_code(kind: &ir::OpKind) -> Option<(i32, f64)> {
    use crate::elementwise::Unary;
    Some(match Unary::of(kind)? {
        Unary::Neg => (0, 0.0),
        Unary::Exp => (1, 0.0),
        Unary::Sqrt => (2, 0.0),
        Unary::Rsqrt => (3, 0.0),
        Unary::Tanh => (4, 0.0),
        Unary::Sigmoid => (5, 0.0),
        Unary::Pow(e) => (6, e),
        Unary::Scale(f) => (7, f),
        Unary::Gelu { tanh: false } => (8, 0.0),
        Unary::Gelu { tanh: true } => (9, 0.0),
        Unary::Silu => (10, 0.0),
        Unary::Relu => (11, 0.0),
        Unary::Clamp(l) => (12, l),
    })
}

/// The `op` argument of `binary_forward`/`binary_backward` (the `B_*` codes of `pointwise.cu`).
pub fn binary_code(kind: &ir::OpKind) -> Option<i32> {
    use crate::elementwise::Binary;
    Some(match Binary::of(kind)? {
        Binary::Add => 0,
        Binary::Sub => 1,
        Binary::Mul => 2,
        Binary::Div => 3,
    })
}

/// The shape a `Reshape` or an `Expand` makes under `binding`; `None` for other ops and for
/// dims that do not evaluate (the CPU kernel then reports them).
pub fn shape_attribute(kind: &ir::OpKind, binding: ir::Binding) -> Option<Vec<usize>> {
    match kind {
        ir::OpKind::Reshape { shape } | ir::OpKind::Expand { shape } => {
            crate::layout::eval_dims(kind.mnemonic(), shape, binding).ok()
        }
        _ => None,
    }
}

/// The shape two operands broadcast to (numpy rules); `None` if they do not.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    crate::shape::broadcast_shape("broadcast", a, b).ok()
}

/// `x` rounded to bfloat16 (8 significant bits, round to nearest even) and widened back: what
/// a bf16 GEMM's tensor cores see of an f32 operand (cuBLAS's `CUBLAS_COMPUTE_32F_FAST_16BF`
/// down-converts so). NaN stays NaN.
pub fn round_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
    f32::from_bits(rounded)
}

/// Loads a streaming kernel's thread keeps in flight (`ILP` in `common.cuh`): its grid-stride
/// kernels cover `ILP · block` elements per block.
pub const ILP: usize = 4;

/// Words of one row `to_bf16` converts per block turn (its `BF16_SEGMENT`).
pub const BF16_SEGMENT: usize = 2048;

/// The grid of a `to_bf16` launch over `mats · rows` rows of `pitch` elements: one block per
/// segment of a row, at most 65535.
pub fn to_bf16_grid(mats: usize, rows: usize, pitch: usize) -> u32 {
    let segments = mats * rows * (pitch / 2).div_ceil(BF16_SEGMENT);
    segments.clamp(1, 65535) as u32
}

/// The most ranks a [`Broadcast`] describes (`PLAIT_MAX_RANK`).
pub const MAX_RANK: usize = 8;

/// `struct Broadcast` of `common.cuh`, passed by value: two operands' element strides into one
/// output shape (0 on a broadcast axis), aligned on the right.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Broadcast {
    pub rank: i32,
    pub dims: [i64; MAX_RANK],
    pub stride_a: [i64; MAX_RANK],
    pub stride_b: [i64; MAX_RANK],
}

impl Broadcast {
    /// The broadcast of operands `a` and `b` to `out` (numpy rules; `out` from
    /// `broadcast_shape`); `None` past [`MAX_RANK`] dims or when a dim does not fit.
    pub fn new(out: &[usize], a: &[usize], b: &[usize]) -> Option<Broadcast> {
        if out.len() > MAX_RANK || a.len() > out.len() || b.len() > out.len() {
            return None;
        }
        let mut s = Broadcast {
            rank: i32::try_from(out.len()).ok()?,
            ..Broadcast::default()
        };
        for (d, &n) in out.iter().enumerate() {
            s.dims[d] = i64::try_from(n).ok()?;
        }
        s.stride_a = aligned_strides(out, a)?;
        s.stride_b = aligned_strides(out, b)?;
        Some(s)
    }
}

/// `struct Strided` of `common.cuh`, passed by value: a box of elements copied between two
/// strided tensors (`strided_copy`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Strided {
    pub rank: i32,
    pub dims: [i64; MAX_RANK],
    pub src_stride: [i64; MAX_RANK],
    pub dst_stride: [i64; MAX_RANK],
    pub src_offset: i64,
    pub dst_offset: i64,
}

impl Strided {
    /// A box of `dims` read at `src` strides from `src_offset` and written at `dst` strides
    /// from `dst_offset`; `None` past [`MAX_RANK`] dims or sizes that do not fit.
    pub fn new(
        dims: &[usize],
        (src, src_offset): (&[usize], usize),
        (dst, dst_offset): (&[usize], usize),
    ) -> Option<Strided> {
        if dims.len() > MAX_RANK || src.len() != dims.len() || dst.len() != dims.len() {
            return None;
        }
        let mut s = Strided {
            rank: i32::try_from(dims.len()).ok()?,
            src_offset: i64::try_from(src_offset).ok()?,
            dst_offset: i64::try_from(dst_offset).ok()?,
            ..Strided::default()
        };
        for d in 0..dims.len() {
            s.dims[d] = i64::try_from(dims[d]).ok()?;
            s.src_stride[d] = i64::try_from(src[d]).ok()?;
            s.dst_stride[d] = i64::try_from(dst[d]).ok()?;
        }
        Some(s)
    }
}

/// `struct Attention` of `common.cuh`, passed by value: the sizes and attributes of one
/// scaled dot-product attention (`attention_forward`, `attention_backward`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionShape {
    pub batch: i64,
    pub sq: i64,
    pub sk: i64,
    pub heads: i64,
    pub kv: i64,
    pub d: i64,
    pub dv: i64,
    pub scale: f64,
    /// 0: no soft cap.
    pub softcap: f64,
    /// The tensor-core kernels' q, k and v layouts ([`AttentionShape::packed`]): elements
    /// from one token's row to the next (0: dense), and the column each operand starts at.
    pub ld_q: i64,
    pub ld_k: i64,
    pub ld_v: i64,
    pub off_q: i64,
    pub off_k: i64,
    pub off_v: i64,
    pub causal: i32,
    /// 1: the gradients are written in the operands' (packed) layout, into one buffer
    /// (dq's; dk's and dv's in it where dv is null): no concatenation joins them afterwards.
    pub grads_packed: i32,
    /// A sliding window of this many keys (0: none).
    pub window: i64,
    /// Chunks of this many keys, each query seeing only its own chunk's (0: none).
    pub chunk: i64,
}

impl AttentionShape {
    /// The same attention reading q, k and v as column blocks of one buffer of rows
    /// `q + k + v` wide (a fused projection's output), in that order: as the tensor-core
    /// kernels take it (`attention_mma.cu`'s `mma_operand`), with no split copying them out.
    /// `None` unless every row and offset is a whole number of 16-byte words (8 bf16).
    pub fn packed(self) -> Option<AttentionShape> {
        let (q, k, v) = (self.heads * self.d, self.kv * self.d, self.kv * self.dv);
        let row = q + k + v;
        [q, k, v]
            .iter()
            .all(|w| w % 8 == 0)
            .then_some(AttentionShape {
                ld_q: row,
                ld_k: row,
                ld_v: row,
                off_q: 0,
                off_k: q,
                off_v: q + k,
                ..self
            })
    }
}

/// The widest head `attention.cu` handles (`PLAIT_MAX_HEAD_DIM`).
pub const MAX_HEAD_DIM: usize = 512;

/// Row-major (contiguous) strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1].saturating_mul(shape[d + 1]);
    }
    strides
}

/// Row-major strides of `operand` aligned on the right of `out`, 0 where it is broadcast.
fn aligned_strides(out: &[usize], operand: &[usize]) -> Option<[i64; MAX_RANK]> {
    let mut strides = [0i64; MAX_RANK];
    let lead = out.len() - operand.len();
    let mut step = 1usize;
    for (i, &n) in operand.iter().enumerate().rev() {
        let d = lead + i;
        if n == out[d] && n != 1 {
            strides[d] = i64::try_from(step).ok()?;
        } else if n != 1 {
            return None;
        }
        step = step.checked_mul(n)?;
    }
    Some(strides)
}

/// One kernel argument, for device memory of type `M` (a device allocation, or a host slice
/// under the emulator).
#[derive(Debug)]
pub enum KernelArg<'a, M: ?Sized> {
    /// A buffer the kernel writes (`float*`).
    Out(&'a mut M),
    /// A buffer the kernel only reads (`const float*`).
    In(&'a M),
    /// A null `float*` (an output the caller does not need).
    Null,
    /// `long long`: element counts and sizes.
    I64(i64),
    /// `int`: op codes and flags.
    I32(i32),
    /// `double`: attributes (eps, scales) and optimizer scalars.
    F64(f64),
    /// `Broadcast`, by value.
    Broadcast(Broadcast),
    /// `Strided`, by value.
    Strided(Strided),
    /// `Attention`, by value.
    Attention(AttentionShape),
}

impl<M: ?Sized> KernelArg<'_, M> {
    /// The argument's letter in a kernel signature (`p` float*, `c` const float*, `l` long
    /// long, `i` int, `d` double, `B` Broadcast, `S` Strided, `A` Attention); a null pointer takes the letter `want` asks
    /// for where that is a pointer.
    pub fn letter(&self, want: Option<char>) -> char {
        match self {
            KernelArg::Out(_) => 'p',
            KernelArg::In(_) => 'c',
            KernelArg::Null => want.filter(|c| matches!(c, 'p' | 'c')).unwrap_or('p'),
            KernelArg::I64(_) => 'l',
            KernelArg::I32(_) => 'i',
            KernelArg::F64(_) => 'd',
            KernelArg::Broadcast(_) => 'B',
            KernelArg::Strided(_) => 'S',
            KernelArg::Attention(_) => 'A',
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_bf16_segment_and_loads_in_flight_are_the_kernels() {
        for (define, file) in [
            (
                format!("#define BF16_SEGMENT {}", super::BF16_SEGMENT),
                "pointwise.cu",
            ),
            (format!("#define ILP {}", super::ILP), "common.cuh"),
        ] {
            assert!(super::CUDA_SOURCE.contains(&define), "{file}: {define}");
        }
    }

    use super::*;

    #[test]
    fn the_source_lists_every_file_of_the_folder() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .expect("kernels/cuda exists")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = CUDA_FILES.iter().map(|s| (*s).to_owned()).collect();
        listed.sort();
        assert_eq!(on_disk, listed);
        for f in CUDA_FILES {
            let text = std::fs::read_to_string(format!("{dir}/{f}")).expect("readable");
            assert!(CUDA_SOURCE.contains(&text), "{f} is not in CUDA_SOURCE");
        }
    }

    #[test]
    fn bf16_rounding_keeps_eight_significant_bits_to_nearest_even() {
        assert_eq!(round_bf16(1.0), 1.0);
        // 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷: ties go to the even neighbour, 1.
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        assert_eq!(round_bf16(-2.71), -2.703125);
        assert!(round_bf16(f32::NAN).is_nan());
        assert_eq!(round_bf16(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn kernel_names_come_from_the_declarations() {
        let names = kernel_names();
        assert!(names.contains(&"unary_forward") && names.contains(&"adamw_step"));
        assert_eq!(names.len(), CUDA_SOURCE.matches("__global__").count());
    }

    #[test]
    fn broadcast_strides_align_on_the_right() {
        let s = Broadcast::new(&[2, 3, 4], &[2, 3, 4], &[4]).expect("broadcastable");
        assert_eq!(s.rank, 3);
        assert_eq!(&s.dims[..3], &[2, 3, 4]);
        assert_eq!(&s.stride_a[..3], &[12, 4, 1]);
        assert_eq!(&s.stride_b[..3], &[0, 0, 1]);
        let t = Broadcast::new(&[2, 3, 4], &[2, 1, 4], &[3, 1]).expect("broadcastable");
        assert_eq!(&t.stride_a[..3], &[4, 0, 1]);
        assert_eq!(&t.stride_b[..3], &[0, 1, 0]);
        assert_eq!(Broadcast::new(&[2, 3], &[2, 2], &[3]), None, "2 vs 3");
        assert_eq!(Broadcast::new(&[1; 9], &[1], &[1]), None, "rank 9");
    }
}
