//! Row kernels: LayerNorm and RMSNorm (`norm.cu`), softmax (`softmax.cu`) and cross-entropy
//! (`loss.cu`), one block per row of the last axis.

use ir::OpKind;

use super::{Buf, Weighted, pointwise_grid, row_grid, size};
use crate::RuntimeError;
use crate::backend::device::{Device, DeviceBackend, GemmPrecision, KernelArg, bf16_gemm};

/// `(rows, h)` of a tensor over its last axis, if it has one and it is not empty.
fn rows_of(shape: &[usize]) -> Option<(usize, usize)> {
    let h = *shape.last()?;
    (h > 0).then(|| (shape.iter().product::<usize>() / h, h))
}

/// The normalized tensor and its parameters: `(x, gamma, beta)`, beta only for a LayerNorm
/// with a bias; `None` unless gamma (and beta) are `[h]`.
fn norm_operands<'a, D: Device>(
    kind: &OpKind,
    xs: &[&'a Buf<D>],
) -> Option<(Weighted<'a, D>, usize, usize)> {
    let (x, gamma, beta) = match (kind, xs) {
        (OpKind::LayerNorm { bias: true, .. }, &[x, gamma, beta]) => (x, gamma, Some(beta)),
        (OpKind::LayerNorm { bias: false, .. }, &[x, gamma]) => (x, gamma, None),
        (OpKind::RmsNorm { .. }, &[x, gamma]) => (x, gamma, None),
        _ => return None,
    };
    let (rows, h) = rows_of(&x.shape)?;
    let ok = |p: &Buf<D>| p.shape == [h];
    (ok(gamma) && beta.is_none_or(ok)).then_some(((x, gamma, beta), rows, h))
}

pub(super) fn norm_forward<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    eps: f64,
    xs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let Some(((x, ..), ..)) = norm_operands::<D>(kind, xs) else {
        return Ok(None);
    };
    let mut y = b.alloc(&x.shape)?;
    launch_norm_forward(b, kind, eps, xs, (&mut y.mem, false))?;
    Ok(Some(y))
}

/// [`norm_forward`] writing only the output's bf16 words ([`super::words`]; rows of even
/// width).
pub(super) fn norm_forward_words<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    eps: f64,
    xs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let Some(((x, ..), _, h)) = norm_operands::<D>(kind, xs) else {
        return Ok(None);
    };
    if !h.is_multiple_of(2) {
        return Ok(None);
    }
    super::words::words_only(b, &x.shape, |w| {
        launch_norm_forward(b, kind, eps, xs, (w, true))
    })
    .map(Some)
}

/// The forward kernel of a norm (warp or block, LayerNorm or RMSNorm), writing `y`: f32, or
/// only bf16 words (`true`: the `_words` kernels).
fn launch_norm_forward<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    eps: f64,
    xs: &[&Buf<D>],
    (y, words): (&mut D::Mem, bool),
) -> Result<(), RuntimeError> {
    let Some(((x, gamma, beta), rows, h)) = norm_operands::<D>(kind, xs) else {
        return Ok(());
    };
    let block = b.device.block_size();
    let (grid, warp) = norm_grid(block, rows, h);
    let layer_norm = matches!(kind, OpKind::LayerNorm { .. });
    let kernel = match (layer_norm, warp, words) {
        (true, true, false) => "layer_norm_forward_warp",
        (true, true, true) => "layer_norm_forward_warp_words",
        (true, false, false) => "layer_norm_forward",
        (true, false, true) => "layer_norm_forward_words",
        (false, true, false) => "rms_norm_forward_warp",
        (false, true, true) => "rms_norm_forward_warp_words",
        (false, false, false) => "rms_norm_forward",
        (false, false, true) => "rms_norm_forward_words",
    };
    let mut args = vec![
        KernelArg::Out(y),
        KernelArg::In(&x.mem),
        KernelArg::In(&gamma.mem),
    ];
    // The LayerNorm kernels take a beta, null where the norm has none.
    if layer_norm {
        args.push(beta.map_or(KernelArg::Null, |beta| KernelArg::In(&beta.mem)));
    }
    args.extend([size(rows), size(h), KernelArg::F64(eps)]);
    b.device.launch(kernel, grid, block, &mut args)
}

