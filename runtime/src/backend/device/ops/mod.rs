//! plait's ops as device launches: which kernel, on what grid, with which operands. Every
//! lowering checks its operands' shapes first and returns `None` for anything it does not
//! handle exactly, so the host path (which also reports malformed operands) takes it: a kernel
//! is never launched on shapes it could read past.

mod attention;
mod context;
mod layout;
mod matmul;
mod moe;
mod optim;
mod pointwise;
mod rotary;
mod rows;
mod table;
mod vocab;
mod words;

use ir::{Binding, OpKind};

use super::{Device, DeviceBackend, DeviceBuffer, KernelArg};
use crate::RuntimeError;

pub(super) use attention::{
    backward_kept as attention_backward_kept,
    backward_kept_packed as attention_backward_kept_packed,
    forward_keeping as attention_forward_keeping,
    forward_keeping_packed as attention_forward_keeping_packed,
    reads_packed as attention_reads_packed,
};
pub(super) use context::run as context_op;
pub(super) use optim::{adamw, adamw_copy};
pub(super) use pointwise::forward_biased;
pub(super) use pointwise::forward_twin as forward_with_twin;
pub(super) use vocab::{
    loss_grad_operand as vocab_loss_grad_operand, reads_pitched as vocab_reads_pitched,
    run as vocab_shard,
};
pub(super) use words::forward as forward_words;

/// Whether op `kind` on inputs of `shapes` reads input `operand` only as the bf16 words a
/// stash holds ([`crate::Backend::reads_stashed_words`]), or not at all: a bf16 product's
/// operand (`matmul`), a unary function's input in its gradient (`pointwise`), an embedding
/// table in its gradient (`table`: only its shape), attention's q, k and v on the tensor
/// cores (`attention`: its kernels read the words), a norm's input in its gradient (`rows`).
pub(super) fn reads_stashed_words<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    shapes: &[&[usize]],
    operand: usize,
) -> bool {
    if matmul::reads_only_bf16_twin(b, kind, shapes, operand) {
        return true;
    }
    match kind {
        OpKind::Attention { .. } => attention::reads_words_only(b, kind, shapes, false, operand),
        OpKind::Grad { of, .. } if matches!(**of, OpKind::Attention { .. }) => {
            attention::reads_words_only(b, of, shapes, true, operand)
        }
        OpKind::Grad { of, .. }
            if matches!(**of, OpKind::LayerNorm { .. } | OpKind::RmsNorm { .. }) =>
        {
            rows::grad_reads_words(of, shapes, operand)
        }
        OpKind::Grad { of, wrt } if matches!(**of, OpKind::Embedding) => {
            operand == 0 && wrt == &[0] && table::grad_reads_no_table(shapes)
        }
        OpKind::Grad { of, wrt } => pointwise::grad_reads_words(of, wrt, shapes, operand),
        OpKind::Split { .. } => words::split_reads_words(kind, shapes, operand),
        OpKind::Concat { .. } => words::concat_reads_words(kind, shapes),
        _ => pointwise::reads_words(kind, shapes, operand),
    }
}

/// `x` with inverted dropout `mask` applied (`dropout` in `pointwise.cu`).
pub(super) fn dropout<D: Device>(
    b: &DeviceBackend<D>,
    x: &Buf<D>,
    mask: &crate::backend::DropoutMask,
) -> Result<Buf<D>, RuntimeError> {
    let mut y = b.alloc(&x.shape)?;
    let block = b.device.block_size();
    // The kernel reads `shard_s` 0 as "not sharded"; a sharded mask's local length is at least
    // 1, as `DropoutMask::global_index` takes it.
    let (shard_s, shard_off) = mask.shard.map_or((0, 0), |(s, off)| (s.max(1), off));
    b.device.launch(
        "dropout",
        pointwise_grid(block, x.len),
        block,
        &mut [
            KernelArg::Out(&mut y.mem),
            KernelArg::In(&x.mem),
            size(x.len),
            size(mask.per_row),
            size(mask.row),
            size(mask.seq),
            size(shard_s),
            size(shard_off),
            // The seed's bits, reinterpreted by the kernel as unsigned.
            KernelArg::I64(mask.seed as i64),
            KernelArg::F64(mask.p),
        ],
    )?;
    Ok(y)
}

