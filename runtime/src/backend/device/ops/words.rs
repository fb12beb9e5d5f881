//! Results made as bf16 words only ([`crate::Backend::forward_words`]): where every reader of
//! a result reads it only as words (a linear's input, attention's q, k and v on the tensor
//! cores), the kernel that makes it writes its bf16 words and no f32 values, which are
//! expanded later only if something reads them (`exec/words_only.rs`). A bf16 plan stores the
//! result so. Where the readers are GEMMs or the attention packs, the words are what they would
//! have rounded it to; a GELU on a linear's output and a bias's column sums over an output
//! gradient now read bf16-rounded values where they read f32 before, as engines that store
//! activations in bf16 do. Made so: a biased linear's output (its GEMM adding onto
//! the bias's words, `bias_rows_words`; `add_bias_to_words` after an f32 product where cuBLAS
//! cannot write its rows as words), a
//! norm's output (`*_norm_forward*_words`), a unary
//! function's (`unary_forward_words`) and its input gradient (`unary_backward_words*`), a
//! last-axis split's parts (`split_cols_words`) and their gradient (`place_cols_words`).

use ir::OpKind;
use kernels::device::unary_code;

use super::{Buf, matmul, row_grid, rows, size, stream_grid};
use crate::RuntimeError;
use crate::backend::device::{Device, DeviceBackend, KernelArg};

/// The results of `kind` on `inputs` as words only, or `None` where it is not made so here.
pub(in crate::backend::device) fn forward<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    inputs: &[&Buf<D>],
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    Ok(match (kind, inputs) {
        (OpKind::LayerNorm { eps, .. } | OpKind::RmsNorm { eps }, _) => {
            rows::norm_forward_words(b, kind, *eps, inputs)?.map(|y| vec![y])
        }
        (OpKind::Linear { bias: true }, _) => {
            matmul::forward_words(b, kind, inputs)?.map(|y| vec![y])
        }
        (OpKind::Split { axis, sizes }, &[x]) => split(b, x, *axis, sizes)?,
        (_, &[x]) if unary_code(kind).is_some() => Some(vec![unary(b, kind, x, None)?]),
        (OpKind::Grad { of, wrt }, _) if wrt.as_slice() == [0] => match (&**of, inputs) {
            (_, &[x, g]) if unary_code(of).is_some() && x.shape == g.shape => {
                Some(vec![unary(b, of, x, Some(g))?])
            }
            (OpKind::Split { axis, .. }, [x, parts @ ..]) => concat(b, *axis, parts)?
                .filter(|y| y.shape == x.shape)
                .map(|y| vec![y]),
            _ => None,
        },
        (OpKind::Concat { axis }, parts) => concat(b, *axis, parts)?.map(|y| vec![y]),
        _ => None,
    })
}

/// A buffer of `shape` whose exact bf16 words `fill` writes (two to a word, in order), with no
/// f32 memory until its values are expanded (`DeviceBuffer::f32_lazy`).
pub(super) fn words_only<D: Device>(
    b: &DeviceBackend<D>,
    shape: &[usize],
    fill: impl FnOnce(&mut D::Mem) -> Result<(), RuntimeError>,
) -> Result<Buf<D>, RuntimeError> {
    let len: usize = shape.iter().product();
    let mut words = b.device.alloc(len.div_ceil(2).max(1))?;
    if let Err(e) = fill(&mut words) {
        b.device.release(words);
        return Err(e);
    }
    b.words_only(shape, words)
}