/// `norm.cu`'s NORM_WARP_COLS: the widest row its one-warp-per-row kernels take is 32 times it.
const NORM_WARP_COLS: usize = 32;

/// The blocks of a norm over `rows` rows of `h`, and whether the one-warp-per-row kernels
/// (`_warp`, `block / 32` rows a block) run it: rows up to 32 · NORM_WARP_COLS wide, on blocks
/// of whole warps; else one block per row.
fn norm_grid(block: u32, rows: usize, h: usize) -> (u32, bool) {
    let per_block = block as usize / 32;
    if block.is_multiple_of(32) && h <= 32 * NORM_WARP_COLS {
        (row_grid(rows.div_ceil(per_block)), true)
    } else {
        (row_grid(rows), false)
    }
}

/// Whether a norm's gradient (`of`, inputs of `shapes`: x, γ, β for LayerNorm, the output
/// gradient) runs on the device ([`norm_backward`]), which reads a stashed x's bf16 words as
/// they are (the `_bf16x` kernels), and the output gradient's where it is held so (`_bf16g`).
pub(super) fn grad_reads_words(of: &OpKind, shapes: &[&[usize]], operand: usize) -> bool {
    let (params, g) = match (of, shapes) {
        (OpKind::LayerNorm { bias: true, .. }, &[x, gamma, beta, g]) => {
            ([Some(gamma), Some(beta)], (x, g))
        }
        (OpKind::LayerNorm { bias: false, .. }, &[x, gamma, g]) => ([Some(gamma), None], (x, g)),
        (OpKind::RmsNorm { .. }, &[x, gamma, g]) => ([Some(gamma), None], (x, g)),
        _ => return false,
    };
    let (x, g) = g;
    let Some((_, h)) = rows_of(x) else {
        return false;
    };
    let x_or_g = operand == 0 || operand + 1 == shapes.len();
    x_or_g && x == g && params.iter().flatten().all(|p| *p == [h])
}

/// The norm backward kernels (LayerNorm, LayerNorm one warp a row, RMSNorm, RMSNorm one warp
/// a row), each reading x and the output gradient g in f32 or as their words: `[f32, x words,
/// g words, both]`.
const NORM_BACKWARD: [[&str; 4]; 4] = [
    [
        "layer_norm_backward",
        "layer_norm_backward_bf16x",
        "layer_norm_backward_bf16g",
        "layer_norm_backward_bf16xg",
    ],
    [
        "layer_norm_backward_warp",
        "layer_norm_backward_warp_bf16x",
        "layer_norm_backward_warp_bf16g",
        "layer_norm_backward_warp_bf16xg",
    ],
    [
        "rms_norm_backward",
        "rms_norm_backward_bf16x",
        "rms_norm_backward_bf16g",
        "rms_norm_backward_bf16xg",
    ],
    [
        "rms_norm_backward_warp",
        "rms_norm_backward_warp_bf16x",
        "rms_norm_backward_warp_bf16g",
        "rms_norm_backward_warp_bf16xg",
    ],
];

/// The norms' γ and β gradients' first pass, in [`NORM_BACKWARD`]'s variants.
const NORM_PARAM_GRADS: [&str; 4] = [
    "norm_param_grads",
    "norm_param_grads_bf16x",
    "norm_param_grads_bf16g",
    "norm_param_grads_bf16xg",
];