/// Sets element i of `y` to i.
pub(super) fn iota<D: Device>(b: &DeviceBackend<D>, y: &mut Buf<D>) -> Result<(), RuntimeError> {
    let block = b.device.block_size();
    b.device.launch(
        "iota",
        pointwise_grid(block, y.len),
        block,
        &mut [KernelArg::Out(&mut y.mem), size(y.len)],
    )
}

/// Sets every element of `y` to `value`.
pub(super) fn fill<D: Device>(
    b: &DeviceBackend<D>,
    y: &mut Buf<D>,
    value: f32,
) -> Result<(), RuntimeError> {
    let block = b.device.block_size();
    b.device.launch(
        "fill",
        pointwise_grid(block, y.len),
        block,
        &mut [
            KernelArg::Out(&mut y.mem),
            size(y.len),
            KernelArg::F64(f64::from(value)),
        ],
    )
}

type Buf<D> = DeviceBuffer<<D as Device>::Mem>;

/// `x` as bf16 words (`to_bf16` over one row of `len` elements): [`crate::Backend::stash_bf16`].
pub(super) fn stash_bf16<D: Device>(
    b: &DeviceBackend<D>,
    x: &Buf<D>,
) -> Result<Buf<D>, RuntimeError> {
    let words = x.len.div_ceil(2);
    let mut y = b.alloc(&[words])?;
    if x.len > 0 {
        let block = b.device.block_size();
        b.device.launch(
            "to_bf16",
            kernels::device::to_bf16_grid(1, 1, 2 * words),
            block,
            &mut [
                KernelArg::Out(&mut y.mem),
                KernelArg::In(&x.mem),
                size(1),
                size(1),
                size(x.len),
                size(0),
                size(2 * words),
            ],
        )?;
    }
    Ok(y)
}

/// [`stash_bf16`]'s words back as f32 of `shape` (`from_bf16`).
pub(super) fn unstash_bf16<D: Device>(
    b: &DeviceBackend<D>,
    words: &Buf<D>,
    shape: &[usize],
) -> Result<Buf<D>, RuntimeError> {
    let mut y = b.alloc(shape)?;
    check_words(y.len, words)?;
    from_bf16(b, &words.mem, &mut y)?;
    Ok(y)
}

/// That `words` are the ⌈len / 2⌉ words of a stash of a buffer of `len` elements.
pub(super) fn check_words<M>(len: usize, words: &DeviceBuffer<M>) -> Result<(), RuntimeError> {
    if len.div_ceil(2) != words.len {
        return Err(RuntimeError::BadLength {
            op: "unstash_bf16",
            what: "bf16 words",
            got: words.len,
            want: len.div_ceil(2),
        });
    }
    Ok(())
}

/// `y`'s f32 values from `words`, its stash (`from_bf16`).
fn from_bf16<D: Device>(
    b: &DeviceBackend<D>,
    words: &D::Mem,
    y: &mut Buf<D>,
) -> Result<(), RuntimeError> {
    if y.len == 0 {
        return Ok(());
    }
    let block = b.device.block_size();
    b.device.launch(
        "from_bf16",
        stream_grid(block, y.len.div_ceil(2)),
        block,
        &mut [
            KernelArg::Out(&mut y.mem),
            KernelArg::In(words),
            size(y.len),
        ],
    )
}

/// A new f32 buffer of `x`'s values from its exact words (`x` held as words alone, which
/// stays so).
pub(super) fn expanded_copy<D: Device>(
    b: &DeviceBackend<D>,
    x: &Buf<D>,
) -> Result<Buf<D>, RuntimeError> {
    let Some(words) = x.exact_bf16() else {
        return Err(RuntimeError::DeviceLaunch {
            kernel: "from_bf16",
            message: "an operand held as words alone has no exact bf16 words".into(),
        });
    };
    let mut y = b.alloc(&x.shape)?;
    from_bf16(b, words, &mut y)?;
    Ok(y)
}

/// An output buffer of `shape` for a kernel (or a GEMM) to write whole: f32, or with `as_words`
/// its bf16 words alone ([`DeviceBackend::words_only`]), written through [`written`].
pub(super) fn output_buffer<D: Device>(
    b: &DeviceBackend<D>,
    shape: &[usize],
    as_words: bool,
) -> Result<Buf<D>, RuntimeError> {
    if !as_words {
        return b.alloc(shape);
    }
    let len: usize = shape.iter().product();
    let words = b.device.alloc(len.div_ceil(2).max(1))?;
    b.words_only(shape, words)
}

