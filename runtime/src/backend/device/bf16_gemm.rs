//! How a bf16 GEMM lays out what it multiplies: its operands' bf16 copies (`to_bf16`, rows
//! padded to 16 bytes), the extents cuBLAS multiplies over, and the padded output it writes
//! first where the output's rows are not whole 16-byte words. `cuda_ops.rs` runs GEMMs so on
//! cuBLAS; [`temporaries`] sizes the device memory that takes, which the dry device
//! (`backend::dry`) counts without a GPU.

use super::{Gemm, GemmPrecision};

/// How a GEMM operand of `mats` row-major `[rows, cols]` matrices, the m-th at `m · stride`,
/// is copied to bf16: each row padded to `pitch` elements.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the kernel's arguments, on a GPU
pub(crate) struct Bf16Operand {
    pub mats: usize,
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
    pub pitch: usize,
}

impl Bf16Operand {
    /// The copy's 32-bit words (two bf16 each).
    pub fn words(&self) -> usize {
        self.mats * self.rows * self.pitch / 2
    }
}

/// An operand's leading dimension and batch stride, in elements.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // cuBLAS's arguments, on a GPU
pub(crate) struct Layout {
    pub ld: usize,
    pub stride: usize,
}

/// The bf16 copy of an operand of `batch` `[rows, cols]` matrices at `stride`: padded rows
/// where the matrices are dense (stride `rows · cols`) or one matrix serves all (stride 0);
/// else its own layout, unpadded.
pub(crate) fn copy_layout(
    batch: usize,
    (rows, cols): (usize, usize),
    stride: usize,
) -> (Bf16Operand, Layout) {
    let dense = stride == rows * cols || batch == 1;
    if stride == 0 || dense {
        let pitch = cols.next_multiple_of(8);
        let mats = if stride == 0 { 1 } else { batch };
        let stride_out = if stride == 0 { 0 } else { rows * pitch };
        let op = Bf16Operand {
            mats,
            rows,
            cols,
            stride: rows * cols,
            pitch,
        };
        (
            op,
            Layout {
                ld: pitch,
                stride: stride_out,
            },
        )
    } else {
        let span = (batch - 1) * stride + rows * cols;
        let op = Bf16Operand {
            mats: 1,
            rows: 1,
            cols: span,
            stride: 0,
            pitch: span.next_multiple_of(2),
        };
        (op, Layout { ld: cols, stride })
    }
}

/// The layout of an operand given already as `Device::bf16_operand`'s copy of one matrix.
pub(crate) fn given_layout((rows, cols): (usize, usize)) -> Layout {
    let pitch = cols.next_multiple_of(8);
    Layout {
        ld: pitch,
        stride: rows * pitch,
    }
}

/// The stored `[rows, cols]` of `g`'s operands `a` and `b` (row-major: op(a) is `[m, k]`, so
/// `a` is `[k, m]` when transposed).
pub(crate) fn operand_dims(g: &Gemm) -> [(usize, usize); 2] {
    [
        if g.trans_a { (g.k, g.m) } else { (g.m, g.k) },
        if g.trans_b { (g.n, g.k) } else { (g.k, g.n) },
    ]
}

/// The `n` and `k` cuBLAS multiplies bf16 copies laid out as `[a, b]` over: where the copies'
/// rows hold a dim padded with zeros (`to_bf16`'s pitch), that padded extent, so that every
/// dim of the product is a multiple of 8. On an H200, GPT-2's LM-head products over a
/// 50257-word vocabulary ran at about a fifth of the per-layer GEMMs' rate with the odd dims,
/// and the padding only adds zero products. `n` pads when `b` stores it as columns (not
/// transposed); `k` when both operands store it as columns (`a` plain, `b` transposed) at the
/// same pitch.
pub(crate) fn product_dims(g: &Gemm, [a, b]: [Layout; 2]) -> (usize, usize) {
    let n = if g.trans_b { g.n } else { b.ld.max(g.n) };
    let k = if !g.trans_a && g.trans_b && a.ld == b.ld {
        a.ld.max(g.k)
    } else {
        g.k
    };
    (n, k)
}

/// The row pitch a bf16 GEMM writes its output at, when not the output's own: cuBLAS computes
/// `n_gemm ≥ n` columns, or the rows are not a whole number of 16-byte words (cuBLAS's Hopper
/// kernels move tiles of 16-byte aligned rows). `unpad_rows` then copies the first `n`
/// columns to the dense output.
pub(crate) fn padded_pitch(g: &Gemm, n_gemm: usize) -> Option<usize> {
    if g.c_pitch != 0 {
        // Written at `c`'s own pitch: nothing to copy out.
        return None;
    }
    let dense = g.batch == 1 || g.stride_c == g.m * g.n;
    let aligned = n_gemm == g.n && g.n.is_multiple_of(4);
    (g.precision == GemmPrecision::Bf16 && !aligned && dense).then(|| n_gemm.next_multiple_of(4))
}