/// `[dx, dgamma]`, and `dbeta` after them for LayerNorm.
pub(super) fn norm_backward<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    eps: f64,
    xs: &[&Buf<D>],
    g: &Buf<D>,
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    let Some(((x, gamma, beta), rows, h)) = norm_operands::<D>(kind, xs) else {
        return Ok(None);
    };
    if g.shape != x.shape {
        return Ok(None);
    }
    let (mut dx, mut stats) = (b.alloc(&x.shape)?, b.alloc(&[rows, 2])?);
    let block = b.device.block_size();
    let (grid, warp) = norm_grid(block, rows, h);
    // Back from the stash, x's words are its values: the `_bf16x` kernels read them as they are;
    // so are g's where its GEMM wrote them (`_bf16g`, both: `_bf16xg`).
    let words = x.exact_bf16();
    let g_words = g.exact_bf16();
    let variant = usize::from(words.is_some()) + 2 * usize::from(g_words.is_some());
    let kernels = match (matches!(kind, OpKind::LayerNorm { .. }), warp) {
        (true, false) => NORM_BACKWARD[0],
        (true, true) => NORM_BACKWARD[1],
        (false, false) => NORM_BACKWARD[2],
        (false, true) => NORM_BACKWARD[3],
    };
    let kernel = kernels[variant];
    let xm = words.unwrap_or(&x.mem);
    let gm = g_words.unwrap_or(&g.mem);
    b.device.launch(
        kernel,
        grid,
        block,
        &mut [
            KernelArg::Out(&mut dx.mem),
            KernelArg::Out(&mut stats.mem),
            KernelArg::In(xm),
            KernelArg::In(&gamma.mem),
            KernelArg::In(gm),
            size(rows),
            size(h),
            KernelArg::F64(eps),
        ],
    )?;
    // Partial sums per chunk of rows, then over the chunks (`column_sum`).
    let chunks = super::column_chunks(rows);
    let mut dgamma = b.alloc(&[chunks, h])?;
    let mut dbeta = match beta {
        Some(_) => Some(b.alloc(&[chunks, h])?),
        None => None,
    };
    b.device.launch(
        NORM_PARAM_GRADS[variant],
        pointwise_grid(block, chunks * h),
        block,
        &mut [
            KernelArg::Out(&mut dgamma.mem),
            dbeta
                .as_mut()
                .map_or(KernelArg::Null, |d| KernelArg::Out(&mut d.mem)),
            KernelArg::In(xm),
            KernelArg::In(gm),
            KernelArg::In(&stats.mem),
            size(rows),
            size(h),
            size(super::COLUMN_CHUNK),
        ],
    )?;
    let dgamma = super::finish_columns(b, dgamma, chunks, h)?;
    let dbeta = dbeta
        .map(|d| super::finish_columns(b, d, chunks, h))
        .transpose()?;
    b.device.release(stats.mem);
    Ok(Some(
        [Some(dx), Some(dgamma), dbeta]
            .into_iter()
            .flatten()
            .collect(),
    ))
}

/// `(rows, sq, sk)` of a softmax operand: queries per causal block and keys per row.
fn softmax_dims(shape: &[usize], causal: bool) -> Option<(usize, usize, usize)> {
    let (rows, sk) = rows_of(shape)?;
    let sq = if causal {
        *shape.len().checked_sub(2).and_then(|i| shape.get(i))?
    } else {
        1
    };
    (sq > 0).then_some((rows, sq, sk))
}

pub(super) fn softmax_forward<D: Device>(
    b: &DeviceBackend<D>,
    causal: bool,
    xs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let &[x] = xs else { return Ok(None) };
    let Some((rows, sq, sk)) = softmax_dims(&x.shape, causal) else {
        return Ok(None);
    };
    let mut y = b.alloc(&x.shape)?;
    b.device.launch(
        "softmax_forward",
        row_grid(rows),
        b.device.block_size(),
        &mut [
            KernelArg::Out(&mut y.mem),
            KernelArg::In(&x.mem),
            size(rows),
            size(sq),
            size(sk),
            KernelArg::I32(i32::from(causal)),
        ],
    )?;
    Ok(Some(y))
}