/// Where a kernel writes `x`: its words where it is held as words alone, else its f32 values.
pub(super) fn written<D: Device>(x: &mut Buf<D>) -> &mut D::Mem {
    match (x.f32_lazy, x.bf16.get_mut()) {
        (true, Some(words)) => words,
        _ => &mut x.mem,
    }
}

/// `x`'s f32 values from its twin ([`crate::Backend::expand_stashed`]).
pub(super) fn expand_twin<D: Device>(
    b: &DeviceBackend<D>,
    x: &mut Buf<D>,
) -> Result<(), RuntimeError> {
    let Some(twin) = x.bf16.take() else {
        return Err(RuntimeError::DeviceLaunch {
            kernel: "from_bf16",
            message: "expand_stashed: the buffer has no bf16 words to expand".into(),
        });
    };
    let expanded = b.ensure_f32(x).and_then(|()| from_bf16(b, &twin, x));
    if let Err(twin) = x.bf16.set(twin) {
        b.device.release(twin);
    }
    expanded
}

/// `kind`'s result held at a pitch ([`DeviceBuffer::pitch`]): a bias-free bf16 product's at
/// the padded pitch its GEMM writes, or the cross-entropy's gradient as the bf16 operand the
/// LM head's backward GEMM reads ([`rows::cross_entropy_backward_operand`]). `None`: not
/// here.
pub(super) fn forward_pitched<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    inputs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    match kind {
        OpKind::Grad { of, wrt } if matches!(**of, OpKind::CrossEntropy) && wrt == &[0] => {
            rows::cross_entropy_backward_operand(b, inputs)
        }
        _ => matmul::forward_pitched(b, kind, inputs),
    }
}

/// Whether `kind` on inputs of `shapes` reads `operand` where it lies when held at a pitch
/// ([`forward_pitched`]'s results): the cross-entropy's logits, and a bias-free product's
/// output gradient that its bf16 GEMMs read as their operand.
pub(super) fn reads_pitched<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    shapes: &[&[usize]],
    operand: usize,
) -> bool {
    rows::reads_pitched(kind, shapes, operand)
        || matmul::reads_operand_form(b.gemm_precision, kind, shapes, operand)
}

/// An operand with its weight and optional bias (a linear's, a norm's γ and β).
type Weighted<'a, D> = (&'a Buf<D>, &'a Buf<D>, Option<&'a Buf<D>>);

/// The forward results of `kind` on the device, or `None` for the host path.
pub(super) fn forward<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    inputs: &[&Buf<D>],
    binding: Binding,
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    let one = |r: Option<Buf<D>>| r.map(|x| vec![x]);
    Ok(match kind {
        OpKind::MatMul | OpKind::Linear { .. } => one(matmul::forward(b, kind, inputs)?),
        OpKind::LayerNorm { eps, .. } | OpKind::RmsNorm { eps } => {
            one(rows::norm_forward(b, kind, *eps, inputs)?)
        }
        OpKind::Softmax { causal } => one(rows::softmax_forward(b, *causal, inputs)?),
        OpKind::CrossEntropy => one(rows::cross_entropy_forward(b, inputs)?),
        OpKind::ReduceSum | OpKind::ReduceMean => one(rows::reduce_forward(
            b,
            matches!(kind, OpKind::ReduceMean),
            inputs,
        )?),
        OpKind::Attention { .. } => one(attention::forward(b, kind, inputs)?),
        OpKind::Rotary { .. } => match inputs {
            &[x] => one(rotary::rotate(b, kind, x, 1.0, None)?),
            _ => None,
        },
        OpKind::Embedding => one(table::embedding_forward(b, inputs)?),
        OpKind::Reshape { .. } => match (kernels::device::shape_attribute(kind, binding), inputs) {
            (Some(shape), &[x]) => one(copy_as(b, x, shape)?),
            _ => None,
        },
        OpKind::Expand { .. } => match (kernels::device::shape_attribute(kind, binding), inputs) {
            (Some(shape), &[x]) => one(layout::expand(b, x, &shape)?),
            _ => None,
        },
        OpKind::Transpose { perm } => match inputs {
            &[x] => one(layout::transpose(b, x, perm)?),
            _ => None,
        },
        OpKind::Split { axis, sizes } => match (inputs, usizes(sizes)) {
            (&[x], _) if x.f32_lazy => words::split_expanded(b, x, *axis, sizes)?,
            (&[x], Some(sizes)) => layout::split(b, x, *axis, &sizes)?,
            _ => None,
        },
        OpKind::Concat { axis } if inputs.iter().any(|p| p.f32_lazy) => {
            one(words::concat_expanded(b, *axis, inputs)?)
        }
        OpKind::Concat { axis } => one(layout::concat(b, inputs, *axis)?),
        OpKind::Slice { axis, start, end } => match (inputs, usizes(&[*start, *end])) {
            (&[x], Some(se)) if se[0] <= se[1] => {
                one(layout::slice(b, x, *axis, se[0], se[1] - se[0])?)
            }
            _ => None,
        },
        OpKind::TopKRouter {
            experts,
            k,
            routing,
            ..
        } => one(moe::router_forward(b, (*experts, *k, routing), inputs)?),
        OpKind::MoeExperts { experts, form } => {
            one(moe::experts_forward(b, (*experts, *form), inputs)?)
        }
        OpKind::Grad { of, wrt } => grad(b, of, wrt, inputs)?,
        _ => one(pointwise::forward(b, kind, inputs)?),
    })
}