/// Output chunks of a padded product stay under this (256 MiB): a bound on the extra memory
/// the padding costs, at GEMMs still large enough to run at full rate.
pub(crate) const PADDED_CHUNK_BYTES: usize = 256 << 20;

/// Rows of the padded output computed at a time: one batch entry's rows in chunks when the
/// padded output would be large (an LM head's logits: 8192 × 50264 f32 is 1.6 GB), so that
/// the scratch stays under [`PADDED_CHUNK_BYTES`]; all rows of a batched product.
pub(crate) fn padded_chunk(g: &Gemm, pitch: usize) -> usize {
    if g.batch == 1 {
        (PADDED_CHUNK_BYTES / (4 * pitch)).clamp(1, g.m)
    } else {
        g.m
    }
}

/// The device temporaries a GEMM takes, as f32 elements each, in the order it takes them (all
/// held until it ends): for a bf16 product, the copies of the operands not given already
/// converted, then the padded output's scratch where there is one; nothing for f32.
pub fn temporaries(g: &Gemm) -> Vec<usize> {
    if g.precision != GemmPrecision::Bf16 || g.m == 0 || g.n == 0 || g.k == 0 || g.batch == 0 {
        return Vec::new();
    }
    let strides = [g.stride_a, g.stride_b];
    let mut taken = Vec::new();
    for (i, dims) in operand_dims(g).into_iter().enumerate() {
        if !g.given_bf16[i] {
            taken.push(copy_layout(g.batch, dims, strides[i]).0.words());
        }
    }
    if let Some(pitch) = padded_output(g) {
        taken.push(g.batch * padded_chunk(g, pitch) * pitch);
    }
    taken
}

/// The padded pitch `g`'s product is written at ([`padded_pitch`]), given its operands'
/// layouts: `None` where cuBLAS writes it to `c` as it is (or at `c`'s own pitch).
pub fn padded_output(g: &Gemm) -> Option<usize> {
    if g.precision != GemmPrecision::Bf16 || g.m == 0 || g.n == 0 || g.k == 0 || g.batch == 0 {
        return None;
    }
    let strides = [g.stride_a, g.stride_b];
    let mut layouts = [Layout { ld: 0, stride: 0 }; 2];
    for (i, dims) in operand_dims(g).into_iter().enumerate() {
        layouts[i] = if g.given_bf16[i] {
            given_layout(dims)
        } else {
            copy_layout(g.batch, dims, strides[i]).1
        };
    }
    padded_pitch(g, product_dims(g, layouts).0)
}

/// The launches `g` takes on a GPU, each with the bytes of the buffers it is handed
/// ([`super::super::launches`]): for a bf16 product the `to_bf16` copy of each operand not
/// given converted (f32 read, words written), then cuBLAS's product (operands as it reads
/// them, its output as written), then `unpad_rows` per chunk of a padded output. The dry
/// device counts them (`backend::dry`).
pub fn launches(g: &Gemm) -> Vec<(&'static str, u64)> {
    if g.m == 0 || g.n == 0 || g.k == 0 || g.batch == 0 {
        return Vec::new();
    }
    let [a_dims, b_dims] = operand_dims(g);
    let elems = |(r, c): (usize, usize), stride: usize| {
        if stride == 0 { r * c } else { g.batch * r * c }
    };
    let sizes = [elems(a_dims, g.stride_a), elems(b_dims, g.stride_b)];
    let out = (g.batch * g.m * g.n) as u64;
    if g.precision != GemmPrecision::Bf16 {
        return vec![(CUBLAS, 4 * (sizes[0] + sizes[1]) as u64 + 4 * out)];
    }
    let mut v = Vec::new();
    let mut layouts = [Layout { ld: 0, stride: 0 }; 2];
    for (i, (dims, stride)) in [(a_dims, g.stride_a), (b_dims, g.stride_b)]
        .into_iter()
        .enumerate()
    {
        layouts[i] = if g.given_bf16[i] {
            given_layout(dims)
        } else {
            let (op, layout) = copy_layout(g.batch, dims, stride);
            v.push((
                "to_bf16",
                4 * (op.mats * op.rows * op.cols + op.words()) as u64,
            ));
            layout
        };
    }
    let (n, _) = product_dims(g, layouts);
    let Some(pitch) = padded_pitch(g, n) else {
        let written = if g.c_pitch != 0 {
            4 * (g.batch * g.m * g.c_pitch) as u64
        } else if g.c_words {
            2 * out
        } else {
            4 * out
        };
        let name = if g.c_words { CUBLAS_WORDS } else { CUBLAS };
        // An accumulating product reads its output before writing it.
        let written = if g.accumulate { 2 * written } else { written };
        v.push((name, 2 * (sizes[0] + sizes[1]) as u64 + written));
        return v;
    };
    // One product and one unpad per chunk of rows: each reads its rows of `a` and all of `b`.
    let chunk = padded_chunk(g, pitch);
    for row0 in (0..g.m).step_by(chunk) {
        let rows = chunk.min(g.m - row0);
        let a_rows = (2 * sizes[0] * rows / g.m) as u64;
        let written = (g.batch * rows) as u64;
        v.push((
            CUBLAS,
            a_rows + 2 * sizes[1] as u64 + 4 * written * pitch as u64,
        ));
        v.push(("unpad_rows", 4 * written * (pitch + g.n) as u64));
    }
    v
}