/// A unary function of `x` (f32, or its words where it has only those), or with the output
/// gradient `g` (f32, or its words likewise) its input gradient (`unary_forward_words*`,
/// `unary_backward_words*`).
fn unary<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    x: &Buf<D>,
    g: Option<&Buf<D>>,
) -> Result<Buf<D>, RuntimeError> {
    let (op, p) = unary_code(kind).unwrap_or_default();
    // The output gradient's words where it has them exactly (the linear after wrote them).
    let g_words = g.and_then(|g| g.exact_bf16());
    let kernel = match (g.is_some(), x.exact_bf16().is_some(), g_words.is_some()) {
        (false, false, _) => "unary_forward_words",
        (false, true, _) => "unary_forward_words_bf16x",
        (true, false, false) => "unary_backward_words",
        (true, true, false) => "unary_backward_words_bf16x",
        (true, false, true) => "unary_backward_words_bf16g",
        (true, true, true) => "unary_backward_words_bf16xg",
    };
    let xm = x.exact_bf16().unwrap_or(&x.mem);
    let block = b.device.block_size();
    words_only(b, &x.shape, |w| {
        let mut args = vec![KernelArg::Out(w), KernelArg::In(xm)];
        args.extend(g.map(|g| KernelArg::In(g_words.unwrap_or(&g.mem))));
        args.extend([size(x.len), KernelArg::I32(op), KernelArg::F64(p)]);
        b.device.launch(
            kernel,
            stream_grid(block, x.len.div_ceil(2)),
            block,
            &mut args,
        )
    })
}

/// Rows, columns and the part widths of a buffer of `shape` cut along its last axis (`axis`)
/// into parts of `sizes`, where each is even (its words are whole words of each row).
fn last_axis_parts(
    shape: &[usize],
    axis: usize,
    sizes: Vec<usize>,
) -> Option<(usize, usize, Vec<usize>)> {
    let (&cols, outer) = shape.split_last()?;
    let fits = axis + 1 == shape.len()
        && sizes.iter().sum::<usize>() == cols
        && sizes.iter().all(|s| s.is_multiple_of(2));
    fits.then(|| (outer.iter().product(), cols, sizes))
}

/// Whether a concatenation (`kind`, of parts of `shapes`) reads its parts only as words where
/// they have them: along their last axis, each of an even width (`place_cols_words_bf16x`;
/// [`concat_expanded`] where the result is wanted in f32).
pub(super) fn concat_reads_words(kind: &OpKind, shapes: &[&[usize]]) -> bool {
    let (OpKind::Concat { axis }, Some(first)) = (kind, shapes.first()) else {
        return false;
    };
    let same_rows = |p: &&[usize]| {
        p.len() == first.len() && axis + 1 == p.len() && p[..*axis] == first[..*axis]
    };
    if !shapes.iter().all(same_rows) {
        return false;
    }
    let sizes: Vec<usize> = shapes.iter().map(|p| p[*axis]).collect();
    let mut shape = first.to_vec();
    shape[*axis] = sizes.iter().sum();
    last_axis_parts(&shape, *axis, sizes).is_some()
}

/// A concatenation of parts some of which are held as words only ([`concat_reads_words`])
/// into a result with its f32 values: those parts' values expanded into temporaries, then
/// joined with the others as they are (an f32 part keeps its f32 values).
pub(super) fn concat_expanded<D: Device>(
    b: &DeviceBackend<D>,
    axis: usize,
    parts: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let mut temps = Vec::with_capacity(parts.len());
    for p in parts {
        match p.f32_lazy.then(|| super::expanded_copy(b, p)).transpose() {
            Ok(t) => temps.push(t),
            Err(e) => {
                temps
                    .into_iter()
                    .flatten()
                    .for_each(|t| crate::Backend::free(b, t));
                return Err(e);
            }
        }
    }
    let whole: Vec<&Buf<D>> = parts
        .iter()
        .zip(&temps)
        .map(|(&p, t)| t.as_ref().unwrap_or(p))
        .collect();
    let joined = super::layout::concat(b, &whole, axis);
    temps
        .into_iter()
        .flatten()
        .for_each(|t| crate::Backend::free(b, t));
    joined
}