/// `Grad{of, wrt}`: the forward operands then one output gradient per result in, the
/// gradients of the operands in `wrt` out (`kernels::backward::grad`'s semantics).
fn grad<D: Device>(
    b: &DeviceBackend<D>,
    of: &OpKind,
    wrt: &[usize],
    inputs: &[&Buf<D>],
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    let Some(n) = inputs.len().checked_sub(of.result_count()) else {
        return Ok(None);
    };
    let (xs, dys) = inputs.split_at(n);
    if let (OpKind::Split { axis, .. }, &[x], [0]) = (of, xs, wrt) {
        return Ok(split_backward(b, *axis, x, dys)?.map(|d| vec![d]));
    }
    let &[g] = dys else { return Ok(None) };
    let wanted: Vec<bool> = (0..n).map(|i| wrt.contains(&i)).collect();
    let Some(all) = backward_of(b, of, xs, g, &wanted)? else {
        return Ok(None);
    };
    Ok(picked(b, all, wrt))
}

/// The gradients `wrt` lists, in its order, out of every operand's (`all`); the others are
/// given back. `None` (all given back) where one listed is missing: the host path names it.
fn picked<D: Device>(
    b: &DeviceBackend<D>,
    mut all: Vec<Option<Buf<D>>>,
    wrt: &[usize],
) -> Option<Vec<Buf<D>>> {
    let mut picked = Vec::with_capacity(wrt.len());
    for &i in wrt {
        match all.get_mut(i).and_then(Option::take) {
            Some(d) => picked.push(d),
            None => {
                // No gradient for a listed operand: the host path names the error.
                all.into_iter()
                    .flatten()
                    .chain(picked)
                    .for_each(|d| crate::Backend::free(b, d));
                return None;
            }
        }
    }
    all.into_iter()
        .flatten()
        .for_each(|d| crate::Backend::free(b, d));
    Some(picked)
}

/// `kind`'s results, each that `as_words` marks made as bf16 words alone where the device can
/// (with whether it was), the rest as usual: a linear's or product's input and weight
/// gradients, written so by their GEMMs ([`matmul::backward`]). `None`: not here.
pub(super) fn some_words<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    inputs: &[&Buf<D>],
    as_words: &[bool],
) -> Result<Option<crate::backend::SomeWords<Buf<D>>>, RuntimeError> {
    let OpKind::Grad { of, wrt } = kind else {
        return Ok(None);
    };
    if !matches!(**of, OpKind::MatMul | OpKind::Linear { .. }) || as_words.len() != wrt.len() {
        return Ok(None);
    }
    let Some((&g, xs)) = inputs.split_last() else {
        return Ok(None);
    };
    let wanted: Vec<bool> = (0..xs.len()).map(|i| wrt.contains(&i)).collect();
    let words = [0, 1].map(|i| wrt.iter().zip(as_words).any(|(&w, &a)| w == i && a));
    let Some(all) = matmul::backward(b, of, xs, g, &wanted, words)? else {
        return Ok(None);
    };
    let made_as_words = |d: Buf<D>| {
        let words = d.f32_lazy;
        (d, words)
    };
    Ok(picked(b, all, wrt).map(|v| v.into_iter().map(made_as_words).collect()))
}