/// Whether `g`'s product can be written as bf16 words ([`Gemm::c_words`]): a bf16 product
/// whose output rows cuBLAS writes where they lie, densely (no padded pitch to copy out of),
/// each a whole number of 16-byte words (`n` a multiple of 8).
pub fn writes_words(g: &Gemm) -> bool {
    let dense = g.batch == 1 || g.stride_c == g.m * g.n;
    g.precision == GemmPrecision::Bf16
        && g.c_pitch == 0
        && dense
        && g.n.is_multiple_of(8)
        && padded_output(g).is_none()
}

/// The name [`launches`] counts cuBLAS's products under.
pub const CUBLAS: &str = "gemm (cuBLAS)";

/// The name [`launches`] counts cuBLAS's products that write bf16 words under
/// ([`Gemm::c_words`]).
pub const CUBLAS_WORDS: &str = "gemm (cuBLAS, bf16 out)";

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16(g: Gemm) -> Gemm {
        Gemm {
            precision: GemmPrecision::Bf16,
            ..g
        }
    }

    #[test]
    fn an_lm_head_takes_padded_copies_and_a_chunked_scratch() {
        // GPT-2's logits: [8192, 768] · [768, 50257]ᵀ (the tied embedding, transposed).
        let g = bf16(Gemm {
            trans_b: true,
            ..Gemm::plain(8192, 768, 50257)
        });
        let pitch = 50257usize.next_multiple_of(4);
        let rows = (256usize << 20) / (4 * pitch);
        assert_eq!(
            temporaries(&g),
            vec![8192 * 768 / 2, 50257 * 768 / 2, rows * pitch]
        );
    }

    #[test]
    fn aligned_products_take_only_their_copies_and_given_ones_nothing() {
        let g = bf16(Gemm::plain(64, 96, 128));
        assert_eq!(temporaries(&g), vec![64 * 96 / 2, 96 * 128 / 2]);
        let given = Gemm {
            given_bf16: [true, true],
            ..g
        };
        assert!(temporaries(&given).is_empty());
        assert!(temporaries(&Gemm::plain(64, 96, 128)).is_empty(), "f32");
    }

    #[test]
    fn a_gemm_launches_one_copy_per_operand_not_given_and_unpads_each_chunk() {
        let g = bf16(Gemm::plain(64, 96, 128));
        let names = |g: &Gemm| launches(g).iter().map(|l| l.0).collect::<Vec<_>>();
        assert_eq!(names(&g), ["to_bf16", "to_bf16", CUBLAS]);
        // The first copy reads 64 × 96 f32 and writes half as many words.
        assert_eq!(launches(&g)[0].1, 4 * (64 * 96 + 64 * 96 / 2));
        let given = Gemm {
            given_bf16: [true, false],
            ..g
        };
        assert_eq!(names(&given), ["to_bf16", CUBLAS]);
        // The LM head: rows chunked under 256 MiB of padded output, one unpad per chunk.
        let head = bf16(Gemm {
            trans_b: true,
            ..Gemm::plain(8192, 768, 50257)
        });
        let pitch = 50257usize.next_multiple_of(4);
        let chunks = 8192usize.div_ceil(padded_chunk(&head, pitch));
        let count = |name: &str| names(&head).iter().filter(|n| **n == name).count();
        assert_eq!((count("unpad_rows"), count(CUBLAS)), (chunks, chunks));
        assert!(chunks > 1);
        assert_eq!(names(&Gemm::plain(4, 4, 4)), [CUBLAS], "f32: no copies");
    }
}
