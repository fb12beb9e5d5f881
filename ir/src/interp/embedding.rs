//! `Embedding`: row lookup, whose adjoint scatter-adds output gradients into the table rows.

use super::KernelError;
use super::index::{check_numel, zeros};
use crate::tensor::Tensor;

/// An integer index stored as f64, checked to be a whole number in `0..bound`.
pub(crate) fn index_value(v: f64, bound: usize, what: &str) -> Result<usize, KernelError> {
    if v.fract() == 0.0 && v >= 0.0 && v < bound as f64 {
        Ok(v as usize)
    } else {
        Err(KernelError::new(format!(
            "{what} {v} is not an index in 0..{bound}"
        )))
    }
}

fn table_dims(table: &Tensor) -> Result<(usize, usize), KernelError> {
    match table.shape.as_slice() {
        &[v, h] => Ok((v, h)),
        s => Err(KernelError::new(format!(
            "embedding table {s:?} must be [V, H]"
        ))),
    }
}

pub(crate) fn embedding(table: &Tensor, ids: &Tensor) -> Result<Tensor, KernelError> {
    let (v, h) = table_dims(table)?;
    let mut shape = ids.shape.clone();
    shape.push(h);
    let mut data = Vec::with_capacity(check_numel(&shape)?);
    for &id in &ids.data {
        let r = index_value(id, v, "token id")?;
        data.extend_from_slice(&table.data[r * h..(r + 1) * h]);
    }
    Ok(Tensor { shape, data })
}

pub(crate) fn embedding_vjp(
    table: &Tensor,
    ids: &Tensor,
    g: &Tensor,
) -> Result<Tensor, KernelError> {
    let (v, h) = table_dims(table)?;
    if g.data.len() != ids.data.len() * h || g.shape.last() != Some(&h) {
        return Err(KernelError::new(format!(
            "output gradient {:?} does not match ids {:?} and width {h}",
            g.shape, ids.shape
        )));
    }
    let mut dt = zeros(&table.shape)?;
    for (&id, gr) in ids.data.iter().zip(g.data.chunks_exact(h.max(1))) {
        let r = index_value(id, v, "token id")?;
        for (d, &gv) in dt.data[r * h..(r + 1) * h].iter_mut().zip(gr) {
            *d += gv;
        }
    }
    Ok(dt)
}
