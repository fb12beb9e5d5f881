//! Unary functions and broadcasting binary arithmetic (`pointwise.cu`).

use ir::OpKind;
use kernels::device::{Broadcast, binary_code, broadcast_shape, unary_code};

use super::{Buf, pointwise_grid, size, stream_grid};
use crate::RuntimeError;
use crate::backend::device::{Device, DeviceBackend, GemmPrecision, KernelArg};

pub(super) fn forward<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    inputs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let block = b.device.block_size();
    if let (Some((op, p)), &[x]) = (unary_code(kind), inputs) {
        let mut y = b.alloc(&x.shape)?;
        // Made as words (or back from the stash), x's words are its values.
        let (kernel, xm, work) = match x.exact_bf16() {
            Some(w) => ("unary_forward_bf16x", w, x.len.div_ceil(2)),
            None => ("unary_forward", &x.mem, x.len),
        };
        b.device.launch(
            kernel,
            stream_grid(block, work),
            block,
            &mut [
                KernelArg::Out(&mut y.mem),
                KernelArg::In(xm),
                size(x.len),
                KernelArg::I32(op),
                KernelArg::F64(p),
            ],
        )?;
        return Ok(Some(y));
    }
    let (Some(op), &[x, z]) = (binary_code(kind), inputs) else {
        return Ok(None);
    };
    let Some((shape, bc)) = broadcast(&x.shape, &z.shape) else {
        return Ok(None);
    };
    let mut y = b.alloc(&shape)?;
    b.device.launch(
        "binary_forward",
        binary_grid(block, [x.len, z.len], y.len),
        block,
        &mut [
            KernelArg::Out(&mut y.mem),
            KernelArg::In(&x.mem),
            KernelArg::In(&z.mem),
            KernelArg::Broadcast(bc),
            size(y.len),
            KernelArg::I32(op),
        ],
    )?;
    Ok(Some(y))
}

/// A binary op on operands laid out as its output, with the result's bf16 twin written by the
/// same launch (`binary_forward_twin`): the words a stash right after it keeps, or a bf16 GEMM
/// that reads it takes, without a pass of `to_bf16` over it. The twin is the result rounded
/// (not exact: its f32 values stay the ones every other reader reads). `None` for another op,
/// broadcast operands, or f32 GEMMs (no twins).
pub(in crate::backend::device) fn forward_twin<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    inputs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let (Some(op), &[x, z]) = (binary_code(kind), inputs) else {
        return Ok(None);
    };
    if x.shape != z.shape || x.len == 0 || b.gemm_precision != GemmPrecision::Bf16 {
        return Ok(None);
    }
    let mut y = b.alloc(&x.shape)?;
    let mut twin = b.device.alloc(x.len.div_ceil(2))?;
    let block = b.device.block_size();
    let launched = b.device.launch(
        "binary_forward_twin",
        stream_grid(block, x.len.div_ceil(2)),
        block,
        &mut [
            KernelArg::Out(&mut y.mem),
            KernelArg::Out(&mut twin),
            KernelArg::In(&x.mem),
            KernelArg::In(&z.mem),
            size(x.len),
            KernelArg::I32(op),
        ],
    );
    if let Err(e) = launched {
        b.device.release(twin);
        b.device.release(y.mem);
        return Err(e);
    }
    if let Err(t) = y.bf16.set(twin) {
        b.device.release(t);
    }
    Ok(Some(y))
}

/// `inputs[0] op inputs[1]` where operand `side` is a biased linear's product still without its
/// `bias` (`binary_forward_biased`: the bias added in the same pass), with the result's bf16
/// twin where `twin`. `None` where the operands are not laid out as the output, f32 and dense,
/// or the bias is not one value per column of an even width.
pub(in crate::backend::device) fn forward_biased<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    inputs: &[&Buf<D>],
    (side, bias): (usize, &Buf<D>),
    twin: bool,
) -> Result<Option<Buf<D>>, RuntimeError> {
    let (Some(op), &[x, z]) = (binary_code(kind), inputs) else {
        return Ok(None);
    };
    let dense = |t: &Buf<D>| !t.f32_lazy && t.pitch.is_none();
    let Some(&cols) = x.shape.last() else {
        return Ok(None);
    };
    let fits = x.shape == z.shape
        && x.len > 0
        && bias.shape == [cols]
        && cols.is_multiple_of(2)
        && side < 2
        && [x, z, bias].into_iter().all(dense);
    if !fits {
        return Ok(None);
    }
    let mut y = b.alloc(&x.shape)?;
    let mut words = if twin {
        Some(b.device.alloc(x.len.div_ceil(2))?)
    } else {
        None
    };
    let rows = x.len / cols;
    let block = b.device.block_size();
    let launched = b.device.launch(
        "binary_forward_biased",
        super::row_grid(rows),
        block,
        &mut [
            KernelArg::Out(&mut y.mem),
            words.as_mut().map_or(KernelArg::Null, KernelArg::Out),
            KernelArg::In(&x.mem),
            KernelArg::In(&z.mem),
            KernelArg::In(&bias.mem),
            size(rows),
            size(cols),
            KernelArg::I32(op),
            KernelArg::I32(side as i32),
        ],
    );
    if let Err(e) = launched {
        words.into_iter().for_each(|w| b.device.release(w));
        b.device.release(y.mem);
        return Err(e);
    }
    if let Some(w) = words
        && let Err(w) = y.bf16.set(w)
    {
        b.device.release(w);
    }
    Ok(Some(y))
}

/// Whether a unary function reads its input only as words where it has them ([`forward`]:
/// `unary_forward_bf16x`, or made as words: `unary_forward_words_bf16x`).
pub(super) fn reads_words(kind: &OpKind, shapes: &[&[usize]], operand: usize) -> bool {
    unary_code(kind).is_some() && operand == 0 && shapes.len() == 1
}

