//! `Embedding`: row lookup; its adjoint scatter-adds output gradients into the table rows.

use crate::shape::index_value;
use crate::tensor::numel;
use crate::{KernelError, Tensor32};

const OP: &str = "embedding";

fn table_dims(table: &Tensor32) -> Result<(usize, usize), KernelError> {
    match table.shape.as_slice() {
        &[v, h] => Ok((v, h)),
        s => Err(KernelError::Shape {
            op: OP,
            what: "table",
            got: s.to_vec(),
            want: "[V, H]".into(),
        }),
    }
}

pub(crate) fn embedding(table: &Tensor32, ids: &Tensor32) -> Result<Tensor32, KernelError> {
    let (v, h) = table_dims(table)?;
    let mut shape = ids.shape.clone();
    shape.push(h);
    let mut data = Vec::with_capacity(numel(&shape)?);
    for &id in &ids.data {
        let r = index_value(OP, "token id", id, v)?;
        data.extend_from_slice(&table.data[r * h..(r + 1) * h]);
    }
    Ok(Tensor32 { shape, data })
}

pub(crate) fn embedding_vjp(
    table: &Tensor32,
    ids: &Tensor32,
    g: &Tensor32,
) -> Result<Tensor32, KernelError> {
    let (v, h) = table_dims(table)?;
    if g.data.len() != ids.data.len() * h || g.shape.last() != Some(&h) {
        return Err(KernelError::Shape {
            op: OP,
            what: "output gradient",
            got: g.shape.clone(),
            want: format!("{:?} + [{h}]", ids.shape),
        });
    }
    // Accumulate in f64: a frequent token's row sums many contributions.
    let mut acc = vec![0f64; numel(&table.shape)?];
    for (&id, gr) in ids.data.iter().zip(g.data.chunks_exact(h.max(1))) {
        let r = index_value(OP, "token id", id, v)?;
        for (d, &gv) in acc[r * h..(r + 1) * h].iter_mut().zip(gr) {
            *d += f64::from(gv);
        }
    }
    Ok(Tensor32 {
        shape: table.shape.clone(),
        data: acc.into_iter().map(|x| x as f32).collect(),
    })
}
