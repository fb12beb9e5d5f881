//! Embedding lookup and its scatter-add gradient (`embedding.cu`).

use super::{Buf, pointwise_grid, size};
use crate::RuntimeError;
use crate::backend::device::{Device, DeviceBackend, KernelArg};

/// `(vocab, h)` of a `[V, H]` table.
fn table_dims<D: Device>(table: &Buf<D>) -> Option<(usize, usize)> {
    match table.shape.as_slice() {
        &[v, h] if v > 0 => Some((v, h)),
        _ => None,
    }
}

pub(super) fn embedding_forward<D: Device>(
    b: &DeviceBackend<D>,
    xs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let &[table, ids] = xs else { return Ok(None) };
    let Some((vocab, h)) = table_dims::<D>(table) else {
        return Ok(None);
    };
    let mut shape = ids.shape.clone();
    shape.push(h);
    let mut y = b.alloc(&shape)?;
    let block = b.device.block_size();
    b.device.launch(
        "embedding_forward",
        pointwise_grid(block, y.len),
        block,
        &mut [
            KernelArg::Out(&mut y.mem),
            KernelArg::In(&table.mem),
            KernelArg::In(&ids.mem),
            size(ids.len),
            size(h),
            size(vocab),
        ],
    )?;
    Ok(Some(y))
}

/// Whether the table's gradient, from inputs of `shapes` (table, ids, output gradient), runs on
/// the device ([`embedding_backward`]), which reads only the table's shape: a stashed table
/// (a tied embedding's weight) need not be expanded for it.
pub(super) fn grad_reads_no_table(shapes: &[&[usize]]) -> bool {
    match shapes {
        &[&[v, h], ids, g] if v > 0 => {
            let n = |s: &[usize]| s.iter().product::<usize>();
            n(g) == n(ids) * h && g.last() == Some(&h)
        }
        _ => false,
    }
}

pub(super) fn embedding_backward<D: Device>(
    b: &DeviceBackend<D>,
    xs: &[&Buf<D>],
    g: &Buf<D>,
) -> Result<Option<Buf<D>>, RuntimeError> {
    let &[table, ids] = xs else { return Ok(None) };
    let Some((vocab, h)) = table_dims::<D>(table) else {
        return Ok(None);
    };
    if g.len != ids.len * h || g.shape.last() != Some(&h) {
        return Ok(None);
    }
    let mut dtable = b.alloc_zeroed(&table.shape)?;
    let block = b.device.block_size();
    b.device.launch(
        "embedding_backward",
        pointwise_grid(block, g.len),
        block,
        &mut [
            KernelArg::Out(&mut dtable.mem),
            KernelArg::In(&ids.mem),
            KernelArg::In(&g.mem),
            size(ids.len),
            size(h),
            size(vocab),
        ],
    )?;
    Ok(Some(dtable))
}