/// Whether the gradient of `of` (with respect to `wrt`, from inputs of `shapes`: `x` then the
/// output gradient) reads `operand` only as the bf16 words a stash holds: a unary function's
/// `x` (`unary_backward_bf16x`) and its output gradient (made as words, `unary_backward_words_
/// bf16g`; [`backward`] expands it into a temporary where its result is wanted in f32).
pub(super) fn grad_reads_words(
    of: &OpKind,
    wrt: &[usize],
    shapes: &[&[usize]],
    operand: usize,
) -> bool {
    unary_code(of).is_some() && operand < 2 && wrt == [0] && matches!(shapes, [x, g] if x == g)
}

pub(super) fn backward<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
    g: &Buf<D>,
) -> Result<Option<Vec<Option<Buf<D>>>>, RuntimeError> {
    let block = b.device.block_size();
    if let (Some(_), &[x], true) = (unary_code(kind), xs, g.f32_lazy) {
        // The output gradient held as words alone: its values expanded for the f32 kernels.
        if g.shape != x.shape {
            return Ok(None);
        }
        let g = super::expanded_copy(b, g)?;
        let dx = backward(b, kind, xs, &g);
        crate::Backend::free(b, g);
        return dx;
    }
    if let (Some((op, p)), &[x]) = (unary_code(kind), xs) {
        if g.shape != x.shape {
            return Ok(None);
        }
        let mut dx = b.alloc(&x.shape)?;
        // Back from the stash, x's words are its values: read them, not the f32 expansion.
        let (kernel, xm, work) = match x.exact_bf16() {
            Some(words) => ("unary_backward_bf16x", words, x.len.div_ceil(2)),
            None => ("unary_backward", &x.mem, x.len),
        };
        b.device.launch(
            kernel,
            stream_grid(block, work),
            block,
            &mut [
                KernelArg::Out(&mut dx.mem),
                KernelArg::In(xm),
                KernelArg::In(&g.mem),
                size(x.len),
                KernelArg::I32(op),
                KernelArg::F64(p),
            ],
        )?;
        return Ok(Some(vec![Some(dx)]));
    }
    let (Some(op), &[x, z]) = (binary_code(kind), xs) else {
        return Ok(None);
    };
    let Some((shape, bc)) = broadcast(&x.shape, &z.shape) else {
        return Ok(None);
    };
    if g.shape != shape {
        return Ok(None);
    }
    let (mut gx, mut gz) = (b.alloc(&shape)?, b.alloc(&shape)?);
    b.device.launch(
        "binary_backward",
        binary_grid(block, [x.len, z.len], g.len),
        block,
        &mut [
            KernelArg::Out(&mut gx.mem),
            KernelArg::Out(&mut gz.mem),
            KernelArg::In(&x.mem),
            KernelArg::In(&z.mem),
            KernelArg::In(&g.mem),
            KernelArg::Broadcast(bc),
            size(g.len),
            KernelArg::I32(op),
        ],
    )?;
    let dx = sum_to(b, gx, &x.shape)?;
    let dz = sum_to(b, gz, &z.shape)?;
    Ok(Some(vec![Some(dx), Some(dz)]))
}

/// The output shape of a broadcast and its strides; `None` when the shapes do not broadcast
/// or the rank is past the kernels' limit.
fn broadcast(a: &[usize], b: &[usize]) -> Option<(Vec<usize>, Broadcast)> {
    let shape = broadcast_shape(a, b)?;
    let bc = Broadcast::new(&shape, a, b)?;
    Some((shape, bc))
}

/// `full` (an output-shaped gradient) summed over the axes `operand` was broadcast along.
pub(super) fn sum_to<D: Device>(
    b: &DeviceBackend<D>,
    full: Buf<D>,
    operand: &[usize],
) -> Result<Buf<D>, RuntimeError> {
    if full.shape == operand {
        return Ok(full);
    }
    // Broadcast along leading axes only (a bias, a position table): a column reduction over
    // the rows, chunked so that the whole grid works.
    let kept: Vec<usize> = operand.iter().copied().skip_while(|&d| d == 1).collect();
    let cols: usize = kept.iter().product();
    if cols > 0 && full.shape.ends_with(&kept) {
        let mut out = super::column_total(b, &full, full.len / cols, cols)?;
        out.shape = operand.to_vec();
        b.device.release(full.mem);
        return Ok(out);
    }
    let bc = Broadcast::new(&full.shape, operand, operand).ok_or_else(|| {
        RuntimeError::DeviceLaunch {
            kernel: "sum_to_operand",
            message: format!("{operand:?} does not broadcast to {:?}", full.shape),
        }
    })?;
    let mut out = b.alloc(operand)?;
    let block = b.device.block_size();
    b.device.launch(
        "sum_to_operand",
        pointwise_grid(block, out.len),
        block,
        &mut [
            KernelArg::Out(&mut out.mem),
            KernelArg::In(&full.mem),
            KernelArg::Broadcast(bc),
            size(out.len),
        ],
    )?;
    b.device.release(full.mem);
    Ok(out)
}

/// Blocks of `binary_forward`/`binary_backward` over `n` outputs: streaming (`ILP` elements a
/// thread) where both operands (of `lens` elements) have the output's size, the kernels'
/// dense path; one element a thread where one is broadcast.
fn binary_grid(block: u32, lens: [usize; 2], n: usize) -> u32 {
    if lens.iter().all(|&len| len == n) {
        stream_grid(block, n)
    } else {
        pointwise_grid(block, n)
    }
}
