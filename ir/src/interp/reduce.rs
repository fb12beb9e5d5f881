//! `ReduceSum` and `ReduceMean` over the last axis, which is kept with size 1.

use super::KernelError;
use super::index::rows;
use crate::tensor::Tensor;

/// Sums (or averages, when `mean`) each last-axis row.
pub(crate) fn reduce(x: &Tensor, mean: bool) -> Result<Tensor, KernelError> {
    let (_, n) = rows(x, "reduced operand")?;
    let div = if mean { n as f64 } else { 1.0 };
    let mut shape = x.shape.clone();
    if let Some(last) = shape.last_mut() {
        *last = 1;
    }
    Ok(Tensor {
        shape,
        data: x
            .data
            .chunks_exact(n)
            .map(|row| row.iter().sum::<f64>() / div)
            .collect(),
    })
}

/// Every element of a row receives the row's output gradient (divided by n for the mean).
pub(crate) fn reduce_vjp(x: &Tensor, g: &Tensor, mean: bool) -> Result<Tensor, KernelError> {
    let (r, n) = rows(x, "reduced operand")?;
    if g.data.len() != r {
        return Err(KernelError::new(format!(
            "output gradient {:?} does not match the reduction of {:?}",
            g.shape, x.shape
        )));
    }
    let div = if mean { n as f64 } else { 1.0 };
    Ok(Tensor {
        shape: x.shape.clone(),
        data: g
            .data
            .iter()
            .flat_map(|&gi| std::iter::repeat_n(gi / div, n))
            .collect(),
    })
}