/// The parts (f32, or their exact words where they have them) joined along their last axis
/// (`axis`) into a buffer made as words only: a concatenation, or the gradient of a last-axis
/// split.
fn concat<D: Device>(
    b: &DeviceBackend<D>,
    axis: usize,
    parts: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let Some(first) = parts.first() else {
        return Ok(None);
    };
    let same_rows = |p: &&Buf<D>| {
        p.shape.len() == first.shape.len()
            && axis + 1 == p.shape.len()
            && p.shape[..axis] == first.shape[..axis]
    };
    if !parts.iter().all(same_rows) {
        return Ok(None);
    }
    let sizes: Vec<usize> = parts.iter().map(|p| p.shape[axis]).collect();
    let mut shape = first.shape.clone();
    shape[axis] = sizes.iter().sum();
    let Some((rows, cols, sizes)) = last_axis_parts(&shape, axis, sizes) else {
        return Ok(None);
    };
    let block = b.device.block_size();
    words_only(b, &shape, |w| {
        let mut start = 0;
        for (part, &len) in parts.iter().zip(&sizes) {
            // A part's exact words where it has them (then its f32 values need not exist).
            let (kernel, src) = match part.exact_bf16() {
                Some(words) => ("place_cols_words_bf16x", words),
                None => ("place_cols_words", &part.mem),
            };
            b.device.launch(
                kernel,
                row_grid(rows),
                block,
                &mut [
                    KernelArg::Out(&mut *w),
                    KernelArg::In(src),
                    size(rows),
                    size(cols),
                    size(start),
                    size(len),
                ],
            )?;
            start += len;
        }
        Ok(())
    })
    .map(Some)
}

/// Whether a split (`kind`, of one input of `shapes`) reads `operand` only as words where it
/// has them: along its last axis into even parts, whose words are whole words of each row
/// (`split_cols_words_bf16x`; [`split_expanded`] where its parts are wanted in f32).
pub(super) fn split_reads_words(kind: &OpKind, shapes: &[&[usize]], operand: usize) -> bool {
    let (OpKind::Split { axis, sizes }, &[x], 0) = (kind, shapes, operand) else {
        return false;
    };
    let sizes: Option<Vec<usize>> = sizes.iter().map(|&s| usize::try_from(s).ok()).collect();
    sizes.is_some_and(|s| last_axis_parts(x, *axis, s).is_some())
}

/// A split of `x` held as words only ([`split_reads_words`]) into parts with their f32 values:
/// the parts' words, each expanded. `None` where the split is not one of those.
pub(super) fn split_expanded<D: Device>(
    b: &DeviceBackend<D>,
    x: &Buf<D>,
    axis: usize,
    sizes: &[u64],
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    let Some(mut parts) = split(b, x, axis, sizes)? else {
        return Ok(None);
    };
    if let Err(e) = parts.iter_mut().try_for_each(|p| super::expand_twin(b, p)) {
        parts.into_iter().for_each(|p| crate::Backend::free(b, p));
        return Err(e);
    }
    Ok(Some(parts))
}

/// `x`'s parts of `sizes` along its last axis (each even), as words only: from its words
/// where it has them exactly (then its f32 values need not exist), else from its f32 values.
fn split<D: Device>(
    b: &DeviceBackend<D>,
    x: &Buf<D>,
    axis: usize,
    sizes: &[u64],
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    let sizes: Option<Vec<usize>> = sizes.iter().map(|&s| usize::try_from(s).ok()).collect();
    let Some((rows, cols, sizes)) = sizes.and_then(|s| last_axis_parts(&x.shape, axis, s)) else {
        return Ok(None);
    };
    let (kernel, xm) = match x.exact_bf16() {
        Some(words) => ("split_cols_words_bf16x", words),
        None => ("split_cols_words", &x.mem),
    };
    let block = b.device.block_size();
    let mut parts = Vec::with_capacity(sizes.len());
    let mut start = 0;
    for len in sizes {
        let mut shape = x.shape.clone();
        shape[axis] = len;
        parts.push(words_only(b, &shape, |w| {
            b.device.launch(
                kernel,
                row_grid(rows),
                block,
                &mut [
                    KernelArg::Out(w),
                    KernelArg::In(xm),
                    size(rows),
                    size(cols),
                    size(start),
                    size(len),
                ],
            )
        })?);
        start += len;
    }
    Ok(Some(parts))
}