pub(super) fn softmax_backward<D: Device>(
    b: &DeviceBackend<D>,
    causal: bool,
    xs: &[&Buf<D>],
    g: &Buf<D>,
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    let &[x] = xs else { return Ok(None) };
    let Some((rows, sq, sk)) = softmax_dims(&x.shape, causal) else {
        return Ok(None);
    };
    if g.shape != x.shape {
        return Ok(None);
    }
    let mut dx = b.alloc(&x.shape)?;
    b.device.launch(
        "softmax_backward",
        row_grid(rows),
        b.device.block_size(),
        &mut [
            KernelArg::Out(&mut dx.mem),
            KernelArg::In(&x.mem),
            KernelArg::In(&g.mem),
            size(rows),
            size(sq),
            size(sk),
            KernelArg::I32(i32::from(causal)),
        ],
    )?;
    Ok(Some(vec![dx]))
}

/// `(n, v)` of logits whose leading dims are the targets' shape, with at least one row.
fn loss_dims<D: Device>(logits: &Buf<D>, targets: &Buf<D>) -> Option<(usize, usize)> {
    let (n, v) = rows_of(&logits.shape)?;
    let lead = &logits.shape[..logits.shape.len() - 1];
    (n > 0 && lead == targets.shape.as_slice()).then_some((n, v))
}

/// Whether the cross-entropy (or its gradient: `kind` is `Grad` of it) on inputs of `shapes`
/// reads `operand` where it lies when held at a pitch: the logits (the kernels take their
/// row pitch).
pub(in crate::backend::device) fn reads_pitched(
    kind: &OpKind,
    shapes: &[&[usize]],
    operand: usize,
) -> bool {
    let of_loss = match kind {
        OpKind::CrossEntropy => shapes.len() == 2,
        OpKind::Grad { of, .. } => matches!(**of, OpKind::CrossEntropy) && shapes.len() == 3,
        _ => false,
    };
    of_loss && operand == 0 && shapes[0].len() >= 2
}

pub(super) fn cross_entropy_forward<D: Device>(
    b: &DeviceBackend<D>,
    xs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let &[logits, targets] = xs else {
        return Ok(None);
    };
    let Some((n, v)) = loss_dims::<D>(logits, targets) else {
        return Ok(None);
    };
    let block = b.device.block_size();
    let mut per_row = b.alloc(&[n])?;
    b.device.launch(
        "cross_entropy_rows",
        row_grid(n),
        block,
        &mut [
            KernelArg::Out(&mut per_row.mem),
            KernelArg::In(&logits.mem),
            KernelArg::In(&targets.mem),
            size(n),
            size(v),
            size(logits.pitch.unwrap_or(v)),
        ],
    )?;
    let mut loss = b.alloc(&[])?;
    b.device.launch(
        "mean_all",
        1,
        block,
        &mut [
            KernelArg::Out(&mut loss.mem),
            KernelArg::In(&per_row.mem),
            size(n),
        ],
    )?;
    b.device.release(per_row.mem);
    Ok(Some(loss))
}

pub(super) fn cross_entropy_backward<D: Device>(
    b: &DeviceBackend<D>,
    xs: &[&Buf<D>],
    g: &Buf<D>,
) -> Result<Option<Buf<D>>, RuntimeError> {
    let &[logits, targets] = xs else {
        return Ok(None);
    };
    let Some((n, v)) = loss_dims::<D>(logits, targets) else {
        return Ok(None);
    };
    if !g.shape.is_empty() {
        return Ok(None);
    }
    let mut dl = b.alloc(&logits.shape)?;
    b.device.launch(
        "cross_entropy_backward",
        row_grid(n),
        b.device.block_size(),
        &mut [
            KernelArg::Out(&mut dl.mem),
            KernelArg::In(&logits.mem),
            KernelArg::In(&targets.mem),
            KernelArg::In(&g.mem),
            size(n),
            size(v),
            size(logits.pitch.unwrap_or(v)),
        ],
    )?;
    Ok(Some(dl))
}

