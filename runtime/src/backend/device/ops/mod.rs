//! plait's ops as device launches: which kernel, on what grid, with which operands. Every
//! lowering checks its operands' shapes first and returns `None` for anything it does not
//! handle exactly, so the host path (which also reports malformed operands) takes it: a kernel
//! is never launched on shapes it could read past.

mod matmul;
mod optim;
mod pointwise;
mod rows;
mod table;

use ir::{Binding, OpKind};

use super::{Device, DeviceBackend, DeviceBuffer, KernelArg};
use crate::RuntimeError;

pub(super) use optim::adamw;

type Buf<D> = DeviceBuffer<<D as Device>::Mem>;

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
        OpKind::LayerNorm { eps } | OpKind::RmsNorm { eps } => {
            one(rows::norm_forward(b, kind, *eps, inputs)?)
        }
        OpKind::Softmax { causal } => one(rows::softmax_forward(b, *causal, inputs)?),
        OpKind::CrossEntropy => one(rows::cross_entropy_forward(b, inputs)?),
        OpKind::Embedding => one(table::embedding_forward(b, inputs)?),
        OpKind::Reshape { .. } => match (kernels::device::reshape_shape(kind, binding), inputs) {
            (Some(shape), &[x]) => one(copy_as(b, x, shape)?),
            _ => None,
        },
        _ => one(pointwise::forward(b, kind, inputs)?),
    })
}

/// The operand gradients of `kind` on the device, or `None` for the host path.
pub(super) fn backward<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
    dys: &[&Buf<D>],
) -> Result<Option<Vec<Option<Buf<D>>>>, RuntimeError> {
    let &[g] = dys else { return Ok(None) };
    let all = |r: Option<Vec<Buf<D>>>| r.map(|v| v.into_iter().map(Some).collect());
    Ok(match kind {
        OpKind::MatMul | OpKind::Linear { .. } => all(matmul::backward(b, kind, xs, g)?),
        OpKind::LayerNorm { eps } | OpKind::RmsNorm { eps } => {
            all(rows::norm_backward(b, kind, *eps, xs, g)?)
        }
        OpKind::Softmax { causal } => all(rows::softmax_backward(b, *causal, xs, g)?),
        OpKind::CrossEntropy => {
            rows::cross_entropy_backward(b, xs, g)?.map(|d| vec![Some(d), None])
        }
        OpKind::Embedding => table::embedding_backward(b, xs, g)?.map(|d| vec![Some(d), None]),
        OpKind::Reshape { .. } => match xs {
            &[x] if g.len == x.len => all(copy_as(b, g, x.shape.clone())?.map(|d| vec![d])),
            _ => None,
        },
        _ => pointwise::backward(b, kind, xs, g)?,
    })
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

/// The most blocks a launch asks for: grid-stride loops cover the rest.
const MAX_GRID: usize = 1 << 16;

/// Blocks for a pointwise kernel over `n` elements.
fn pointwise_grid(block: u32, n: usize) -> u32 {
    n.div_ceil(block as usize).clamp(1, MAX_GRID) as u32
}

/// Blocks for a row kernel over `rows` rows (one block per row, grid-stride beyond).
fn row_grid(rows: usize) -> u32 {
    rows.clamp(1, MAX_GRID) as u32
}

/// A size as the kernels' `long long` argument (buffer lengths fit the address space).
fn size<'a, M>(n: usize) -> KernelArg<'a, M> {
    KernelArg::I64(i64::try_from(n).unwrap_or(i64::MAX))
}