/// The operand gradients of `kind` on the device, or `None` for the host path.
pub(super) fn backward<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
    dys: &[&Buf<D>],
) -> Result<Option<Vec<Option<Buf<D>>>>, RuntimeError> {
    if let (OpKind::Split { axis, .. }, &[x]) = (kind, xs) {
        return Ok(split_backward(b, *axis, x, dys)?.map(|d| vec![Some(d)]));
    }
    let &[g] = dys else { return Ok(None) };
    backward_of(b, kind, xs, g, &vec![true; xs.len()])
}

/// A split's gradient: its results' gradients joined (they must make `x`'s shape).
fn split_backward<D: Device>(
    b: &DeviceBackend<D>,
    axis: usize,
    x: &Buf<D>,
    dys: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    Ok(match layout::concat(b, dys, axis)? {
        Some(d) if d.shape == x.shape => Some(d),
        Some(d) => {
            b.device.release(d.mem);
            None
        }
        None => None,
    })
}

/// The gradients of `kind`'s operands for output gradient `g`; `wanted[i]` false lets a
/// lowering skip operand i's (it may then be `None`).
fn backward_of<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
    g: &Buf<D>,
    wanted: &[bool],
) -> Result<Option<Vec<Option<Buf<D>>>>, RuntimeError> {
    let all = |r: Option<Vec<Buf<D>>>| r.map(|v| v.into_iter().map(Some).collect());
    Ok(match kind {
        OpKind::MatMul | OpKind::Linear { .. } => {
            matmul::backward(b, kind, xs, g, wanted, [false; 2])?
        }
        OpKind::LayerNorm { eps, .. } | OpKind::RmsNorm { eps } => {
            all(rows::norm_backward(b, kind, *eps, xs, g)?)
        }
        OpKind::Softmax { causal } => all(rows::softmax_backward(b, *causal, xs, g)?),
        OpKind::ReduceSum | OpKind::ReduceMean => all(rows::reduce_backward(
            b,
            matches!(kind, OpKind::ReduceMean),
            xs,
            g,
        )?),
        OpKind::Attention { .. } => all(attention::backward(b, kind, xs, g)?),
        OpKind::TopKRouter {
            experts,
            k,
            routing,
            ..
        } => moe::router_backward(b, (*experts, *k, routing), xs, g, wanted)?,
        OpKind::MoeExperts { experts, form } => {
            all(moe::experts_backward(b, (*experts, *form), xs, g)?)
        }
        OpKind::Rotary { .. } => match xs {
            &[x] if g.shape == x.shape => {
                all(rotary::rotate(b, kind, g, -1.0, None)?.map(|d| vec![d]))
            }
            _ => None,
        },
        OpKind::CrossEntropy => {
            rows::cross_entropy_backward(b, xs, g)?.map(|d| vec![Some(d), None])
        }
        OpKind::Embedding => table::embedding_backward(b, xs, g)?.map(|d| vec![Some(d), None]),
        OpKind::Reshape { .. } => match xs {
            &[x] if g.len == x.len => all(copy_as(b, g, x.shape.clone())?.map(|d| vec![d])),
            _ => None,
        },
        OpKind::Expand { .. } => match xs {
            &[x] => all(layout::expand_backward(b, x, g)?.map(|d| vec![d])),
            _ => None,
        },
        OpKind::Transpose { perm } => match (xs, layout::inverse(perm)) {
            (&[x], Some(inv)) if g.shape.len() == x.shape.len() => {
                all(layout::transpose(b, g, &inv)?.map(|d| vec![d]))
            }
            _ => None,
        },
        OpKind::Concat { axis } => {
            let sizes: Vec<usize> = xs
                .iter()
                .filter_map(|x| x.shape.get(*axis).copied())
                .collect();
            if sizes.len() == xs.len() {
                all(layout::split(b, g, *axis, &sizes)?)
            } else {
                None
            }
        }
        OpKind::Slice { axis, start, .. } => match (xs, usizes(&[*start])) {
            (&[x], Some(s)) => all(layout::slice_backward(b, x, *axis, s[0], g)?.map(|d| vec![d])),
            _ => None,
        },
        _ => pointwise::backward(b, kind, xs, g)?,
    })
}

/// Attribute sizes as `usize`s (`None` if one does not fit).
fn usizes(v: &[u64]) -> Option<Vec<usize>> {
    v.iter().map(|&x| usize::try_from(x).ok()).collect()
}