/// The cross-entropy's gradient made as the bf16 operand the LM head's backward GEMM reads
/// (`to_bf16`'s copy: rows padded to a multiple of 8 columns with zeros,
/// [`bf16_gemm::copy_layout`]) and nothing else: held at that pitch as words alone
/// ([`DeviceBackend::alloc_operand`]), each value the f32 gradient rounded once to nearest
/// even, as `to_bf16` would round it. `None` outside a bf16 plan (no GEMM reads bf16) or
/// where the shapes are not the loss's.
pub(in crate::backend::device) fn cross_entropy_backward_operand<D: Device>(
    b: &DeviceBackend<D>,
    xs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let &[logits, targets, g] = xs else {
        return Ok(None);
    };
    let Some((n, v)) = loss_dims::<D>(logits, targets) else {
        return Ok(None);
    };
    if !g.shape.is_empty() || b.gemm_precision != GemmPrecision::Bf16 || logits.f32_lazy {
        return Ok(None);
    }
    let (op, _) = bf16_gemm::copy_layout(1, (n, v), n * v);
    let mut dl = b.alloc_operand(&logits.shape, op.pitch)?;
    let words = dl
        .bf16
        .get_mut()
        .ok_or_else(|| RuntimeError::DeviceLaunch {
            kernel: "cross_entropy_backward_words",
            message: "an operand-form buffer without its words".into(),
        })?;
    b.device.launch(
        "cross_entropy_backward_words",
        row_grid(n),
        b.device.block_size(),
        &mut [
            KernelArg::Out(words),
            KernelArg::In(&logits.mem),
            KernelArg::In(&targets.mem),
            KernelArg::In(&g.mem),
            size(n),
            size(v),
            size(logits.pitch.unwrap_or(v)),
            size(op.pitch),
        ],
    )?;
    Ok(Some(dl))
}

/// `ReduceSum` (`mean` false) or `ReduceMean` of `x` over its last axis, kept with size 1.
pub(super) fn reduce_forward<D: Device>(
    b: &DeviceBackend<D>,
    mean: bool,
    xs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let &[x] = xs else { return Ok(None) };
    let Some((rows, n)) = rows_of(&x.shape) else {
        return Ok(None);
    };
    let mut shape = x.shape.clone();
    if let Some(last) = shape.last_mut() {
        *last = 1;
    }
    let mut y = b.alloc(&shape)?;
    b.device.launch(
        "row_reduce",
        row_grid(rows),
        b.device.block_size(),
        &mut [
            KernelArg::Out(&mut y.mem),
            KernelArg::In(&x.mem),
            size(rows),
            size(n),
            KernelArg::F64(if mean { n as f64 } else { 1.0 }),
        ],
    )?;
    Ok(Some(y))
}

/// The reduction's gradient: each row's output gradient (÷ n for the mean) over the row.
pub(super) fn reduce_backward<D: Device>(
    b: &DeviceBackend<D>,
    mean: bool,
    xs: &[&Buf<D>],
    g: &Buf<D>,
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    let &[x] = xs else { return Ok(None) };
    let Some((rows, n)) = rows_of(&x.shape) else {
        return Ok(None);
    };
    if g.len != rows {
        return Ok(None);
    }
    let mut dx = b.alloc(&x.shape)?;
    let block = b.device.block_size();
    b.device.launch(
        "row_spread",
        pointwise_grid(block, x.len),
        block,
        &mut [
            KernelArg::Out(&mut dx.mem),
            KernelArg::In(&g.mem),
            size(rows),
            size(n),
            KernelArg::F64(if mean { n as f64 } else { 1.0 }),
        ],
    )?;
    Ok(Some(vec![dx]))
}

#[cfg(test)]
mod tests {
    use super::NORM_WARP_COLS;

    #[test]
    fn the_warp_row_width_is_norm_cus() {
        let define = format!("#define NORM_WARP_COLS {NORM_WARP_COLS}");
        assert!(kernels::device::CUDA_SOURCE.contains(&define), "{define}");
    }
}