/// `x`'s elements in a new buffer of `shape` (a reshape); `None` if the counts differ.
fn copy_as<D: Device>(
    b: &DeviceBackend<D>,
    x: &Buf<D>,
    shape: Vec<usize>,
) -> Result<Option<Buf<D>>, RuntimeError> {
    let mut y = b.alloc(&shape)?;
    if y.len != x.len {
        b.device.release(y.mem);
        return Ok(None);
    }
    if x.len > 0 {
        b.device.copy(&x.mem, &mut y.mem, x.len)?;
    }
    Ok(Some(y))
}

/// Rows per chunk in the first pass of a column reduction (`column_sum_chunks`,
/// `norm_param_grads`): enough chunks that the grid is busy, few enough that the second pass
/// (`column_sum` over the chunks) is short.
const COLUMN_CHUNK: usize = 64;

/// Chunks of [`COLUMN_CHUNK`] rows in `rows`.
fn column_chunks(rows: usize) -> usize {
    rows.div_ceil(COLUMN_CHUNK).max(1)
}

/// The `[chunks, cols]` partial sums `part` summed over the chunks into a new `[cols]` buffer;
/// `part` is released.
fn finish_columns<D: Device>(
    b: &DeviceBackend<D>,
    part: Buf<D>,
    chunks: usize,
    cols: usize,
) -> Result<Buf<D>, RuntimeError> {
    let mut out = b.alloc(&[cols])?;
    let block = b.device.block_size();
    // `column_sum`'s blocks take COLUMN_SUM_WIDTH (32) columns each.
    let width = (block as usize).min(32);
    let r = b.device.launch(
        "column_sum",
        cols.div_ceil(width).clamp(1, MAX_GRID) as u32,
        block,
        &mut [
            KernelArg::Out(&mut out.mem),
            KernelArg::In(&part.mem),
            size(chunks),
            size(cols),
        ],
    );
    b.device.release(part.mem);
    r.map(|()| out)
}

/// `x` (`[rows, cols]`) summed over its rows in f64: partial sums per chunk of rows, then over
/// the chunks, so that the whole grid works (one thread per column would leave it idle).
fn column_total<D: Device>(
    b: &DeviceBackend<D>,
    x: &Buf<D>,
    rows: usize,
    cols: usize,
) -> Result<Buf<D>, RuntimeError> {
    let chunks = column_chunks(rows);
    let mut part = b.alloc(&[chunks, cols])?;
    let block = b.device.block_size();
    // Made as words (or back from the stash), x's words are its values.
    let (kernel, src) = match x.exact_bf16() {
        Some(w) => ("column_sum_chunks_bf16x", w),
        None => ("column_sum_chunks", &x.mem),
    };
    b.device.launch(
        kernel,
        pointwise_grid(block, chunks * cols),
        block,
        &mut [
            KernelArg::Out(&mut part.mem),
            KernelArg::In(src),
            size(rows),
            size(cols),
            size(COLUMN_CHUNK),
        ],
    )?;
    finish_columns(b, part, chunks, cols)
}

/// The most blocks a launch asks for: grid-stride loops cover the rest.
const MAX_GRID: usize = 1 << 16;

/// `kernel` over `n` elements, a thread each (grid-strided), at the device's block size.
fn launch_pointwise<D: Device>(
    b: &DeviceBackend<D>,
    kernel: &'static str,
    n: usize,
    args: &mut [KernelArg<'_, D::Mem>],
) -> Result<(), RuntimeError> {
    let block = b.device.block_size();
    b.device
        .launch(kernel, pointwise_grid(block, n), block, args)
}

/// Blocks for a pointwise kernel over `n` elements.
fn pointwise_grid(block: u32, n: usize) -> u32 {
    n.div_ceil(block as usize).clamp(1, MAX_GRID) as u32
}

/// Blocks for a grid-stride kernel that keeps `ILP` loads in flight per thread
/// (`common.cuh`) over `n` elements.
pub(super) fn stream_grid(block: u32, n: usize) -> u32 {
    n.div_ceil(block as usize * kernels::device::ILP)
        .clamp(1, MAX_GRID) as u32
}

/// Blocks for a row kernel over `rows` rows (one block per row, grid-stride beyond).
pub(super) fn row_grid(rows: usize) -> u32 {
    rows.clamp(1, MAX_GRID) as u32
}

/// A size as the kernels' `long long` argument (buffer lengths fit the address space).
fn size<'a, M>(n: usize) -> KernelArg<'a, M> {
    KernelArg::I64(i64::try_from(n).unwrap_or(i64::MAX))
}
